"""The framework releases the automatic probe layer supports, and the check of the one it finds.

The layer patches torch, DCP, Lightning, Accelerate and transformers where they are imported in the
trainer's processes, which run on the project's own releases, not on any the harness installed.
``SUPPORTED`` says, for each, the range the layer is tested with (``make compat`` runs a second
torch release nightly; docs/usage.md has the table of versions tested). A release outside it is not
refused: the layer patches it all the same, says so in its ``probe.armed`` point (``unsupported``,
one line each), and the run's result carries the line (the ``probe_versions`` check, a warning),
so a patch that then misses a point is not a mystery.

Imported in every process of a job under test: the standard library only, and no framework import.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys

# framework -> (lowest release supported, first release not supported): ``lo <= version < hi``.
# Lightning, Accelerate and transformers: the ranges of the ``examples`` extra in pyproject.toml.
SUPPORTED: dict[str, tuple[str, str]] = {
    "torch": ("2.13", "2.15"),  # torch.optim hooks, torch.save/load, the data loader's iterator, DCP
    "lightning": ("2.6", "3"),  # Trainer.save_checkpoint (lightning.pytorch and pytorch_lightning)
    "accelerate": ("1.15", "2"),  # Accelerator.save_state/load_state, DataLoaderShard.__iter__
    "transformers": ("5.24", "6"),  # Trainer saves through torch.save and safetensors (the file patches)
}

# top-level module -> the framework (and distribution) it is a release of
MODULES = {"torch": "torch", "lightning": "lightning", "pytorch_lightning": "lightning",
           "accelerate": "accelerate", "transformers": "transformers"}


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: ``2.14.1+cu128`` -> (2, 14, 1); () where none."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(version))
    return tuple(int(p) for p in m.group(1).split(".")) if m else ()


def supported(name: str) -> str:
    """The range as a requirement specifier: ``>=2.13,<2.15``."""
    lo, hi = SUPPORTED[name]
    return f">={lo},<{hi}"


def unsupported(name: str, version: str | None) -> str | None:
    """None when ``version`` of framework ``name`` lies in its range (or the framework has none),
    else the line that says so."""
    if name not in SUPPORTED:
        return None
    lo, hi = SUPPORTED[name]
    got = release(version or "")
    if got and release(lo) <= got < release(hi):
        return None
    return (f"{name} {version or '(version unknown)'} is outside the releases the probe layer supports "
            f"({name}{supported(name)}): its points and records may be missing or wrong")


def of(module) -> tuple[str | None, str | None]:
    """(framework, version) of the framework a module (``torch``, ``lightning.pytorch.trainer.trainer``)
    belongs to, or (None, None). The version is the top-level package's ``__version__`` (set before its
    submodules are imported), else its distribution's metadata."""
    top = getattr(module, "__name__", "").split(".")[0]
    name = MODULES.get(top)
    if name is None:
        return None, None
    package = module if module.__name__ == top else sys.modules.get(top)
    version = getattr(package, "__version__", None)
    if version is None:
        try:
            version = importlib.metadata.version(top.replace("_", "-"))
        except (importlib.metadata.PackageNotFoundError, ValueError):
            version = None
    return name, None if version is None else str(version)
