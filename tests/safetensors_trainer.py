"""A tiny trainer that checkpoints with safetensors, for tests/test_follow_faultfs.py: safetensors' own
(Rust) writer writes each file under a random temporary name beside it (``.tmpXXXXXX``) and renames
it into place, where Python never sees a write. Each save, into ``CKPT_DIR/step_N/``, writes
``optimizer.safetensors`` (Adam's two moments: twice the model's bytes) first, then
``model.safetensors``: a glob over the temporary names matches the larger file first. It resumes
from the newest ``step_N`` holding both files. It knows nothing of ckpt-chaos.

    python tests/safetensors_trainer.py --ckpt-dir /tmp/ckpt --steps 8 --save-every 4
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

KEYS = ("step", "exp_avg", "exp_avg_sq")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--save-every", type=int, default=4)
    args = p.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)  # 263 kB of weights
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 256, generator=g), torch.randn(64, 256, generator=g)

    step = 0
    saved = sorted((int(m.group(1)), d) for d in args.ckpt_dir.glob("step_*")
                   if (m := re.fullmatch(r"step_(\d+)", d.name))
                   and (d / "model.safetensors").is_file() and (d / "optimizer.safetensors").is_file())
    if saved:
        step, d = saved[-1]
        model.load_state_dict(load_file(d / "model.safetensors"))
        moments = load_file(d / "optimizer.safetensors")
        state = opt.state_dict()
        state["state"] = {i: {k: moments[f"{i}.{k}"] for k in KEYS} for i in range(len(state["param_groups"][0]["params"]))}
        opt.load_state_dict(state)
        print(f"resumed from {d.name}", flush=True)

    while step < args.steps:
        batch = slice(step % 8 * 8, step % 8 * 8 + 8)
        loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % args.save_every == 0:
            d = args.ckpt_dir / f"step_{step}"
            d.mkdir(parents=True, exist_ok=True)
            moments = {f"{i}.{k}": v.contiguous() for i, s in opt.state_dict()["state"].items() for k, v in s.items()}
            save_file(moments, d / "optimizer.safetensors")
            save_file(model.state_dict(), d / "model.safetensors")
    print(f"done at step {step}", flush=True)


if __name__ == "__main__":
    main()
