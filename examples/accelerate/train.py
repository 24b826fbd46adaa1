"""A small Hugging Face Accelerate job, as its documentation writes one: ``accelerate launch`` on
the CPU with 2 processes, ``save_state`` every few steps into ``step_N`` folders, and on resume
``load_state`` of the newest one and ``skip_first_batches`` to the position in the epoch. It knows
nothing of ckpt-chaos.

    accelerate launch --cpu --num_processes 2 examples/accelerate/train.py --ckpt-dir /tmp/ckpt --steps 12
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = re.compile(r"^step_(\d+)$")


def dataset(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    y = x @ torch.randn(16, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def newest(ckpt_dir: Path) -> tuple[Path, int] | None:
    found = [(int(m.group(1)), p) for p in ckpt_dir.glob("step_*") if (m := NAME.match(p.name)) and p.is_dir()]
    if not found:
        return None
    step, path = max(found)
    return path, step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--batch", type=int, default=8, help="per process")
    args = p.parse_args()

    accelerator = Accelerator(cpu=True)
    set_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    loader = DataLoader(dataset(args.samples, 0), batch_size=args.batch, shuffle=True)
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)

    step, epoch, skip = 0, 0, 0
    found = newest(args.ckpt_dir)
    if found is not None:
        path, step = found
        accelerator.load_state(str(path))
        epoch, skip = divmod(step, len(loader))
        accelerator.print(f"resumed from {path.name} at step {step}")

    while step < args.steps:
        batches = accelerator.skip_first_batches(loader, skip) if skip else loader
        skip = 0
        for x, y in batches:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            accelerator.backward(loss)
            opt.step()
            sched.step()
            step += 1
            if step % args.save_every == 0 or step == args.steps:
                accelerator.save_state(str(args.ckpt_dir / f"step_{step}"))
            if step >= args.steps:
                break
        epoch += 1
    accelerator.wait_for_everyone()
    accelerator.print(f"done at step {step}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
