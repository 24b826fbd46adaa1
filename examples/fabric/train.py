"""A small DDP job under Lightning Fabric, saved its documented way: ``Fabric(accelerator="cpu",
strategy="ddp", devices=2)`` started by torchrun (Fabric takes the ranks from its environment), every few
steps ``fabric.save("step_N.ckpt", state)``; on start, ``fabric.load`` of the highest ``step_N.ckpt``
into the same state. It knows nothing of ckpt-chaos.

The state holds the model, AdamW, the step, the data position (epoch, batch in epoch) and every rank's
torch RNG state (dropout draws from it), gathered to rank 0, the one rank ``fabric.save`` writes with.

    torchrun --nproc-per-node 2 examples/fabric/train.py --ckpt-dir /tmp/ckpt --steps 12
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch
from lightning.fabric import Fabric
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def dataset(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    y = x @ torch.randn(16, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def newest(ckpt_dir: Path) -> Path | None:
    found = [p for p in ckpt_dir.glob("step_*.ckpt") if re.fullmatch(r"step_\d+\.ckpt", p.name)]
    return max(found, key=lambda p: int(p.name[5:-5]), default=None)


def main() -> None:
    args = parse()
    fabric = Fabric(accelerator="cpu", strategy="ddp", devices=2)
    fabric.launch()  # under torchrun the ranks exist already: this only joins the process group
    rank, world = fabric.global_rank, fabric.world_size
    torch.manual_seed(args.seed)  # the same initial model on every rank
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = fabric.setup(model, opt)
    torch.manual_seed(args.seed + 1 + rank)  # dropout: a stream a rank

    data = dataset(args.samples, args.seed)
    # not setup_dataloaders: its wrapper sets the sampler's epoch from a count a relaunch starts at 0
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    # its own generator: a new epoch's iterator draws a seed from it, not from the RNG that dropout uses
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, generator=torch.Generator().manual_seed(args.seed))

    state = {"model": model, "optimizer": opt, "step": 0, "epoch": 0, "batch_in_epoch": 0,
             "rng": torch.stack([torch.get_rng_state()] * world)}
    last = newest(args.ckpt_dir) if args.ckpt_dir.is_dir() else None
    if last is not None:
        fabric.load(last, state)
        torch.set_rng_state(state["rng"][rank].clone())  # a row of its own: not a view into the stack
        print(f"rank {rank}: resumed from {last.name} at step {state['step']}", flush=True)

    step, epoch, skip = state["step"], state["epoch"], state["batch_in_epoch"]
    while step < args.steps:
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if i < skip:
                continue
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            fabric.backward(loss)
            opt.step()
            step += 1
            if step % args.save_every == 0 or step == args.steps:
                rngs = fabric.all_gather(torch.get_rng_state())  # every rank's, for rank 0 to write
                more = i + 1 < len(loader)
                state.update(step=step, epoch=epoch if more else epoch + 1, batch_in_epoch=i + 1 if more else 0,
                             rng=rngs)
                fabric.save(args.ckpt_dir / f"step_{step}.ckpt", state)
            if step >= args.steps:
                break
        else:
            epoch, skip = epoch + 1, 0
            continue
        break
    fabric.print(f"done at step {step}", flush=True)  # local rank 0's


if __name__ == "__main__":
    main()
