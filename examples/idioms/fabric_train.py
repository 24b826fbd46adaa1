"""The idioms trainer's loop under Lightning Fabric: ``fabric.save`` every 4 steps into ``step_N.ckpt``,
``fabric.load`` of the highest on a resume. Fabric (through fsspec's transaction) writes the file in
``TMPDIR`` and ``shutil.move``s it into place: a rename when ``TMPDIR`` is on the checkpoint folder's file
system, a copy into the final name when it is not; nothing is fsynced. CPU, gloo, under torchrun.

    TMPDIR=/tmp torchrun --standalone --nproc-per-node 2 examples/idioms/fabric_train.py --ckpt-dir /tmp/ckpt
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch
from lightning.fabric import Fabric
from torch import nn

from train import batch  # the same data: a step's batch from the step and the rank


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--save-every", type=int, default=4)
    args = p.parse_args()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = fabric.setup(model, opt)
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)

    state = {"model": model, "optimizer": opt, "step": 0}
    found = [q for q in args.ckpt_dir.glob("step_*.ckpt") if re.fullmatch(r"step_\d+\.ckpt", q.name)]
    if found:
        last = max(found, key=lambda q: int(q.name[5:-5]))
        fabric.load(last, state)
        print(f"rank {fabric.global_rank}: resumed from {last.name} at step {state['step']}", flush=True)
    while state["step"] < args.steps:
        x, y = batch(state["step"], fabric.global_rank)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        fabric.backward(loss)
        opt.step()
        state["step"] += 1
        if state["step"] % args.save_every == 0 or state["step"] == args.steps:
            fabric.save(args.ckpt_dir / f"step_{state['step']}.ckpt", state)
    if fabric.global_rank == 0:
        print(f"done at step {state['step']}", flush=True)


if __name__ == "__main__":
    main()
