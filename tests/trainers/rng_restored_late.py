"""A DDP loop whose resume restores the torch RNG too early: it sets the saved RNG state, then makes
the epoch's data iterator, which draws its base seed from that RNG, so dropout at the first resumed
step draws from another stream than the golden run's. Model, optimizer and data position come back
whole. ``--late-rng 0`` restores the RNG after the iterator: a correct resume.

    torchrun --nproc-per-node 2 tests/trainers/rng_restored_late.py --ckpt-dir /tmp/ckpt
"""

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--ckpt-dir", type=Path, required=True)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--save-every", type=int, default=4)
p.add_argument("--late-rng", type=int, default=1)
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
args.ckpt_dir.mkdir(parents=True, exist_ok=True)
g = torch.Generator().manual_seed(0)
x = torch.randn(96, 8, generator=g)
data = TensorDataset(x, x.sum(1, keepdim=True))
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.2), nn.Linear(16, 1)))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
loader = DataLoader(data, batch_size=8, sampler=sampler)  # no generator: iter() draws from the torch RNG

step, per_epoch = 0, len(loader)
found = sorted(args.ckpt_dir.glob("step_*.pt"))
rng = None
if found:
    state = torch.load(found[-1], weights_only=False)
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    step, rng = state["step"], state["rng"][rank]
    if args.late_rng:
        torch.set_rng_state(rng)

while step < args.steps:
    epoch, skip = divmod(step, per_epoch)
    sampler.set_epoch(epoch)
    it = iter(loader)
    if rng is not None and not args.late_rng:
        torch.set_rng_state(rng)
    rng = None
    for i, (xb, yb) in enumerate(it):
        if i < skip:
            continue
        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % args.save_every == 0:
            rngs = [None] * world
            dist.all_gather_object(rngs, torch.get_rng_state())
            if rank == 0:
                tmp = args.ckpt_dir / f"step_{step:04d}.pt.tmp"
                torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": step,
                            "rng": rngs}, tmp)
                os.replace(tmp, args.ckpt_dir / f"step_{step:04d}.pt")
            dist.barrier()
        if step >= args.steps:
            break
dist.destroy_process_group()
