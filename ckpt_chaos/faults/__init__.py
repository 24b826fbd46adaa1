"""The fault kinds, each defined once in its family's module, and the registry the rest looks them up in.

A family module (``process``, ``storage``, ``cluster``, ``remote``, ``slurm``) holds, for each of its kinds, one
``FaultKind``: its name, its one-line meaning, its parameters (a small dataclass: one field per
TOML key, with its default), its validation, the nemesis method that injects it, the facts the
checks and the search go by (does it end the launch, may it fail saves...), its colour in the
plots, and, where a kind has one, the check of its effect. Its nemesis (one class per module)
acts for every kind of the module with one protocol: ``new_launch``, ``fire``, ``lift`` (a heal
fault, mid-run) and ``heal`` (the end of a launch; always a dict). ``Nemeses`` composes them for a
run, as Jepsen's ``nemesis/combined`` composes its packages.

Adding a kind is one ``FaultKind`` (and its method) in its family's module.

``kind.py`` says what a kind and a nemesis are; ``registry.py`` holds the kinds by name for the
scenario model, which sits below the family modules, and this package fills it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckpt_chaos.faults import cluster, process, remote, slurm, storage
from ckpt_chaos.faults.kind import AMPLE_S, FaultKind, Launch, Nemesis, NoParams, Setting
from ckpt_chaos.faults.registry import KINDS, Invalid, families, lookup
from ckpt_chaos.faults.targets import target_ranks

if TYPE_CHECKING:
    from ckpt_chaos.scenario import Fault, Scenario

__all__ = ["AMPLE_S", "KINDS", "FaultKind", "Invalid", "Launch", "Nemeses", "Nemesis", "NoParams", "Setting",
           "families", "lookup", "nemesis_classes", "requirements", "target_ranks"]

KINDS.update({k.name: k for m in (process, cluster, storage, remote, slurm) for k in m.KINDS})


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

