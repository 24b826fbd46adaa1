"""How the idioms trainer resumes: which checkpoint a rule picks, and the reader that loads it."""

from __future__ import annotations

import json
import mmap
import pickle
import re
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from saving import EXT

RULES = ("pointer", "highest", "string_max", "mtime", "fallback")
READERS = ("torch", "safetensors", "npy", "mmap", "from_file")
OWN_READER = {"torch": "torch", "bytesio": "torch", "staging": "torch", "npsave": "npy", "tofile": "from_file",
              "mmap": "mmap", "safetensors": "safetensors"}


def layout(model, opt) -> list[tuple[str, int]]:
    """The name and length of each flat tensor ``saving.flat`` writes, in its order, from the model alone."""
    names = [(f"model.{k}", v.numel()) for k, v in model.state_dict().items()]
    for i, p in enumerate(opt.param_groups[0]["params"]):
        names += [(f"opt.{i}.step", 1), (f"opt.{i}.exp_avg", p.numel()), (f"opt.{i}.exp_avg_sq", p.numel())]
    return names + [("step", 1)]


def read(reader: str, path: Path, names: list[tuple[str, int]]) -> dict[str, torch.Tensor]:
    if reader == "torch":
        return torch.load(path, weights_only=True)
    if reader == "safetensors":
        from safetensors.torch import load_file
        return load_file(str(path))
    n = sum(k for _, k in names)
    if reader == "npy":
        vec = torch.from_numpy(np.load(path))
    elif reader == "from_file":
        if path.stat().st_size != 4 * n:  # from_file would read past the end of a short file
            raise ValueError(f"{path}: {path.stat().st_size} bytes, not {4 * n}")
        vec = torch.from_file(str(path), shared=False, size=n, dtype=torch.float32)
    else:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            vec = torch.from_numpy(np.frombuffer(m, dtype=np.float32).copy())
    if vec.numel() != n:
        raise ValueError(f"{path}: {vec.numel()} floats, not {n}")
    return dict(zip([k for k, _ in names], torch.split(vec, [k for _, k in names])))


def load_checkpoint(args, where: Path, model, opt, rank: int) -> tuple[int, dict]:
    """The step and flat state the checkpoint ``where`` holds for this rank; raises when it cannot be read."""
    ext = EXT[args.writer]
    if args.layout == "file":
        data = where
    else:
        data = where / (f"rank{rank}.{ext}" if args.layout == "per_rank" else f"model.{ext}")
    state = read(args.reader or OWN_READER[args.writer], data, layout(model, opt))
    step = int(state["step"].item())
    if args.sidecar == "json":
        with open(where / "meta.json") as f:
            step = json.load(f)["step"]
    elif args.sidecar == "pickle":
        with open(where / "meta.pkl", "rb") as f:
            step = pickle.load(f)["step"]
    return step, state


def apply(state: dict, model, opt) -> None:
    sd = model.state_dict()
    model.load_state_dict({k: state[f"model.{k}"].reshape(v.shape) for k, v in sd.items()})
    params = opt.param_groups[0]["params"]
    opt.load_state_dict({"param_groups": opt.state_dict()["param_groups"], "state": {
        i: {"step": state[f"opt.{i}.step"].reshape(()), "exp_avg": state[f"opt.{i}.exp_avg"].reshape(p.shape),
            "exp_avg_sq": state[f"opt.{i}.exp_avg_sq"].reshape(p.shape)} for i, p in enumerate(params)}})


def candidates(args) -> list[Path]:
    """The checkpoints by the trainer's own ordering, newest last."""
    ext = EXT[args.writer]
    pattern = re.compile(r"step_(\d+)" + ("" if args.layout != "file" else re.escape(f".{ext}")))
    found = [p for p in args.ckpt_dir.iterdir() if pattern.fullmatch(p.name)]
    key = {"string_max": lambda p: p.name,  # max() of the names as strings: step_12 < step_4
           "mtime": lambda p: p.stat().st_mtime_ns}.get(args.resume, lambda p: int(pattern.fullmatch(p.name)[1]))
    return sorted(found, key=key)


def resume(args, model, opt, rank: int) -> int:
    """Load what the rule picks into ``model`` and ``opt``; the step to go on from (0: fresh)."""
    if args.resume == "pointer":
        pointer = args.ckpt_dir / "latest"
        if not pointer.exists():
            return 0
        step, state = load_checkpoint(args, args.ckpt_dir / pointer.read_text().strip(), model, opt, rank)
    elif args.resume != "fallback":
        found = candidates(args)
        if not found:
            return 0
        step, state = load_checkpoint(args, found[-1], model, opt, rank)
    else:  # the newest that every rank can read, trying older ones on an error
        for where in reversed(candidates(args)):
            try:
                step, state = load_checkpoint(args, where, model, opt, rank)
                ok = torch.ones(1)
            except Exception as e:  # noqa: BLE001 - any error reading it means: take an older one
                print(f"rank {rank}: cannot load {where.name} ({type(e).__name__}: {e}); trying an older one",
                      flush=True)
                ok = torch.zeros(1)
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
            if ok.item():
                break
        else:
            return 0
    apply(state, model, opt)
    return step
