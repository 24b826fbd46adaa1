"""The automatic probe layer's patches of torch, DCP and the frameworks (Lightning, Accelerate,
transformers), applied by an import hook right after the trainer imports each, so that the layer
itself never imports torch; and the check of each framework's release (``probe/versions.py``)."""

from __future__ import annotations

import collections
import importlib.abc
import os
import sys

from ckpt_chaos.probe import versions
from ckpt_chaos.probe.auto_files import _Watched
from ckpt_chaos.probe.auto_recorder import _after_backward, _after_step, _before_step, _ids, _staged
from ckpt_chaos.probe.auto_state import _arm, _orig, _point, _Quiet, _quiet, _s, _watched


def _save_name(target) -> str:
    return os.path.basename(os.path.normpath(os.fsdecode(target))) if target is not None else "?"


class _failed_load:
    """A load that raised ends with ``load.end`` saying so (``failed``), as ``file.done`` does for a
    write that failed: a trainer that tries the newest checkpoint and falls back on an error resumed
    from the load that ended without one."""

    def __init__(self, info: dict):
        self.info = info

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if e is not None and isinstance(e, Exception):
            _point("load.end", **self.info, failed=f"{kind.__name__}: {e}"[:300])
        return False


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
        info = {"name": _save_name(where), "path": rel, "via": "torch.load"}
        _point("load.begin", **info)
        with _Quiet(), _failed_load(info):
            out = load(f, *args, **kwargs)
        _point("load.end", **info)
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
        with _failed_load(info):
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
        with _Quiet(), _failed_load(info):  # its own torch.load calls are part of this load
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
