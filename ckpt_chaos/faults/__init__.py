"""The fault kinds, each defined once in its family's module, and the registry the rest looks them up in.

A family module (``process``, ``storage``, ``cluster``, ``remote``, ``slurm``) holds, for each of its kinds, one
``FaultKind``: its name, its one-line meaning, its parameters (a small dataclass: one field per
TOML key, with its default; a key with a fixed set of values is a ``Literal``, named in the
module's ``CHOICES``, which the scenario loader checks), its validation, the nemesis method that
injects it, its ``Effects`` (the facts the checks and the search go by: does it end the launch,
may it fail saves...), its colour in the plots, and, where a kind has one, the check of its effect. Its nemesis (one class per module)
acts for every kind of the module with one protocol: ``new_launch``, ``fire``, ``lift`` (a heal
fault, mid-run) and ``heal`` (the end of a launch; always a dict). ``Nemeses`` composes them for a
run, as Jepsen's ``nemesis/combined`` composes its packages.

Adding a kind is one ``FaultKind`` (and its method) in its family's module, or a new module of this
package: every module here whose ``KINDS`` is a tuple of ``FaultKind`` is found (``pkgutil``) and
its kinds registered, in the order of the modules' ``ORDER`` (a module without one comes after
those that have one, by name). A kind carries its nemesis, its search rule, its coverage rule and
its colour, so nothing outside its module names it.

``kind.py`` says what a kind and a nemesis are; ``registry.py`` holds the kinds by name for the
scenario model, which sits below the family modules, and this package fills it.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from ckpt_chaos.faults.kind import AMPLE_S, FaultKind, Launch, Nemesis, NoParams, Setting
from ckpt_chaos.faults.registry import CHOICE_NAMES, KINDS, Invalid, families, lookup
from ckpt_chaos.faults.targets import target_ranks

if TYPE_CHECKING:
    from ckpt_chaos.scenario import Fault, Scenario

__all__ = ["AMPLE_S", "KINDS", "FaultKind", "Invalid", "Launch", "Nemeses", "Nemesis", "NoParams", "Setting",
           "families", "kind_modules", "lookup", "nemesis_classes", "register", "requirements", "target_ranks"]


def kind_modules(package: ModuleType | None = None) -> list[ModuleType]:
    """The modules of ``package`` (this one by default) that define fault kinds: a ``KINDS`` tuple of
    ``FaultKind``, in the order of their ``ORDER``, then by name. Each is imported; ``register``
    adds their kinds to the registry."""
    package = package or sys.modules[__name__]
    found = []
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        kinds = getattr(module, "KINDS", None)
        if isinstance(kinds, tuple) and kinds and all(isinstance(k, FaultKind) for k in kinds):
            found.append(module)
    return sorted(found, key=lambda m: (getattr(m, "ORDER", float("inf")), m.__name__))


def register(modules: list[ModuleType]) -> None:
    """Add the kinds of ``modules`` to the registry, and the names of their parameters' choices (a
    module's ``CHOICES``); a kind defined twice is an error, not a shadow."""
    for module in modules:
        CHOICE_NAMES.update(getattr(module, "CHOICES", {}))
        for k in module.KINDS:
            if k.name in KINDS and KINDS[k.name] is not k:
                raise ValueError(f"fault kind {k.name!r} is defined in {module.__name__} and elsewhere")
            KINDS[k.name] = k


register(kind_modules())


class Nemeses:
    """Every family's nemesis for one run, behind one ``fire`` / ``new_launch`` / ``heal``."""

    def __init__(self, setting: Setting):
        self.members: dict[type, Nemesis] = {cls: cls(setting) for cls in nemesis_classes()}

    def __getitem__(self, cls: type[Nemesis]) -> Nemesis:
        return self.members[cls]

    def new_launch(self, launch: Launch) -> None:
        for n in self.members.values():
            n.new_launch(launch)

    def fire(self, fault: Fault, event: dict) -> tuple[dict | None, dict]:
        spec = lookup(fault.kind)
        if spec.heals:
            record: dict = {}
            for n in self.members.values():
                record.update(n.lift())
            return None, record
        return self.members[spec.nemesis].fire(fault, event)

    def heal(self) -> dict:
        out: dict = {}
        for n in self.members.values():
            out.update(n.heal())
        return out


def nemesis_classes() -> list[type[Nemesis]]:
    return list(dict.fromkeys(k.nemesis for k in KINDS.values() if k.nemesis is not None))


def requirements(s: Scenario) -> str | None:
    """Why this machine cannot run the scenario's faults (None: it can), as the first family that
    lacks something says it."""
    for cls in nemesis_classes():
        why = cls.missing(s)
        if why:
            return why
    return None

