"""A DDP loop that saves as DeepSpeed's engine does: each rank serializes its state into a buffer,
writes it with ``os.open``/``os.write`` under a temporary name in ``global_stepN/``, fsyncs, closes,
renames it to ``rankR_state.pt`` and fsyncs the folder; after a barrier rank 0 replaces ``latest``
the same way. A resume reads the step ``latest`` names. A correct atomic save.

    torchrun --nproc-per-node 2 tests/trainers/os_write_writer.py --ckpt-dir /tmp/ckpt
"""

import argparse
import io
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
args = p.parse_args()


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[:1 << 16]):]
    os.fsync(fd)
    os.close(fd)
    os.rename(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
g = torch.Generator().manual_seed(0)
x = torch.randn(96, 8, generator=g)
data = TensorDataset(x, x.sum(1, keepdim=True))
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1)))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
loader = DataLoader(data, batch_size=8, sampler=sampler, generator=torch.Generator().manual_seed(0))

step, per_epoch = 0, len(loader)
latest = args.ckpt_dir / "latest"
if latest.exists():
    folder = args.ckpt_dir / latest.read_text().strip()
    state = torch.load(folder / f"rank{rank}_state.pt", weights_only=False)
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    step = state["step"]
    print(f"rank {rank}: resumed from {folder.name} at step {step}", flush=True)

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
        step += 1
        if step % args.save_every == 0:
            folder = args.ckpt_dir / f"global_step{step}"
            folder.mkdir(parents=True, exist_ok=True)
            buf = io.BytesIO()
            torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": step}, buf)
            write_atomically(folder / f"rank{rank}_state.pt", buf.getvalue())
            dist.barrier()
            if rank == 0:
                write_atomically(latest, folder.name.encode())
            dist.barrier()
        if step >= args.steps:
            break
dist.destroy_process_group()
