"""A plain PyTorch DDP loop whose checkpoint is read natively: CPU, gloo, under torchrun. It knows
nothing of ckpt-chaos.

Why this layout: it is the shape of a trainer that keeps its weights as raw arrays for a C++ or
Rust consumer (an inference server, a memory-mapped reader) and reads them back the same way. A
checkpoint is a folder ``step_N/``: ``model.f32`` (every parameter, flat float32, one after the
other), ``optim.f32`` (AdamW's two moments of every parameter, flat float32: the biggest file) and
``index.json`` (each tensor's file, offset and shape; Adam's step counts, the parameter groups, the
LR schedule, the step, the place in the epoch, each rank's torch RNG state). The arrays are written
by numpy's ``ndarray.tofile``, which writes through a C ``FILE*`` (Python opens the file, numpy
writes it in C); they are read with ``torch.from_file``, where C++ opens and maps the file. No byte of
a load goes through Python's file API: a Python-level tracer sees no read at all (``index.json`` is
read with ``open``, which is not a load either). A save writes ``.tmp-step_N/``, fsyncs every file and
the folder, renames it to ``step_N`` and fsyncs the checkpoint directory; a resume takes the
newest ``step_N`` (two are kept).

    torchrun --standalone --nproc-per-node 2 examples/native_reader/train.py --ckpt-dir /tmp/ckpt --steps 12

``--reset-optimizer-on-resume``: the planted variant, a resume that restores the weights, the LR
schedule, the step, the data position and the RNG but starts AdamW afresh ("the moments are cheap to
rebuild"; a warm start taken for a resume): the moments and Adam's step count are not the saved
ones, so every step after a resume differs. ``--print-losses`` prints each step's loss bits on rank
0; ``--crash-after-step N`` makes every rank exit at once after step N (a crash, to try the resume).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

NAME = re.compile(r"^step_(\d+)$")
MOMENTS = ("exp_avg", "exp_avg_sq")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--keep", type=int, default=2, help="checkpoints kept")
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reset-optimizer-on-resume", action="store_true",
                   help="planted: AdamW's state is not restored on resume")
    p.add_argument("--print-losses", action="store_true")
    p.add_argument("--crash-after-step", type=int, default=None)
    return p.parse_args()


def dataset(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    y = torch.sin(x @ torch.randn(16, 1, generator=g)) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def newest(ckpt_dir: Path) -> tuple[int, Path] | None:
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := NAME.match(p.name)) and p.is_dir()]
    return max(found) if found else None


def write_flat(path: Path, tensors: list[torch.Tensor], index: dict, prefix: str) -> None:
    """One flat float32 file of ``tensors``, each one's offset and shape in ``index``; written by numpy."""
    offset = 0
    for i, t in enumerate(tensors):
        index[f"{prefix}{i}"] = {"file": path.name, "offset": offset, "shape": list(t.shape)}
        offset += t.numel()
    flat = torch.cat([t.detach().reshape(-1).float() for t in tensors]) if tensors else torch.zeros(0)
    flat.numpy().tofile(path)  # C stdio, not Python's file API


def read_flat(folder: Path, index: dict, prefix: str, count: int) -> list[torch.Tensor]:
    """The tensors ``write_flat`` wrote, read by torch.from_file (C++ opens and maps the file)."""
    out, files = [], {}
    for i in range(count):
        entry = index[f"{prefix}{i}"]
        name = entry["file"]
        if name not in files:
            size = (folder / name).stat().st_size // 4
            files[name] = torch.from_file(str(folder / name), shared=False, size=size, dtype=torch.float32)
        n = int(np.prod(entry["shape"])) if entry["shape"] else 1
        out.append(files[name][entry["offset"]:entry["offset"] + n].reshape(entry["shape"]).clone())
    return out


def save(ckpt_dir: Path, step: int, model: nn.Module, opt, sched, meta: dict, keep: int) -> None:
    final = ckpt_dir / f"step_{step}"
    tmp = ckpt_dir / f".tmp-step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    params = [p for g in opt.param_groups for p in g["params"]]
    index: dict = {"tensors": {}}
    write_flat(tmp / "model.f32", [p for p in params], index["tensors"], "param.")
    moments = [opt.state[p][k] for p in params for k in MOMENTS]
    write_flat(tmp / "optim.f32", moments, index["tensors"], "moment.")
    sd = opt.state_dict()
    index.update(meta, adam_steps=[float(opt.state[p]["step"]) for p in params],
                 param_groups=sd["param_groups"], scheduler=sched.state_dict())
    with open(tmp / "index.json", "w") as f:
        json.dump(index, f)
        f.flush()
        os.fsync(f.fileno())
    for name in ("model.f32", "optim.f32"):
        fsync_path(tmp / name)
    fsync_path(tmp)
    os.replace(tmp, final)
    fsync_path(ckpt_dir)
    done = sorted((int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := NAME.match(p.name)) and p.is_dir())
    for _, old in done[:-keep]:
        shutil.rmtree(old)


def load(folder: Path, model: nn.Module, opt, sched, fresh_optimizer: bool) -> dict:
    with open(folder / "index.json") as f:
        index = json.load(f)
    params = [p for g in opt.param_groups for p in g["params"]]
    with torch.no_grad():
        for p, t in zip(params, read_flat(folder, index["tensors"], "param.", len(params))):
            p.copy_(t)
    if not fresh_optimizer:
        moments = read_flat(folder, index["tensors"], "moment.", len(params) * len(MOMENTS))
        state = {i: {"step": torch.tensor(index["adam_steps"][i]),
                     **{k: moments[i * len(MOMENTS) + j] for j, k in enumerate(MOMENTS)}}
                 for i in range(len(params))}
        opt.load_state_dict({"state": state, "param_groups": index["param_groups"]})
    sched.load_state_dict(index["scheduler"])
    for group, lr in zip(opt.param_groups, sched.get_last_lr()):
        group["lr"] = lr
    return index


def main() -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed + rank)
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)

    data = dataset(args.samples, args.seed)
    net = nn.Sequential(nn.Linear(16, 128), nn.GELU(), nn.Dropout(0.1), nn.Linear(128, 128), nn.GELU(),
                        nn.Dropout(0.1), nn.Linear(128, 1))
    model = DistributedDataParallel(net)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    # its own generator: a new epoch's iterator draws a seed from it, not from the RNG that dropout uses
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, generator=torch.Generator().manual_seed(args.seed))

    step, epoch, skip = 0, 0, 0
    found = newest(args.ckpt_dir)
    if found is not None:
        _, folder = found
        index = load(folder, net, opt, sched, args.reset_optimizer_on_resume)
        step, epoch, skip = index["step"], index["epoch"], index["batch_in_epoch"]
        torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(index["rng"][rank])), dtype=torch.uint8))
        print(f"rank {rank}: resumed from {folder.name} at step {step}", flush=True)

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
            if args.print_losses and rank == 0:
                print(f"step {step} loss {loss.item().hex()}", flush=True)
            if step % args.save_every == 0 or step == args.steps:
                rngs = [None] * world
                dist.all_gather_object(rngs, base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode())
                more = i + 1 < len(loader)
                if rank == 0:
                    save(args.ckpt_dir, step, net, opt, sched,
                         {"step": step, "epoch": epoch if more else epoch + 1,
                          "batch_in_epoch": i + 1 if more else 0, "rng": rngs}, args.keep)
                dist.barrier()
            if step == args.crash_after_step:
                os._exit(1)
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
