"""The deletion pass after hypothesis's shrink: one run removes a whole fault, where the shrinker spends
most of its candidates on the values inside the steps."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, TypeVar

from ckpt_chaos.faults import lookup

if TYPE_CHECKING:
    from ckpt_chaos.scenario import Fault

A = TypeVar("A")


def _rule_says(kind: str, fact: str) -> bool:
    rule = lookup(kind).search
    return bool(rule and getattr(rule, fact))


def _without(faults: list[Fault], i: int) -> list[Fault]:
    """The schedule without fault ``i`` and the faults its kind's rule adds with it (a corrupt with its
    crash, a toxic with its heal), later launches renumbered."""
    drop = {i}
    if i + 1 < len(faults) and _rule_says(faults[i].kind, "with_next"):
        drop.add(i + 1)
    if i > 0 and _rule_says(faults[i - 1].kind, "with_next"):
        drop.add(i - 1)
    launch = faults[i].attempt
    ends = any(faults[j].ends_launch for j in drop)
    out = []
    for j, g in enumerate(faults):
        if j not in drop:
            g = dataclasses.replace(g, when=dataclasses.replace(g.when), params=dataclasses.replace(g.params))
            if ends and g.attempt > launch:
                g.attempt -= 1
            out.append(g)
    return out


def _deletion_order(faults: list[Fault]) -> list[int]:
    """Which fault the deletion pass tries to drop first: those their rule says to (hangs: 15 s of
    collective timeout in every run that keeps one, and rarely the cause), then the latest first."""
    return sorted(range(len(faults)), key=lambda i: (not _rule_says(faults[i].kind, "drop_first"), -i))


def reduce(faults: list[Fault], world_after: int | None, attempt: A,
           fails: Callable[[list[Fault], int | None], A | None],
           time_left: Callable[[], bool]) -> tuple[list[Fault], int | None, A]:
    """Drop the resize (if any), then one fault at a time (``_deletion_order``), keeping each removal
    after which the schedule still fails the same way (``fails``: its attempt, else None), until no
    single fault can go or ``time_left`` says no."""
    if world_after is not None and time_left() and (a := fails(faults, None)):
        world_after, attempt = None, a
    smaller_found = True
    while smaller_found and time_left():
        smaller_found = False
        for i in _deletion_order(faults):
            if not time_left():
                break
            smaller = _without(faults, i)
            if a := fails(smaller, world_after):
                faults, attempt, smaller_found = smaller, a, True
                break  # indices moved: start over (schedules already run are answered from the cache)
    return faults, world_after, attempt
