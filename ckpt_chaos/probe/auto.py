"""The automatic probe layer: the probe's points, and a trajectory, from a trainer that never calls
the probe (a Lightning, Accelerate or plain PyTorch script, unmodified).

The harness puts ``ckpt_chaos/probe/site`` on the job's ``PYTHONPATH``; its ``sitecustomize`` calls
``install()`` in every process that has a controller address in its environment, before the
trainer's first line. ``install()`` never imports torch: it patches the standard library's file
operations at once and patches torch's modules when the trainer imports them (an import hook), so
a launcher process (torchrun, ``accelerate launch``) pays nothing it would not pay anyway.

What it reports, as probe points (``ckpt_chaos.probe.point``, so triggers and faults work as they do
for the reference trainer):

* ``step.begin`` / ``step.end`` from the optimizer's global step hooks, numbered by the optimizer's
  own ``state[p]["step"]`` (so a resumed run counts on from where its checkpoint was), else counted;
  ``microstep.end`` after each backward;
* ``ckpt.stage`` when a save starts (``torch.distributed.checkpoint.save``, ``torch.save`` into a
  watched directory), ``load.begin`` / ``load.end`` around ``dcp.load`` and ``torch.load`` of a
  watched path;
* DCP's shard files (``*.distcp``) as ``ckpt.shard.write`` (with ``bytes`` and, where the size is
  known, ``fraction``) and ``ckpt.shard.done``; its ``.metadata`` rename as ``ckpt.metadata``;
* any other file written in a watched directory through Python (``open``, and ``torch.save``,
  which is made to write through a Python stream) as ``file.write`` / ``file.done`` (bytes that
  native code wrote through such a file's descriptor, as numpy's ``tofile`` does, counted from the
  file's size: ``native``; a file closed short of the golden run's: ``short``); and
  ``file.fsync``, ``file.rename``, ``file.remove``, ``file.rmtree``, ``file.copy`` (a copy is made
  in chunks, so ``file.write`` fires inside it too).

A write is cut at every tenth of the file's planned size (the size of the same file in the golden
run, ``CKPT_CHAOS_PLANNED``), flushed, and reported there: a fault at ``min_fraction = 0.5`` finds
exactly half of the file's bytes on disk. Without a planned size, a write is reported every MiB.
The same file in the golden run is found through its renames (``probe/follow.py``): a temporary
file is planned at the size of the file it becomes, and its points carry that file's names
(``aliases``), so a trigger on the final name fires on the temporary file's writes.

Each process says which patches took (``probe.armed``, sent before its first point and again when
an import arms more), so the harness can tell a point that cannot fire from one that did not; and
which release of each framework it patched (``versions``), with a line for each outside the range
the layer supports (``unsupported``; ``probe/versions.py``), which the run's result carries.

The recorder writes one line per optimizer step of rank 0 to ``RUN_DIR/trajectory.jsonl``: the step,
the loss of each backward of the step (float bits, ``float.hex``), the learning rate, the ids of
the samples each backward trained on (the batch a data loader delivered last before it), and every
``CKPT_CHAOS_DIGEST_EVERY`` steps digests of the optimizer's parameters and state; at exit, ``RUN_DIR/events.jsonl`` gets the
last step's digests. ``ckpt_chaos.record(...)`` adds what the layer cannot see.
"""

from __future__ import annotations

import builtins
import collections
import errno
import hashlib
import importlib.abc
import importlib.machinery
import io
import json
import os
import shutil
import sys
import threading
import time

from ckpt_chaos import probe
from ckpt_chaos.probe import follow, versions

ENV_DIRS = "CKPT_CHAOS_AUTO_DIRS"  # os.pathsep-separated directories whose files are watched
ENV_RUN_DIR = "CKPT_CHAOS_RUN_DIR"  # where the recorder writes (the harness's run directory)
ENV_PLANNED = "CKPT_CHAOS_PLANNED"  # JSON file: the golden run's files, sizes and keys (follow.plan)
ENV_DIGEST_EVERY = "CKPT_CHAOS_DIGEST_EVERY"  # state digests every N steps (0: at exit only)
# Which of the per-step points go to the controller: "all" (unset), or those a fault's trigger names
# (comma-separated, may be empty). Each is a round trip on every step, which a short step feels; the
# checks read the steps from the trajectory.
ENV_STEP_POINTS = "CKPT_CHAOS_STEP_POINTS"
STEP_POINTS = ("step.begin", "step.end", "microstep.end")

CHUNK = 1 << 20  # bytes between file.write points when the file's size is not known
TENTHS = 10
WHOLE = 4096  # a first write at least this long, to a file with no planned size, is taken as the whole file

# The points this layer can fire, by the patch that fires them.
PATCH_POINTS = {
    "files": ("file.write", "file.done", "file.read", "file.fsync", "file.rename", "file.remove", "file.rmtree",
              "file.copy", "ckpt.shard.write", "ckpt.shard.done", "ckpt.metadata"),
    "torch.optim": ("step.begin", "step.end"),
    "torch.autograd": ("microstep.end",),
    "torch.save": ("ckpt.stage", "file.write", "file.done"),
    "torch.load": ("load.begin", "load.end"),
    "torch.utils.data": (),
    "torch.distributed.checkpoint": ("ckpt.stage", "load.begin", "load.end"),
    "lightning": ("ckpt.stage",),
    "accelerate": ("ckpt.stage", "load.begin", "load.end"),
}

_orig = {"open": builtins.open, "io.open": io.open, "fsync": os.fsync, "fdatasync": getattr(os, "fdatasync", None),
         "rename": os.rename, "replace": os.replace, "remove": os.remove, "unlink": os.unlink,
         "rmtree": shutil.rmtree, "copyfile": shutil.copyfile}


class _State:
    def __init__(self):
        self.installed = False
        self.dirs: tuple[str, ...] = ()
        self.run_dir = ""
        self.follow = follow.Follower()  # the golden run's file of each file written (probe/follow.py)
        self.digest_every = 0
        self.rank: int | None = None
        self.rank_pid = 0
        self.fds: dict[tuple[str, int], int] = {}  # (file in the run directory, pid) -> descriptor
        self.armed: list[str] = []
        self.reported: set[str] = set()  # patches this process has told the controller about
        self.versions: dict[str, str | None] = {}  # framework -> the release found when it was patched
        self.unsupported: list[str] = []  # a line for each release outside versions.SUPPORTED
        self.pid = 0
        self.local = threading.local()  # re-entrancy: a patched call inside another is not reported twice
        self.fds: dict[int, str] = {}  # open file descriptors of watched files -> path, for fsync
        # the recorder
        self.step_of: dict[int, int] = {}  # id(optimizer) -> steps counted
        self.losses: list[str] = []
        self.samples: list = []  # ids of the batches this step's backwards trained on
        self.batch = None  # ids of the batch a data loader delivered last
        self.last_iter = None  # the data loader iterator that fetched last
        self.extra: dict = {}
        self.last: dict | None = None
        self.optimizers: list = []
        self.step_points: frozenset[str] = frozenset(STEP_POINTS)
        self.attempt = 0  # the launch, as the probe counts it (a harness relaunch or a torchrun restart)
        self.pre_digest = True  # digest the state before the next step: the first of a process, or after a save
        self.pre: dict = {}
        self.folders: tuple | None = None  # the watched folders' entries at the last step


_s = _State()


# ---- reporting ---------------------------------------------------------------------------------------

def _point(name: str, /, **info) -> None:
    """Report a point, first telling the controller what is armed if that changed."""
    if os.getpid() != _s.pid:  # a forked child (a data-loader worker) reports as itself, from scratch
        _s.pid, _s.reported = os.getpid(), set()
    new = [a for a in [*_s.armed, *(f"version:{n}" for n in _s.versions)] if a not in _s.reported]
    if new:
        _s.reported.update(new)
        probe.point("probe.armed", armed=list(_s.armed), points=sorted(armed_points(_s.armed)),
                    versions=dict(_s.versions), **({"unsupported": list(_s.unsupported)} if _s.unsupported else {}))
    probe.point(name, **info)


def armed_points(patches) -> set[str]:
    return {p for name in patches for p in PATCH_POINTS.get(name, ())}


def _arm(name: str) -> None:
    if name not in _s.armed:
        _s.armed.append(name)


class _Quiet:
    """Inside a reported operation: the calls it makes itself (``shutil.move`` renaming, a copy
    opening files) are not reported again."""

    def __enter__(self):
        _s.local.depth = getattr(_s.local, "depth", 0) + 1

    def __exit__(self, *exc):
        _s.local.depth -= 1


def _quiet() -> bool:
    return getattr(_s.local, "depth", 0) > 0


def _watched(path) -> str | None:
    """The path as reported (relative to the run directory where it lies in it), or None when it is
    not in a watched directory."""
    if not _s.dirs or isinstance(path, int):
        return None
    try:
        full = os.path.abspath(os.fsdecode(path))
    except (TypeError, ValueError):
        return None
    if not any(full == d or full.startswith(d + os.sep) for d in _s.dirs):
        return None
    if _s.run_dir and full.startswith(_s.run_dir + os.sep):
        return os.path.relpath(full, _s.run_dir)
    return full


def _kind(rel: str) -> tuple[str, str]:
    """The write and done points of a file: DCP's shard files are the checkpoint's shards."""
    if rel.endswith(".distcp"):
        return "ckpt.shard.write", "ckpt.shard.done"
    return "file.write", "file.done"


# ---- files -------------------------------------------------------------------------------------------

class _Watched(io.RawIOBase):
    """A file being written in a watched directory: writes go straight to the file (no buffer of
    ours), cut at each tenth of the planned size, and reported there.

    Native code that writes through the file's descriptor (numpy's ``tofile``, which flushes the
    Python file and ``fwrite``s to a dup of ``fileno()``) passes no byte through ``write``: the points
    report the bytes the descriptor shows (the file's size, less what an append found there) where
    that is more than Python wrote, with ``native`` (and ``python_bytes``, Python's own). A native
    write that failed raises past ``close``, which cannot tell; a file closed with fewer bytes than
    the same file in the golden run (``follow.Follower.match``) is reported ``short``."""

    def __init__(self, raw, rel: str, via: str):
        super().__init__()
        self._raw, self.rel, self.via = raw, rel, via
        self.written = 0
        self.failed = None  # the error a write met: the file is torn, whoever closes it
        # its size and names in the golden run, where the file it is there is known (a temporary name
        # followed to the one it was renamed to); ``golden``: that file's size, where it was found
        rank = probe._rank()
        self.planned, self.aliases, same = _s.follow.match("file", 0 if rank is None else rank, rel, _s.attempt)
        self.golden = self.planned if same else None
        self._base = self._size() if "a" in getattr(raw, "mode", "") else 0  # an append counts from here
        self._write_point, self._done_point = _kind(rel)
        self._next = self._boundary(0)
        _s.fds[raw.fileno()] = rel

    def _boundary(self, done: int) -> int:
        """The byte count of the next report: the next tenth of the plan (rounded up, so a report at
        tenth k has at least k/10 of the file), or the next MiB."""
        if self.planned:
            k = done * TENTHS // self.planned + 1
            return max(done + 1, -(-k * self.planned // TENTHS))
        return (done // CHUNK + 1) * CHUNK

    def writable(self):
        return True

    def readable(self):
        return False

    def seekable(self):
        return self._raw.seekable()

    def seek(self, offset, whence=io.SEEK_SET):
        return self._raw.seek(offset, whence)

    def tell(self):
        return self._raw.tell()

    def fileno(self):
        return self._raw.fileno()

    def flush(self):
        self._raw.flush()

    def _size(self) -> int | None:
        try:
            return os.fstat(self._raw.fileno()).st_size
        except (OSError, ValueError):
            return None

    def _info(self, size: int | None) -> dict:
        """A point's info: ``bytes``, what Python wrote, or where more, the bytes on disk (``size``,
        the descriptor's) with ``native``."""
        info = {"path": self.rel, "bytes": self.written, "via": self.via,
                **({"aliases": self.aliases} if self.aliases else {})}
        if size is not None and size - self._base > self.written:
            info.update(bytes=size - self._base, native=True, python_bytes=self.written)
        return info

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        total, pos = len(view), 0
        if self.planned is None and self.written == 0 and total >= WHOLE:
            # A file written in one call (a buffer serialized first, as Lightning does) is that call:
            # its tenths are the file's, whatever the file's name (a random temporary one) was in the plan.
            self.planned = total
            self._next = self._boundary(0)
        while pos < total:
            end = pos + min(total - pos, self._next - self.written)
            while pos < end:  # a write(2) may take part of it (a disk filling up): the rest, or its error
                try:
                    n = self._raw.write(view[pos:end])
                    if not n:
                        raise OSError(errno.EIO, f"a write of {end - pos} bytes wrote {n}")
                except OSError as e:
                    self.failed = e.strerror or repr(e)
                    raise
                pos += n
                self.written += n
            if self.written >= self._next:
                self._raw.flush()
                info = self._info(self._size())  # one fstat a tenth: bytes a native writer added count
                if self.planned:
                    info["fraction"] = round(min(1.0, info["bytes"] / self.planned), 4)
                _point(self._write_point, **info)
                self._next = self._boundary(self.written)
        return total

    def close(self):
        if self.closed:
            return
        size = None
        try:
            try:
                super().close()  # flushes the file
            finally:
                size = self._size()  # what native code wrote through the descriptor is on it
                _s.fds.pop(self._raw.fileno(), None)
                self._raw.close()
        except OSError as e:  # the flush or close(2) failed: Python saw it
            self.failed = self.failed or e.strerror or repr(e)
            self._done(size)
            raise
        self._done(size)

    def _done(self, size: int | None) -> None:
        info = self._info(size)
        if self.failed:
            info["failed"] = self.failed
        if self.golden and info["bytes"] < self.golden:
            info["short"] = True  # fewer bytes than the same file in the golden run: a write failed unseen
        _point(self._done_point, **info)


def _open(file, mode="r", buffering=-1, encoding=None, errors=None, newline=None, closefd=True, opener=None):
    # Only files opened to write and not to read: a read-write file keeps its own buffering.
    writes = isinstance(mode, str) and any(c in mode for c in "wax") and "+" not in mode
    rel = _watched(file) if writes and not _quiet() else None
    if rel is None:
        f = _orig["io.open"](file, mode, buffering, encoding, errors, newline, closefd, opener)
        if not writes and not _quiet() and isinstance(mode, str) and "+" not in mode:
            _read(file, f)
        return f
    binary = "b" in mode
    raw = _orig["io.open"](file, mode if binary else mode + "b", 0, None, None, None, closefd, opener)
    stream = _Watched(raw, rel, "open")
    if binary and buffering == 0:
        return stream
    buffered = io.BufferedWriter(stream, buffer_size=CHUNK if buffering in (-1, 1) else buffering)
    if binary:
        return buffered
    return io.TextIOWrapper(buffered, encoding=encoding, errors=errors, newline=newline,
                            line_buffering=buffering == 1)


def _read(file, f) -> None:
    """A checkpoint file opened to be read (``json.load``, ``pickle``, ``np.load``): what a resume
    read, whatever library it read with, where no load of a known framework says so."""
    rel = _watched(file)
    if rel is None:
        return
    try:
        size = os.fstat(f.fileno()).st_size
    except (OSError, ValueError, AttributeError):
        size = None
    _point("file.read", path=rel, size=size)


def _path_of_fd(fd) -> str | None:
    if not isinstance(fd, int):
        fd = fd.fileno() if hasattr(fd, "fileno") else None
    if fd is None:
        return None
    rel = _s.fds.get(fd)
    if rel is not None:
        return rel
    try:
        return _watched(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return None


def _fsync(fd):
    rel = None if _quiet() else _path_of_fd(fd)
    _orig["fsync"](fd)
    if rel is not None:
        _point("file.fsync", path=rel, call="fsync")


def _fdatasync(fd):
    rel = None if _quiet() else _path_of_fd(fd)
    _orig["fdatasync"](fd)
    if rel is not None:
        _point("file.fsync", path=rel, call="fdatasync")


def _renamer(which: str):
    def rename(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        rel_src, rel = (None, None) if _quiet() or src_dir_fd or dst_dir_fd else (_watched(src), _watched(dst))
        _orig[which](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        if rel is None and rel_src is None:
            return
        if rel is not None and os.path.basename(rel) == ".metadata":
            _point("ckpt.metadata", path=rel)
        _point("file.rename", path=rel or os.fsdecode(dst), src=rel_src or os.fsdecode(src), call=which)

    rename.__name__ = which
    return rename


def _remover(which: str):
    def remove(path, *, dir_fd=None):
        rel = None if _quiet() or dir_fd is not None else _watched(path)
        _orig[which](path, dir_fd=dir_fd)
        if rel is not None:
            _point("file.remove", path=rel, call=which)

    remove.__name__ = which
    return remove


def _rmtree(path, *args, **kwargs):
    rel = None if _quiet() else _watched(path)
    if rel is None:
        return _orig["rmtree"](path, *args, **kwargs)
    _point("file.rmtree", path=rel, stage="begin")
    with _Quiet():
        _orig["rmtree"](path, *args, **kwargs)
    _point("file.rmtree", path=rel, stage="end")


def _copyfile(src, dst, *, follow_symlinks=True):
    rel = None if _quiet() else _watched(dst)
    if rel is None:
        return _orig["copyfile"](src, dst, follow_symlinks=follow_symlinks)
    # In chunks through a watched stream (not the kernel's copy_file_range), so a fault can land mid-copy.
    with _Quiet():
        fsrc = _orig["io.open"](src, "rb")
        fdst = _Watched(_orig["io.open"](dst, "wb", 0), rel, "copy")
    with fsrc, fdst:
        while chunk := fsrc.read(CHUNK):
            fdst.write(chunk)
    _point("file.copy", path=rel, src=_watched(src) or os.fsdecode(src), bytes=fdst.written)
    return dst


def _patch_files() -> None:
    builtins.open = io.open = _open
    os.fsync = _fsync
    if _orig["fdatasync"] is not None:
        os.fdatasync = _fdatasync
    os.rename, os.replace = _renamer("rename"), _renamer("replace")
    os.remove, os.unlink = _remover("remove"), _remover("unlink")
    shutil.rmtree = _rmtree
    shutil.copyfile = _copyfile  # shutil.copy, copy2 and move (across file systems) call it
    _arm("files")


# ---- torch, patched when the trainer imports it ------------------------------------------------------

def _save_name(target) -> str:
    return os.path.basename(os.path.normpath(os.fsdecode(target))) if target is not None else "?"


def _patch_torch(torch) -> None:
    import torch.optim.optimizer as optimizer

    optimizer.register_optimizer_step_pre_hook(_before_step)
    optimizer.register_optimizer_step_post_hook(_after_step)
    _arm("torch.optim")

    backward = torch.autograd.backward

    def _backward(tensors, *args, **kwargs):
        out = backward(tensors, *args, **kwargs)
        _after_backward(tensors)
        return out

    torch.autograd.backward = _backward
    _arm("torch.autograd")

    save, load = torch.save, torch.load

    def _save(obj, f, *args, **kwargs):
        rel = None if _quiet() or not isinstance(f, (str, os.PathLike)) else _watched(f)
        if rel is None:
            return save(obj, f, *args, **kwargs)
        if not getattr(_s.local, "saving", 0):
            _staged()
            _point("ckpt.stage", name=_save_name(f), path=rel, via="torch.save")
        # Through a Python stream: torch writes a path itself, in C++, where no write can be seen.
        with _orig["io.open"](f, "wb", 0) as raw, _Watched(raw, rel, "torch.save") as stream:
            with _Quiet():
                return save(obj, stream, *args, **kwargs)

    def _load(f, *args, **kwargs):
        # a path, or an open file (Lightning opens it through fsspec): its name says where it is
        where = f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None) or getattr(f, "path", None)
        rel = None if _quiet() or not isinstance(where, (str, os.PathLike)) else _watched(where)
        if rel is None:
            return load(f, *args, **kwargs)
        _point("load.begin", name=_save_name(where), path=rel, via="torch.load")
        with _Quiet():
            out = load(f, *args, **kwargs)
        _point("load.end", name=_save_name(where), path=rel, via="torch.load")
        return out

    torch.save, torch.load = _save, _load
    _arm("torch.save")
    _arm("torch.load")

    import torch.utils.data.dataloader as dataloader

    base = dataloader._BaseDataLoaderIter
    next_index, next_ = base._next_index, base.__next__

    def _next_index(self):
        indices = next_index(self)
        self.__dict__.setdefault("_cc_indices", []).append(indices)
        return indices

    def __next__(self):
        batch = next_(self)
        pending = self.__dict__.get("_cc_indices")
        if pending:  # the batch the next backward trains on (a batch skipped on resume is replaced unseen)
            _s.batch = _ids(pending.pop(0))
            # for a wrapper that fetches ahead (Accelerate's): which batch of this iterator it was
            n = self.__dict__.get("_cc_fetched", 0)
            self.__dict__["_cc_fetched"] = n + 1
            self.__dict__.setdefault("_cc_recent", collections.deque(maxlen=4)).append((n, _s.batch))
            _s.last_iter = self
        return batch

    base._next_index, base.__next__ = _next_index, __next__
    _arm("torch.utils.data")


def _patch_dcp(dcp) -> None:
    save, async_save, load = dcp.save, getattr(dcp, "async_save", None), dcp.load

    def _id(args, kwargs):
        target = kwargs.get("checkpoint_id")
        writer = kwargs.get("storage_writer") or kwargs.get("storage_reader")
        if target is None and writer is not None:
            target = getattr(writer, "path", None)
        return target

    def _save(*args, **kwargs):
        target = _id(args, kwargs)
        _staged()
        _point("ckpt.stage", name=_save_name(target), path=_watched(target) if target else None, via="dcp.save")
        return save(*args, **kwargs)

    def _async_save(*args, **kwargs):
        target = _id(args, kwargs)
        _staged()
        _point("ckpt.stage", name=_save_name(target), path=_watched(target) if target else None,
               via="dcp.async_save")
        return async_save(*args, **kwargs)

    def _load(*args, **kwargs):
        target = _id(args, kwargs)
        info = {"name": _save_name(target), "path": _watched(target) if target else None, "via": "dcp.load"}
        _point("load.begin", **info)
        out = load(*args, **kwargs)
        _point("load.end", **info)
        return out

    dcp.save, dcp.load = _save, _load
    if async_save is not None:
        dcp.async_save = _async_save
    for sub in ("state_dict_saver", "state_dict_loader"):
        mod = sys.modules.get(f"{dcp.__name__}.{sub}")
        if mod is not None:
            for name, fn in (("save", _save), ("async_save", _async_save), ("load", _load)):
                if hasattr(mod, name) and (name != "async_save" or async_save is not None):
                    setattr(mod, name, fn)
    _arm("torch.distributed.checkpoint")


def _framework_save(cls, method: str, target_arg: str, via: str) -> None:
    """A framework's own save (one checkpoint, however many files): ``ckpt.stage`` with its name."""
    original = getattr(cls, method)

    def save(self, *args, **kwargs):
        target = kwargs.get(target_arg, args[0] if args else None)
        _staged()
        _point("ckpt.stage", name=_save_name(target), path=_watched(target) if target else None, via=via)
        _s.local.saving = getattr(_s.local, "saving", 0) + 1  # its torch.save calls are files of this save
        try:
            return original(self, *args, **kwargs)
        finally:
            _s.local.saving -= 1

    setattr(cls, method, save)


def _framework_load(cls, method: str, target_arg: str, via: str) -> None:
    original = getattr(cls, method)

    def load(self, *args, **kwargs):
        target = kwargs.get(target_arg, args[0] if args else None)
        info = {"name": _save_name(target), "path": _watched(target) if target else None, "via": via}
        _point("load.begin", **info)
        with _Quiet():  # its own torch.load calls are part of this load
            out = original(self, *args, **kwargs)
        _point("load.end", **info)
        return out

    setattr(cls, method, load)


def _patch_lightning(module) -> None:
    _framework_save(module.Trainer, "save_checkpoint", "filepath", "lightning")
    _arm("lightning")


def _patch_accelerate(module) -> None:
    _framework_save(module.Accelerator, "save_state", "output_dir", "accelerate")
    _framework_load(module.Accelerator, "load_state", "input_dir", "accelerate")
    import accelerate.data_loader as data_loader

    shard = data_loader.DataLoaderShard
    iterate = shard.__iter__

    def __iter__(self):
        # It fetches one batch ahead of the one it hands over, and drops skip_batches first: the
        # batch trained on is the (skip + k)-th its data loader iterator fetched, not the last.
        skip = getattr(self, "skip_batches", 0) or 0
        it = None
        for k, batch in enumerate(iterate(self)):
            it = it or _s.last_iter
            for n, ids in getattr(it, "_cc_recent", ()):
                if n == skip + k:
                    _s.batch = ids
                    break
            yield batch

    shard.__iter__ = __iter__
    _arm("accelerate")


def _patch_transformers(module) -> None:
    """Nothing to patch: transformers.Trainer saves through torch.save and safetensors' writer, which
    the file patches see; its release is checked (``_found``), as every patched framework's is."""


def _found(module) -> str | None:
    """Note the release of the framework ``module`` belongs to, the first time one of its modules is
    patched in this process, and whether the layer supports it (``versions.SUPPORTED``): the line
    goes to the trainer's log and, with the next ``probe.armed``, to the run's result. Never raises."""
    try:
        name, version = versions.of(module)
        if name is None or name in _s.versions:
            return versions.unsupported(name, _s.versions[name]) if name is not None else None
        _s.versions[name] = version
        why = versions.unsupported(name, version)
        if why:
            _s.unsupported.append(why)
            print(f"ckpt-chaos auto probe: {why}", file=sys.stderr, flush=True)
        return why
    except Exception:  # a version the layer cannot read is no reason to stop the trainer
        return None


_AFTER_IMPORT = {"torch": _patch_torch, "torch.distributed.checkpoint": _patch_dcp,
                 "lightning.pytorch.trainer.trainer": _patch_lightning,
                 "pytorch_lightning.trainer.trainer": _patch_lightning,
                 "accelerate.accelerator": _patch_accelerate,
                 "transformers": _patch_transformers}


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, then):
        self._loader, self._then = loader, then

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        why = _found(module)
        try:
            self._then(module)
        except Exception as e:  # a patch that does not take is reported by its absence, not a crash
            print(f"ckpt-chaos auto probe: patching {module.__name__} failed: {e!r}" + (f"; {why}" if why else ""),
                  file=sys.stderr, flush=True)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a patch right after one of ``_AFTER_IMPORT``'s modules executed, in whatever process
    imports it, so the layer itself never imports torch."""

    def find_spec(self, name, path, target=None):
        then = _AFTER_IMPORT.get(name)
        if then is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader, then)
                return spec
        return None


# ---- the recorder --------------------------------------------------------------------------------------

def _ids(indices):
    try:
        return [int(i) for i in indices]
    except TypeError:
        return int(indices) if isinstance(indices, int) else repr(indices)


def _rank() -> int:
    """This process's rank; once the process group tells it, it is kept (a hook runs every step)."""
    if _s.rank is not None and _s.rank_pid == os.getpid():
        return _s.rank
    rank = probe._rank()
    if rank is not None:
        _s.rank, _s.rank_pid = rank, os.getpid()
        return rank
    return int(os.environ.get("LOCAL_RANK", "0"))


def _optimizer_step(opt) -> int | None:
    """The optimizer's own step count (Adam and friends keep one per parameter)."""
    for group in opt.param_groups:
        for p in group["params"]:
            step = opt.state.get(p, {}).get("step")
            if step is not None:
                return int(step)
    return None


def _before_step(opt, args, kwargs) -> None:
    done = _optimizer_step(opt)
    if done is None:
        done = _s.step_of.get(id(opt), 0)
    if _rank() == 0 and _s.run_dir:
        # What the diagnosis compares after a resume: the state the step starts from (after a load,
        # the loaded one) against the golden run's before the same step (after its save). A save
        # no patch recognises (a native writer) still changes the checkpoint folders; digest_every
        # takes the whole state, RNG included, so a divergence narrows for any trainer.
        if _folders_changed() or (_s.digest_every and done % _s.digest_every == 0):
            _s.pre_digest = True
        if _s.pre_digest:
            _s.pre = {**_rng_digests(), **{f"pre_{k}": v for k, v in digests(opt).items()}}
            _s.pre_digest = False
    if "step.begin" in _s.step_points:
        _point("step.begin", step=done + 1)


def _folders_changed() -> bool:
    """Whether an entry of a watched folder, or of a folder in it, appeared, went or changed since
    the last step: a save happened, whoever wrote it. A few stat calls a step."""
    sig = []
    for d in _s.dirs:
        try:
            with os.scandir(d) as it:
                for e in it:
                    st = e.stat(follow_symlinks=False)
                    sig.append((e.path, st.st_mtime_ns, st.st_size))
        except OSError:
            sig.append((d, None, None))
    sig = tuple(sorted(sig))
    changed, _s.folders = _s.folders is not None and sig != _s.folders, sig
    return changed


def _after_step(opt, args, kwargs) -> None:
    if opt not in _s.optimizers:
        _s.optimizers.append(opt)
    step = _optimizer_step(opt)
    if step is None:
        step = _s.step_of.get(id(opt), 0) + 1
    _s.step_of[id(opt)] = step
    if _rank() == 0 and _s.run_dir:
        rec = {"step": step, "attempt": _s.attempt, "t": time.time(), "loss_hex": ",".join(_s.losses),
               "lr_hex": float(opt.param_groups[0]["lr"]).hex()}
        if _s.samples:
            rec["samples"] = _s.samples
        if _s.digest_every and step % _s.digest_every == 0:
            rec.update(digests(opt))
        rec.update(_s.pre)
        rec.update(_s.extra)
        _append("trajectory.jsonl", rec)
        _s.last = {"step": step, "optimizer": opt}
    _s.losses, _s.samples, _s.extra, _s.pre = [], [], {}, {}
    if "step.end" in _s.step_points:
        _point("step.end", step=step)


def _after_backward(tensors) -> None:
    if _s.run_dir and _rank() == 0:  # only rank 0 records
        t = tensors[0] if isinstance(tensors, (tuple, list)) and tensors else tensors
        try:
            if t.numel() == 1:
                _s.losses.append(float(t.item()).hex())  # exact for any float dtype
        except (AttributeError, RuntimeError):
            pass
    if _s.batch is not None:
        _s.samples.append(_s.batch)
        _s.batch = None
    if "microstep.end" in _s.step_points:
        _point("microstep.end", step=sum(_s.step_of.values()) + 1 if len(_s.step_of) <= 1 else None,
           micro=len(_s.losses))


def digests(opt) -> dict[str, str]:
    """SHA-256 of this process's parameters and optimizer state, in the optimizer's order: the
    local shards where the model is sharded. The tensors are hashed as one buffer each (a copy into
    one byte tensor costs less than a hash update per small tensor)."""
    import torch

    params, state, tags = [], [], []
    for group in opt.param_groups:
        for p in group["params"]:
            params.append(_flat_bytes(p))
            for key in sorted(opt.state.get(p, {})):
                value = opt.state[p][key]
                tags.append(key)
                if hasattr(value, "detach"):
                    state.append(_flat_bytes(value))
                else:
                    tags.append(repr(value))
    model = hashlib.sha256(torch.cat(params).numpy() if params else b"")
    optimizer = hashlib.sha256("\0".join(tags).encode())
    if state:
        optimizer.update(torch.cat(state).numpy())
    return {"model_digest": model.hexdigest()[:16], "optimizer_digest": optimizer.hexdigest()[:16]}


def _flat_bytes(t):
    import torch

    t = t.detach()
    if hasattr(t, "to_local"):  # a DTensor: this rank's shard
        t = t.to_local()
    return t.cpu().reshape(-1).contiguous().view(torch.uint8)


def _rng_digests() -> dict[str, str]:
    """The random streams a trainer draws from on the CPU: torch's, Python's and NumPy's (if imported)."""
    import random

    import torch

    out = {"pre_rng": hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()[:16],
           "pre_python_rng": hashlib.sha256(repr(random.getstate()).encode()).hexdigest()[:16]}
    np = sys.modules.get("numpy")
    if np is not None:
        out["pre_numpy_rng"] = hashlib.sha256(repr(np.random.get_state()).encode()).hexdigest()[:16]
    return out


def _staged() -> None:
    """A save starts: the state before the next step is digested (what a resume from it must restore)."""
    _s.pre_digest = True


def _append(name: str, rec: dict) -> None:
    """One JSON line, in one write(2) on a descriptor kept open (O_APPEND: a line a killed process
    wrote is whole, and the lines of several processes do not mix)."""
    key = (name, os.getpid())
    fd = _s.fds.get(key)
    if fd is None:
        fd = _s.fds[key] = os.open(os.path.join(_s.run_dir, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, (json.dumps(rec) + "\n").encode())


def _at_exit() -> None:
    if _s.last is not None and _rank() == 0:
        _append("events.jsonl", {"event": "exit", "step": _s.last["step"], **digests(_s.last["optimizer"])})


def record(**fields) -> None:
    """Add fields to the current step's record (``step=`` numbers the step where the optimizer
    cannot); a no-op outside the harness."""
    if _s.installed:
        _s.extra.update(fields)


# ---- installation --------------------------------------------------------------------------------------

def install(ahead: bool = False) -> None:
    """Arm the layer in this process (idempotent). Does nothing without a controller address, unless
    ``ahead``: a launcher's warm agent patches before its imports, as an interpreter's start would,
    and each rank forked from it reads its launch's settings with ``configure``."""
    if _s.installed or not (ahead or os.environ.get(probe.ENV_CONTROLLER)):
        return
    _s.installed = True
    configure()
    _patch_files()
    for name, then in _AFTER_IMPORT.items():
        if name in sys.modules:
            _found(sys.modules[name])
            then(sys.modules[name])
    sys.meta_path.insert(0, _AfterImport())
    import atexit

    atexit.register(_at_exit)


def configure() -> None:
    """Read the launch's settings from the environment: where to report, what to watch, the plan."""
    _s.pid = os.getpid()
    _s.dirs = tuple(os.path.abspath(d) for d in os.environ.get(ENV_DIRS, "").split(os.pathsep) if d)
    _s.run_dir = os.path.abspath(os.environ[ENV_RUN_DIR]) if os.environ.get(ENV_RUN_DIR) else ""
    _s.digest_every = int(os.environ.get(ENV_DIGEST_EVERY, "0") or 0)
    _s.step_points = (frozenset(p for p in os.environ[ENV_STEP_POINTS].split(",") if p)
                      if ENV_STEP_POINTS in os.environ else frozenset(STEP_POINTS))
    _s.attempt = int(os.environ.get(probe.ENV_ATTEMPT, "0")) + int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    planned = os.environ.get(ENV_PLANNED)
    if planned and os.path.isfile(planned):
        with _orig["open"](planned) as f:
            _s.follow = follow.Follower(json.load(f))


# ---- the harness's side ----------------------------------------------------------------------------------

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")


def environment(controller: str, run_dir, watch, planned=None, digest_every: int = 0,
                pythonpath: str | None = None, step_points=None) -> dict[str, str]:
    """The variables that arm the layer in every Python process of a job: ``watch``, the directories
    whose files are reported (the checkpoint directory, the trainer's temporary folders); ``planned``,
    a JSON file of file sizes from the golden run; ``pythonpath``, the job's own, put after ours;
    ``step_points``, the per-step points the controller needs (default: all)."""
    rest = os.environ.get("PYTHONPATH", "") if pythonpath is None else pythonpath
    return {probe.ENV_CONTROLLER: controller, ENV_RUN_DIR: os.fspath(run_dir),
            ENV_DIRS: os.pathsep.join(os.fspath(w) for w in watch),
            **({ENV_PLANNED: os.fspath(planned)} if planned else {}),
            ENV_DIGEST_EVERY: str(digest_every),
            **({ENV_STEP_POINTS: ",".join(sorted(step_points))} if step_points is not None else {}),
            "PYTHONPATH": os.pathsep.join(p for p in (SITE_DIR, rest) if p)}


def planned_sizes(events) -> dict[str, int]:
    """File sizes from a run's ``file.done`` / ``ckpt.shard.done`` / ``faultfs.done`` events, under each
    name a file had (a temporary name, then the one it was renamed to): ``follow.plan``'s ``sizes``."""
    return follow.plan(events)["sizes"]


planned_size = follow.planned_size  # by exact path, else by a glob key that matches it
