"""What a trainer that reports through ``ckpt_chaos.probe`` declares of itself, for the scenario loader
and the judge: its configuration fields (and which a resume must refuse to change), how a configuration
is validated, the retention it promises, whether its checkpoints carry the reference layout's manifest.

A trainer declares its profile as ``CKPT_CHAOS_PROFILE`` in its module's package, or in a package
above it (``reference_trainer/__init__.py``; ``tests/planted/__init__.py`` for the planted copies of
the reference trainer); the harness finds it from the scenario's ``trainer_module`` and never names a
trainer itself. A ``[command]`` trainer declares what it promises in its scenario's ``[command]`` table
instead.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Mapping

ATTRIBUTE = "CKPT_CHAOS_PROFILE"


@dataclass(frozen=True)
class Retention:
    """What the trainer's retention keeps: the last ``keep_last`` valid checkpoints, those whose step is a
    multiple of ``keep_every`` (whole steps only), and the one with the lowest loss (``keep_best``)."""

    keep_last: int
    keep_every: int = 0
    keep_best: bool = False


@dataclass(frozen=True)
class TrainerProfile:
    """A probed trainer's declaration."""

    fields: Mapping[str, bool]
    """Every configuration field (a scenario's ``[trainer]`` key) -> whether a resume must refuse a
    change of it (it shapes the trajectory) rather than take it."""
    defaults: Mapping[str, Any]
    """The value each field has when a scenario does not set it."""
    validate: Callable[[dict[str, Any], int], None]
    """Raises ``ValueError`` (naming the field) for a whole configuration that cannot train at a world size."""
    retention: Callable[[dict[str, Any]], Retention | None]
    """The retention a configuration (defaults filled in) promises; None for none."""
    reserved: Mapping[str, str] = field(default_factory=dict)
    """Fields the harness sets itself -> why a scenario may not."""
    manifest: bool = False
    """Its checkpoints carry the reference layout's manifest (``ckpt_chaos.probe.layout``): tokens seen and
    world size, which ``manifest_facts`` holds to the run."""
    resize_rng: str = "keep"
    """Whose random streams each rank goes on with after a resume at another world size (``RESIZE_RNG``):
    ``keep``, a rank that was there before its own saved stream and a new rank a fresh one; ``reseed``,
    every rank a fresh one; ``shared``, every rank the one stream the saved ranks shared. A fresh stream
    is never a copy of a saved rank's or of another rank's."""


RESIZE_RNG = ("keep", "reseed", "shared")


def profile_of(s: Any) -> TrainerProfile | None:
    """The profile a scenario's trainer declares (``s``: a ``Scenario``, which imports this module); None
    for a ``[command]`` trainer or one that declares none."""
    return None if s.command is not None else find(s.trainer_module)


@lru_cache(maxsize=None)
def find(module: str) -> TrainerProfile | None:
    """``CKPT_CHAOS_PROFILE`` of the nearest package holding ``module`` (the module itself if it is a
    package); a plain module is not imported, so a trainer's code does not run in the harness."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        if spec is None or spec.submodule_search_locations is None:
            continue
        found = getattr(importlib.import_module(name), ATTRIBUTE, None)
        if found is not None:
            return found
    return None
