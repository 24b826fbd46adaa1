"""A DeepSpeed-style DDP loop (CPU, gloo, torchrun) that knows nothing of ckpt-chaos. A checkpoint is a
folder ``global_stepN/`` holding one file per rank, ``rankR_state.pt`` (the model, AdamW's state, the
step). Each rank ``torch.save``s into a ``BytesIO``, ``os.open``s a temporary name in the folder,
loops ``os.write``, ``os.fsync``, ``os.close``, ``os.rename``s it to the final name and fsyncs the
folder; after a barrier rank 0 replaces the ``latest`` pointer (``global_stepN``) the same way and
fsyncs the checkpoint directory. A launch resumes from the folder ``latest`` names.

``--tmp pid`` (DeepSpeed's habit): ``.rankR_state.pt.tmpPID``; ``fixed``: ``rankR_state.pt.tmp``;
``none``: written in place (broken); a list (``fixed,pid``) gives each rank its own, rank 0's for
``latest`` too. ``--pointer-first`` (broken): rank 0 moves ``latest`` to the new folder before any
rank writes its file.

    torchrun --nproc-per-node 2 tests/trainers/deepspeed_style.py --ckpt-dir /tmp/ckpt
"""

import argparse
import io
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

p = argparse.ArgumentParser()
p.add_argument("--ckpt-dir", type=Path, required=True)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--save-every", type=int, default=4)
p.add_argument("--tmp", default="pid", help="pid, fixed or none, or one of them per rank: fixed,pid")
p.add_argument("--pointer-first", action="store_true")
args = p.parse_args()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(path: Path, data: bytes) -> None:
    kinds = args.tmp.split(",")
    tmp = {"pid": path.with_name(f".{path.name}.tmp{os.getpid()}"), "fixed": path.with_name(path.name + ".tmp"),
           "none": path}[kinds[min(rank, len(kinds) - 1)]]
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view[:1 << 16]):]
        os.fsync(fd)
    finally:
        os.close(fd)
    if tmp != path:
        os.rename(tmp, path)
    fsync_dir(path.parent)


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 1)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
args.ckpt_dir.mkdir(parents=True, exist_ok=True)
pointer, step = args.ckpt_dir / "latest", 0
if pointer.exists():
    state = torch.load(args.ckpt_dir / pointer.read_text().strip() / f"rank{rank}_state.pt")
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    step = state["step"]
    print(f"rank {rank}: resumed from {pointer.read_text().strip()} at step {step}", flush=True)

while step < args.steps:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 64, generator=g)
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True).sin())
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    if step % args.save_every:
        continue
    folder = args.ckpt_dir / f"global_step{step}"
    folder.mkdir(exist_ok=True)
    buf = io.BytesIO()
    torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": step}, buf)
    if rank == 0 and args.pointer_first:
        write(pointer, folder.name.encode())
    write(folder / f"rank{rank}_state.pt", buf.getvalue())
    dist.barrier()
    if rank == 0 and not args.pointer_first:
        write(pointer, folder.name.encode())
    dist.barrier()
dist.destroy_process_group()
