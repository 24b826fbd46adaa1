"""The idioms trainer's loop, saved and resumed the torchtitan way: torch DCP's ``get_state_dict`` and
``set_state_dict`` around ``dcp.save`` (or ``dcp.async_save``, on a gloo group of its own, waited for
before the next save) into ``step_N/``; a resume takes the highest ``step_N`` holding a ``.metadata``,
which DCP writes last (fsynced, renamed into place). CPU, gloo, under torchrun.

    torchrun --standalone --nproc-per-node 2 examples/idioms/dcp_train.py --ckpt-dir /tmp/ckpt [--async]
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

from train import batch  # the same data: a step's batch from the step and the rank


def newest(ckpt_dir: Path) -> Path | None:
    found = [p for p in ckpt_dir.glob("step_*") if re.fullmatch(r"step_\d+", p.name) and (p / ".metadata").exists()]
    return max(found, key=lambda p: int(p.name[5:]), default=None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--async", dest="use_async", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    saver = dist.new_group(backend="gloo") if args.use_async else None

    step = 0
    last = newest(args.ckpt_dir)
    if last is not None:
        msd, osd = get_state_dict(model, opt)  # creates AdamW's state with a step at lr 0 first
        state = {"model": msd, "optim": osd, "step": 0}
        dcp.load(state, checkpoint_id=str(last))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        step = state["step"]
        print(f"rank {rank}: resumed from {last.name} at step {step}", flush=True)

    pending = None
    while step < args.steps:
        x, y = batch(step, rank)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % args.save_every == 0 or step == args.steps:
            msd, osd = get_state_dict(model, opt)
            state = {"model": msd, "optim": osd, "step": step}
            where = str(args.ckpt_dir / f"step_{step}")
            if args.use_async:
                if pending is not None:
                    pending.result()
                pending = dcp.async_save(state, checkpoint_id=where, process_group=saver)
            else:
                dcp.save(state, checkpoint_id=where)
    if pending is not None:
        pending.result()
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
