"""The model of a fault schedule: the families the search composes, where a fault strikes as the
search counts what it has tried, and the scenario a schedule runs as.

The kinds' own rules, and the job and points they are written against, are the faults package's
(``ckpt_chaos/faults/search_rules.py``): this module and the state machine (``machine.py``) ask
them, never a kind's name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

from ckpt_chaos.faults import KINDS as KINDS_BY_NAME, FaultKind, lookup
from ckpt_chaos.faults.search_rules import (CORRUPT_FILES, DISK_FULL_PLACES, ERRNO_SITES, RANK0_POINTS,
                                            RECOVERY_POINTS, SAVE_POINTS, STEP_POINTS, TRAINER, WORLD_SIZE, Rule,
                                            errno_site, position, save_step)
from ckpt_chaos.scenario import Expect, Fault, Recovery, Remote, Scenario, Storage, validate

__all__ = ["CORRUPT_FILES", "DISK_FULL_PLACES", "ERRNO_SITES", "RANK0_POINTS", "RECOVERY_POINTS", "SAVE_POINTS",
           "STEP_POINTS", "TRAINER", "WORLD_SIZE", "errno_site", "position", "save_step"]

MAX_LAUNCHES = 2  # launch-ending faults per schedule: each relaunch costs 2-4 s on 2 cores, a hang 8 s more
# Not a fault: every relaunch comes back on fewer ranks (a node lost for good). A family of the search's
# own, off by default: the trajectory is then compared within a tolerance, and the default search stays
# as it was.
TOPOLOGY = "topology"
# The families a search composes unless told otherwise. node/network (docker, netns) cost seconds to
# minutes of set-up per run, and have no rules; remote (moto, toxiproxy: ~2 s more per run) and
# topology are off by default.
DEFAULT_FAMILIES = ("process", "storage")


def rules() -> list[tuple[FaultKind, Rule]]:
    """Every rule of every kind that has one, with its kind, in the registry's order."""
    return [(kind, r) for kind in KINDS_BY_NAME.values() if kind.search for r in kind.search.rules]


def _families() -> dict[str, tuple[str, ...]]:
    by_family: dict[str, list[str]] = {}
    for _, r in rules():
        by_family.setdefault(r.family, []).append(r.name)
    order = [*DEFAULT_FAMILIES, TOPOLOGY, *by_family]
    return {f: tuple(by_family.get(f, ("resize",) if f == TOPOLOGY else ())) for f in dict.fromkeys(order)}


# The searchable families (``--families``) and the rules of each.
KINDS: dict[str, tuple[str, ...]] = _families()


def account(kind: FaultKind) -> str:
    """The account under which the search counts the places a fault of ``kind`` has tried: faults that
    end a process where it stands (a kill; a stop, which the peers' timeout turns into a kill; a power
    cut) leave the disk as it was at that point, so they share one (``FaultKind.crashes``)."""
    return "crash" if kind.crashes else kind.name


def where(f: Fault) -> tuple[str, str]:
    """Where a fault strikes, as the search counts what it has tried: its account, and its probe point,
    or what its kind's rule says (an errno's call and point, a corrupted file)."""
    kind = lookup(f.kind)
    if kind.search and kind.search.where and (place := kind.search.where(f)):
        return place
    return account(kind), f.when.point


def tries(faults: list[Fault]) -> set[tuple]:
    """What a schedule tries that another may already have: where each fault strikes (``where``, in the
    first launch or a relaunch), and each pair of consecutive faults (so that combinations count)."""
    one = [(*where(f), f.attempt > 0) for f in faults]
    return set(one) | set(zip(one, one[1:]))


def expected(faults: list[Fault]) -> Expect:
    """What a correct trainer guarantees under any of these schedules (``explore``'s docstring)."""
    interval = TRAINER["ckpt_every_steps"]
    # A fault that may fail saves or lose committed checkpoints leaves the work lost unbounded by one interval.
    lost = TRAINER["max_steps"] if any(f.spec.fails_saves or f.spec.damages or f.spec.loses_disk
                                       for f in faults) else interval
    return Expect(trajectory="bit-exact", max_lost_steps=lost, deadline_s=300.0)


def _on_world(f: Fault, world: int) -> Fault:
    """A fault of a relaunch at a smaller world size, aimed at ranks that still exist there."""
    if world >= WORLD_SIZE or f.attempt == 0:
        return f
    f = dataclasses.replace(f, when=dataclasses.replace(f.when), params=dataclasses.replace(f.params))
    if f.when.rank is not None and f.when.rank >= world:
        f.when.rank = world - 1
    if f.target.startswith(("rank:", "ranks:")):
        f.target = "all" if f.target.startswith("ranks:") else f"rank:{min(int(f.target[5:]), world - 1)}"
    if hasattr(f.params, "path"):
        f.params.path = re.sub(r"__(\d+)_0", lambda m: f"__{min(int(m.group(1)), world - 1)}_0", f.params.path)
    return f


def _declare_order(s: Scenario) -> None:
    """A schedule whose faults would race (fire on different processes' events, ``ckpt_chaos/order.py``)
    gets the order of its story: each fault of a launch waits for the one before it in training's order
    (``position``; an upload's points after its save's), faults at no known place in the order drawn.
    So the verdict does not depend on which process is quicker, and no fault waits for a point that
    only comes after its own."""
    from ckpt_chaos import order

    if not order.races(s):
        return
    late = len(STEP_POINTS) + len(SAVE_POINTS)

    def place(k: int, before: tuple[int, int]) -> tuple[int, int]:
        t = s.faults[k].when
        at = position(t)
        if at is None and save_step(t) is not None:  # the uploader's: after its checkpoint was committed
            at = (save_step(t), late)
        return before if at is None else at

    by_launch: dict[int, list[tuple[tuple[int, int], int]]] = {}
    for k, f in enumerate(s.faults):
        chain = by_launch.setdefault(f.attempt, [])
        chain.append((place(k, chain[-1][0] if chain else (0, -late)), k))
    for chain in by_launch.values():
        chain.sort()
        for (_, prev), (_, k) in zip([(None, None)] + chain, chain):
            # a fresh trigger each: faults of one event may share theirs
            s.faults[k].when = dataclasses.replace(s.faults[k].when, after=prev)


def build(faults: list[Fault], trainer_module: str, name: str | None = None, description: str = "",
          suites: tuple[str, ...] = ("explore",), world_after: int | None = None) -> Scenario:
    """The scenario of a schedule; its name is a hash of its content, so a schedule has one name.

    ``world_after``: the relaunches run at this world size (the topology family); faults of the
    relaunches are aimed at the ranks that exist there, and the trajectory is compared within the
    catalogue's tolerance, as bit-exactness across a world-size change is not promised (README)."""
    launches = max((f.attempt for f in faults), default=0) + 1
    if launches == 1:
        world_after = None  # no relaunch planned: nothing to resize, and the trajectory stays bit-exact
    if world_after is not None:
        faults = [_on_world(f, world_after) for f in faults]
    remote = any(f.family == "remote" or f.target == "uploader" for f in faults)
    s = Scenario(name="explore", faults=list(faults), description=description, tags=["explore"],
                 suites=list(suites), world_size=WORLD_SIZE, trainer_module=trainer_module,
                 # with uploads, steps slow enough that an upload is under way when a fault aims at it
                 trainer={**TRAINER, "step_delay_s": 0.2} if remote else dict(TRAINER),
                 remote=Remote() if remote else None,
                 storage=Storage(fs="tmpfs", size_mb=16) if any("sized_fs" in f.needs for f in faults) else Storage(),
                 # one spare relaunch: a storage fault may end a launch the story meant to go on
                 recovery=Recovery(relaunch="harness", max_restarts=launches, world_size=world_after),
                 expect=expected(faults))
    if world_after is not None and world_after != WORLD_SIZE:
        s.expect.trajectory = "tolerance"
    _declare_order(s)
    if name is None:
        digest = hashlib.sha256(s.to_toml().encode()).hexdigest()[:10]
        name = f"explore-{digest}"
    s.name = name
    validate(s)
    return s
