"""How the idioms trainer writes a checkpoint: the state as flat float32 tensors, one writer, one commit
order, a layout (rank 0's file or folder, or every rank's file), a sidecar and a pointer."""

from __future__ import annotations

import io
import json
import mmap
import os
import pickle
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

WRITERS = ("torch", "bytesio", "npsave", "tofile", "safetensors", "mmap", "staging")
EXT = {"torch": "pt", "bytesio": "pt", "staging": "pt", "npsave": "npy", "tofile": "bin", "mmap": "bin",
       "safetensors": "safetensors"}
# per file: (temporary name, fsync, renamed before the file is closed); tmp_folder: the folder is the unit
COMMITS = ("fsync_rename", "nofsync_rename", "rename_before_close", "in_place", "tmp_folder")
FILE_COMMIT = {"fsync_rename": (True, True, False), "nofsync_rename": (True, False, False),
               "rename_before_close": (True, True, True), "in_place": (False, False, False),
               "tmp_folder": (False, True, False)}
LAYOUTS = ("file", "folder", "per_rank")
POINTERS = ("none", "atomic", "in_place", "before_data")


def flat(model, opt, step: int, copy: bool) -> dict[str, torch.Tensor]:
    """Model, AdamW's per-parameter state and the step as named flat tensors (live ones unless ``copy``)."""
    out = {f"model.{k}": v for k, v in model.state_dict().items()}
    for i, s in opt.state_dict()["state"].items():
        out.update({f"opt.{i}.{k}": v for k, v in s.items()})
    out["step"] = torch.tensor([float(step)])
    return {k: (v.detach().clone() if copy else v.detach()).reshape(-1) for k, v in out.items()}


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_path(writer: str, state: dict, path: Path, sync: bool) -> None:
    """Writers that open the file themselves."""
    if writer == "safetensors":
        from safetensors.torch import save_file
        save_file(state, str(path))
    elif writer == "mmap":
        data = torch.cat(list(state.values())).numpy().tobytes()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(fd, len(data))
        with mmap.mmap(fd, len(data)) as m:
            m[:] = data
            m.flush()
        os.close(fd)
    elif writer == "staging":  # written outside the checkpoint folder, then copied in
        staged = Path(tempfile.gettempdir()) / f"staged-{os.getpid()}-{path.name}"
        torch.save(state, staged)
        shutil.copyfile(staged, path)
        os.remove(staged)
    if sync:
        fsync_path(path)


def write_file(writer: str, state: dict, path: Path, commit: str) -> None:
    tmp, sync, early = FILE_COMMIT[commit]
    target = path.with_name(path.name + ".tmp") if tmp else path
    if writer in ("safetensors", "mmap", "staging"):
        write_path(writer, state, target, sync)
    elif writer == "bytesio":  # DeepSpeed's way: serialized first, then os.write on a descriptor
        buf = io.BytesIO()
        torch.save(state, buf)
        data = memoryview(buf.getvalue())
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        while data:
            data = data[os.write(fd, data):]
        if sync:
            os.fsync(fd)
        if early:
            os.replace(target, path)
        os.close(fd)
    else:
        with open(target, "wb") as f:
            vec = torch.cat(list(state.values())).numpy()
            {"torch": lambda: torch.save(state, f), "npsave": lambda: np.save(f, vec),
             "tofile": lambda: vec.tofile(f)}[writer]()
            f.flush()
            if sync:
                os.fsync(f.fileno())
            if early:
                os.replace(target, path)
    if tmp and not early:
        os.replace(target, path)
    if tmp and sync:
        fsync_path(path.parent)


def write_small(path: Path, payload: bytes, commit: str) -> None:
    """A sidecar or the pointer, committed as ``commit`` says (``atomic``: as fsync_rename)."""
    tmp, sync, _ = FILE_COMMIT["fsync_rename" if commit == "atomic" else commit]
    target = path.with_name(path.name + ".tmp") if tmp else path
    with open(target, "wb") as f:
        f.write(payload)
        f.flush()
        if sync:
            os.fsync(f.fileno())
    if tmp:
        os.replace(target, path)
        if sync:
            fsync_path(path.parent)


def write_checkpoint(args, step: int, state: dict, rank: int, world: int) -> None:
    ext, name, top = EXT[args.writer], f"step_{step}", args.ckpt_dir
    pointer = "atomic" if args.pointer == "before_data" else args.pointer
    # the entry it names, right-aligned in 24 bytes: every save's pointer has the same length, and one
    # cut short holds blanks, as one truncated and not yet written does
    payload = f"{name + '.' + ext if args.layout == 'file' else name:>23}\n".encode()
    if args.pointer == "before_data" and rank == 0:
        write_small(top / "latest", payload, pointer)
    if args.layout == "file":
        if rank == 0:
            write_file(args.writer, state, top / f"{name}.{ext}", args.commit)
    else:
        folder = top / (f".tmp-{name}" if args.commit == "tmp_folder" else name)
        folder.mkdir(exist_ok=True)
        if args.layout == "per_rank" or rank == 0:
            write_file(args.writer, state, folder / (f"rank{rank}.{ext}" if args.layout == "per_rank"
                                                      else f"model.{ext}"), args.commit)
        dist.barrier()
        if rank == 0:
            if args.sidecar != "none":
                meta = {"step": step, "writer": args.writer}
                write_small(folder / f"meta.{'json' if args.sidecar == 'json' else 'pkl'}",
                            json.dumps(meta).encode() if args.sidecar == "json" else pickle.dumps(meta), args.commit)
            if FILE_COMMIT[args.commit][1]:
                fsync_path(folder)
            if args.commit == "tmp_folder":
                os.replace(folder, top / name)
            if FILE_COMMIT[args.commit][1]:
                fsync_path(top)
    if args.pointer in ("atomic", "in_place") and rank == 0:
        write_small(top / "latest", payload, pointer)


class Pending(threading.Thread):
    """A save a background thread writes once the next step has trained; ``finish`` waits for it."""

    def __init__(self, write):
        super().__init__(name="checkpoint-writer")
        self.go, self.write, self.error = threading.Event(), write, None
        self.start()

    def run(self):
        self.go.wait()
        try:
            self.write()
        except BaseException as e:  # handed to the training thread, which raises it
            self.error = e

    def finish(self):
        self.go.set()
        self.join()
        if self.error is not None:
            raise self.error


class Done:
    def finish(self):
        pass


def save(args, step: int, model, opt, rank: int, world: int):
    state = flat(model, opt, step, copy=args.thread != "nocopy")
    if args.thread == "none":
        write_checkpoint(args, step, state, rank, world)
        dist.barrier()
        return Done()
    return Pending(lambda: write_checkpoint(args, step, state, rank, world))
