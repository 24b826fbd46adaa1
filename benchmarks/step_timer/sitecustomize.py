"""Times every optimizer step of the process it loads into, the same way with and without the
probe layer (``benchmarks/probe_layer.py`` puts this folder on PYTHONPATH in both arms): a global
step post-hook takes ``perf_counter_ns``, and at exit the times go to
``$CKPT_CHAOS_STEP_TIMES/<pid>.json``. Torch is hooked when the trainer imports it, not before."""

import atexit
import importlib.abc
import json
import os
import sys
import time

_OUT = os.environ.get("CKPT_CHAOS_STEP_TIMES")
_times: list[int] = []


def _hook(module) -> None:
    module.register_optimizer_step_post_hook(lambda opt, args, kwargs: _times.append(time.perf_counter_ns()))


class _Loader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _hook(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch.optim.optimizer":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


def _dump() -> None:
    if _times:
        with open(os.path.join(_OUT, f"{os.getpid()}.json"), "w") as f:
            json.dump({"rank": os.environ.get("RANK", os.environ.get("LOCAL_RANK")), "ns": _times}, f)


if _OUT:
    if "torch.optim.optimizer" in sys.modules:
        _hook(sys.modules["torch.optim.optimizer"])
    else:
        sys.meta_path.insert(0, _Finder())
    atexit.register(_dump)
