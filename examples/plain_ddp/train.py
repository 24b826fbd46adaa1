"""A plain PyTorch DDP training loop that checkpoints with ``torch.save``: CPU, gloo, under torchrun.

It knows nothing of ckpt-chaos. It is written as a careful team would write it: rank 0 saves one
file per checkpoint to a temporary name, fsyncs it, renames it into place and fsyncs the folder; a
checkpoint holds the model, the optimizer, the LR schedule, the step, the position in the epoch and
every rank's RNG state (dropout draws from it); a resume takes the newest ``step_*.pt`` and skips
the batches of the epoch that were already trained on.

    torchrun --nproc-per-node 2 examples/plain_ddp/train.py --ckpt-dir /tmp/ckpt --steps 12
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

NAME = re.compile(r"step_(\d{8})\.pt$")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--keep", type=int, default=2, help="checkpoints kept")
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
    found = sorted(p for p in ckpt_dir.glob("step_*.pt") if NAME.search(p.name))
    return found[-1] if found else None


def save(path: Path, state: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main() -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed + rank)
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)

    data = dataset(args.samples, args.seed)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    # its own generator: a new epoch's iterator draws a seed from it, not from the RNG that dropout uses
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, generator=torch.Generator().manual_seed(args.seed))

    step, epoch, skip = 0, 0, 0
    last = newest(args.ckpt_dir)
    if last is not None:
        state = torch.load(last, weights_only=False)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step, epoch, skip = state["step"], state["epoch"], state["batch_in_epoch"]
        torch.set_rng_state(state["rng"][rank])
        print(f"rank {rank}: resumed from {last.name} at step {step}", flush=True)

    while step < args.steps:
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if i < skip:
                continue
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if step % args.save_every == 0 or step == args.steps:
                rngs = [None] * world
                dist.all_gather_object(rngs, torch.get_rng_state())
                more = i + 1 < len(loader)
                if rank == 0:
                    save(args.ckpt_dir / f"step_{step:08d}.pt",
                         {"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                          "scheduler": sched.state_dict(), "step": step, "rng": rngs,
                          "epoch": epoch if more else epoch + 1, "batch_in_epoch": i + 1 if more else 0})
                    for old in sorted(args.ckpt_dir.glob("step_*.pt"))[:-args.keep]:
                        os.remove(old)
                dist.barrier()
            if step >= args.steps:
                break
        else:
            epoch, skip = epoch + 1, 0
            continue
        break
    if rank == 0:
        print(f"done at step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
