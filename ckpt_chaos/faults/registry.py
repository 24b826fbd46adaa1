"""The fault kinds by name, for the scenario model and everything above it.

This module sits below the scenario model, and the kinds' own modules above it (they read scenarios
and type their checks with it), so the model looks kinds up here, in a table it never fills:
``ckpt_chaos/faults/__init__.py`` fills it with every family's kinds. Python runs a package's
``__init__`` before any module in it, this one included, so the table is full whenever this module
can be imported.
"""

from __future__ import annotations

from typing import Any

KINDS: dict[str, Any] = {}  # name -> its FaultKind (ckpt_chaos/faults/kind.py), in family order
# the kinds' parameters' sets of values (each a ``Literal``) -> what a value of it is called in the
# scenario loader's messages, from each family module's ``CHOICES``
CHOICE_NAMES: dict[Any, str] = {}


class Invalid(Exception):
    """A fault that cannot run. ``key`` is relative to the fault (``call``, ``when.point``), or to the
    scenario with ``top``; the scenario loader adds the file and ``faults[i].``."""

    def __init__(self, key: str, problem: str, fix: str, top: bool = False):
        super().__init__(f"{key}: {problem}; {fix}")
        self.key, self.problem, self.fix, self.top = key, problem, fix, top


def lookup(kind: str) -> Any:
    """The FaultKind named ``kind``; an unknown name raises a ValueError listing the kinds there are."""
    try:
        return KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown fault kind {kind!r}; allowed kinds: {', '.join(KINDS)}") from None


def families() -> list[str]:
    return sorted({k.family for k in KINDS.values()})
