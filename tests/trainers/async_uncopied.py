"""A DDP loop with a hand-written asynchronous checkpointer: rank 0 hands ``model.state_dict()`` and
``optimizer.state_dict()`` to a writer thread, which ``torch.save``s them to ``step_N.pt.tmp`` and
renames it into place while training goes on (it writes between steps, after the next one, and one
save is in flight at a time). ``--copy 0``: the state dicts are handed over uncopied, so the file of
step N holds the model and Adam's state of a later step (the live tensors) beside the step number N;
``--copy 1`` clones them first: a correct save.

    torchrun --nproc-per-node 2 tests/trainers/async_uncopied.py --ckpt-dir /tmp/ckpt
"""

import argparse
import copy
import os
import re
import threading
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--ckpt-dir", type=Path, required=True)
p.add_argument("--steps", type=int, default=16)
p.add_argument("--save-every", type=int, default=4)
p.add_argument("--copy", type=int, default=0)
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
args.ckpt_dir.mkdir(parents=True, exist_ok=True)
g = torch.Generator().manual_seed(0)
x = torch.randn(96, 8, generator=g)
data = TensorDataset(x, x.sum(1, keepdim=True))
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
loader = DataLoader(data, batch_size=8, sampler=sampler, generator=torch.Generator().manual_seed(0))

stepped = threading.Event()  # set after each optimizer step: the writer keeps off the step in flight


def write(state: dict, step: int) -> None:
    stepped.wait()
    tmp = args.ckpt_dir / f"step_{step:04d}.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, args.ckpt_dir / f"step_{step:04d}.pt")


step, per_epoch = 0, len(loader)
found = sorted(p for p in args.ckpt_dir.glob("step_*.pt") if re.fullmatch(r"step_\d+\.pt", p.name))
if found:
    state = torch.load(found[-1], weights_only=False)
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    step = state["step"]
    print(f"rank {rank}: resumed from {found[-1].name} at step {step}", flush=True)

writer = None
while step < args.steps:
    epoch, skip = divmod(step, per_epoch)
    sampler.set_epoch(epoch)
    for i, (xb, yb) in enumerate(loader):
        if i < skip:
            continue
        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        stepped.set()
        step += 1
        if step % args.save_every == 0 and rank == 0:
            if writer is not None:
                writer.join()
            state = {"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": step}
            if args.copy:
                state = copy.deepcopy(state)
            stepped.clear()
            writer = threading.Thread(target=write, args=(state, step))
            writer.start()
        if step >= args.steps:
            break
stepped.set()  # no step follows the last save
if writer is not None:
    writer.join()
dist.destroy_process_group()
