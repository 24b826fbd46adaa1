"""A plain PyTorch DDP loop that checkpoints with safetensors and a DeepSpeed-style ``latest``
pointer: CPU, gloo, under torchrun. It knows nothing of ckpt-chaos.

A checkpoint is a folder ``global_stepN/`` in the checkpoint directory, written by rank 0:
``model.safetensors`` (the weights), ``optimizer.safetensors`` (AdamW's per-parameter state,
flattened to ``state.<index>.<key>``) and ``state.json`` (the optimizer's parameter groups, the LR
schedule, the step, the place in the epoch, and every rank's torch, Python and NumPy RNG state).
Every file and the folder are fsynced; then the pointer file ``latest``, holding ``global_stepN``,
is written to a temporary name, fsynced, renamed into place and the checkpoint directory fsynced:
the pointer only ever names a folder that is complete and durable. Older folders are deleted after
the pointer moved (two are kept). On start every rank reads ``latest`` and loads what it names with
``safetensors.torch.load_file`` and ``json.load``.

The data loader has no generator of its own (as most are written): each epoch's iterator draws its
base seed from torch's global RNG, the one dropout draws from. So on a resume in the middle of an
epoch, the saved torch RNG state is put back after the resumed epoch's iterator is made, not before.

    torchrun --standalone --nproc-per-node 2 examples/safetensors_pointer/train.py --ckpt-dir /tmp/ckpt --steps 12

``--restore-rng-early``: the planted variant, a resume written the obvious way, every piece of
state restored as the checkpoint is read, torch's RNG included: the new epoch iterator then draws
its seed from the restored RNG, and dropout's draws after the resume are not the uninterrupted
run's. ``--print-losses`` prints each step's loss bits on rank 0; ``--crash-after-step N`` makes every
rank exit at once after step N (a crash, to try the resume by hand).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

POINTER = "latest"


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--keep", type=int, default=2, help="checkpoint folders kept")
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--restore-rng-early", action="store_true", help="planted: torch's RNG restored before the "
                   "resumed epoch's data loader iterator draws its seed")
    p.add_argument("--print-losses", action="store_true")
    p.add_argument("--crash-after-step", type=int, default=None)
    return p.parse_args()


def dataset(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    y = torch.tanh(x @ torch.randn(16, 1, generator=g)) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- the checkpoint: safetensors files, a JSON sidecar, the pointer ------------------------------

def rng_state() -> dict:
    return {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
            "python": repr(random.getstate()),
            "numpy": [a.tolist() if isinstance(a, np.ndarray) else a for a in np.random.get_state()]}


def set_rng_state(state: dict, torch_too: bool = True) -> None:
    import ast

    random.setstate(ast.literal_eval(state["python"]))
    kind, keys, pos, gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, gauss, cached))
    if torch_too:
        set_torch_rng(state)


def set_torch_rng(state: dict) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))


def flatten_optimizer(sd: dict) -> tuple[dict[str, torch.Tensor], list]:
    tensors = {f"state.{i}.{k}": v.detach().clone().contiguous()
               for i, s in sd["state"].items() for k, v in s.items()}
    return tensors, sd["param_groups"]


def unflatten_optimizer(tensors: dict[str, torch.Tensor], groups: list) -> dict:
    state: dict[int, dict] = {}
    for name, t in tensors.items():
        _, i, k = name.split(".", 2)
        state.setdefault(int(i), {})[k] = t
    return {"state": state, "param_groups": groups}


def save(ckpt_dir: Path, step: int, model: nn.Module, opt, sched, meta: dict, keep: int) -> None:
    """Rank 0: the folder, durable, then the pointer, then retention."""
    name = f"global_step{step}"
    folder = ckpt_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    tensors, groups = flatten_optimizer(opt.state_dict())
    save_file(tensors, str(folder / "optimizer.safetensors"))
    with open(folder / "state.json", "w") as f:
        json.dump({**meta, "param_groups": groups, "scheduler": sched.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())
    for p in ("model.safetensors", "optimizer.safetensors"):
        fsync_path(folder / p)
    fsync_path(folder)
    fsync_path(ckpt_dir)  # the new folder's entry
    # the pointer, done right: temporary name, fsync, rename, fsync of the directory
    tmp = ckpt_dir / f"{POINTER}.tmp"
    with open(tmp, "w") as f:
        f.write(name)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, ckpt_dir / POINTER)
    fsync_path(ckpt_dir)
    folders = sorted((p for p in ckpt_dir.glob("global_step*") if p.is_dir() and p.name[11:].isdigit()),
                     key=lambda p: int(p.name[11:]))
    for old in folders[:-keep]:
        shutil.rmtree(old)


def load(ckpt_dir: Path) -> tuple[str, dict, dict, dict] | None:
    """The checkpoint ``latest`` names: (name, model tensors, optimizer state dict, sidecar), or None."""
    pointer = ckpt_dir / POINTER
    if not pointer.is_file():
        return None
    name = pointer.read_text().strip()
    folder = ckpt_dir / name
    model = load_file(str(folder / "model.safetensors"))
    with open(folder / "state.json") as f:
        meta = json.load(f)
    opt = unflatten_optimizer(load_file(str(folder / "optimizer.safetensors")), meta["param_groups"])
    return name, model, opt, meta


def main() -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed + rank)
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)

    data = dataset(args.samples, args.seed)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Dropout(0.1),
                                                  nn.Linear(128, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)  # its iterators seed from torch's RNG

    step, epoch, skip, rng = 0, 0, 0, None
    found = load(args.ckpt_dir)
    if found is not None:
        name, weights, opt_state, meta = found
        model.module.load_state_dict(weights)
        opt.load_state_dict(opt_state)
        sched.load_state_dict(meta["scheduler"])
        step, epoch, skip = meta["step"], meta["epoch"], meta["batch_in_epoch"]
        rng = meta["rng"][rank]
        # saved mid-epoch, the epoch's iterator had drawn its seed before the save: torch's RNG goes
        # back after the resumed iterator drew; saved at an epoch's end, before the next one draws
        early = skip == 0 or args.restore_rng_early
        set_rng_state(rng, torch_too=early)
        if early:
            rng = None
        print(f"rank {rank}: resumed from {name} at step {step}", flush=True)

    while step < args.steps:
        sampler.set_epoch(epoch)
        batches = iter(loader)  # draws the iterator's base seed from torch's RNG
        if rng is not None:  # what the checkpoint saved, after that draw, as it was when it was saved
            set_torch_rng(rng)
            rng = None
        for i, (x, y) in enumerate(batches):
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
                dist.all_gather_object(rngs, rng_state())
                more = i + 1 < len(loader)
                if rank == 0:
                    save(args.ckpt_dir, step, model.module, opt, sched,
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
