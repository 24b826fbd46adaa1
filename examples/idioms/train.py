"""A small DDP trainer whose save and resume are picked by switches: each set of switches is one way
real code saves and resumes (an idiom of ``idioms.py``). CPU, gloo, under torchrun; it knows nothing of
ckpt-chaos.

The batch of a step is drawn from a generator seeded by the step and the rank and nothing else draws
random numbers, so a resume needs the model, AdamW's state and the step, and no data position: a
divergence after a resume is the checkpoint's doing. ``saving.py`` writes, ``loading.py`` resumes.

    torchrun --standalone --nproc-per-node 2 examples/idioms/train.py --ckpt-dir /tmp/ckpt \
        --writer torch --commit fsync_rename --resume highest
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import loading  # the trainer's own modules, beside it (its folder is on sys.path)
import saving


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--writer", choices=saving.WRITERS, default="torch")
    p.add_argument("--commit", choices=saving.COMMITS, default="fsync_rename")
    p.add_argument("--layout", choices=saving.LAYOUTS, default="file",
                   help="file: one file step_N.EXT of rank 0; folder: step_N/model.EXT of rank 0; "
                        "per_rank: step_N/rankR.EXT of every rank")
    p.add_argument("--sidecar", choices=("none", "json", "pickle"), default="none",
                   help="rank 0 writes the step into step_N/meta.json or meta.pkl after the data")
    p.add_argument("--pointer", choices=saving.POINTERS, default="none")
    p.add_argument("--thread", choices=("none", "copy", "nocopy"), default="none",
                   help="a background thread writes while the next step trains, given a copy of the "
                        "state or the live tensors")
    p.add_argument("--resume", choices=loading.RULES, default="highest")
    p.add_argument("--reader", choices=loading.READERS, default=None, help="default: the writer's own")
    args = p.parse_args()
    if args.sidecar != "none" and args.layout == "file":
        args.layout = "folder"  # a sidecar lives beside the data, in the checkpoint's folder
    return args


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 16, generator=g)
    return x, torch.sin(x.sum(1, keepdim=True))


def main() -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)

    step = loading.resume(args, model.module, opt, rank)
    if step:
        print(f"rank {rank}: resumed at step {step}", flush=True)
    pending = None
    while step < args.steps:
        x, y = batch(step, rank)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if pending is not None:  # the save before this step is written now, while training went on
            pending.finish()
            pending = None
        if step % args.save_every == 0 or step == args.steps:
            pending = saving.save(args, step, model.module, opt, rank, world)
    if pending is not None:
        pending.finish()
    if rank == 0:
        print(f"done at step {step}", flush=True)
    # DDP's reducer holds the process group: freed with the model as main returns, holding the GIL, it
    # would be the group's last holder, and gloo's destructor joins its worker threads, one of which may
    # need the GIL to free the tensors of a collective just finished (DCP's broadcast of its plan): a
    # deadlock (pytorch/pytorch#56297). Freed first, it leaves the group to destroy_process_group, whose
    # binding releases the GIL to destroy it.
    del model
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
