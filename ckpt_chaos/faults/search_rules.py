"""How the fault-schedule search (``ckpt_chaos/search/``) schedules a kind: the ``SearchRule`` that a
``FaultKind`` carries in its ``search`` field, the rules of the kinds the search composes, and what
they are written against.

The search goes over the registry's kinds and builds its state machine from their rules: one
hypothesis rule per ``Rule``, which draws the rule's arguments and calls its ``add`` with the
schedule being built (a ``Story``) and what it drew. A kind without a ``SearchRule`` is never
scheduled. What else the search must know of a kind (where it strikes, which fault comes with it,
what the shrink drops first) is a field of its rule, never a test of its name.

The family modules' rules sit together here, because they are written against one story and one
small job (``WORLD_SIZE``, ``TRAINER``) and read best side by side; a kind in a module of its own
builds its rule there from ``Rule``, ``SearchRule`` and the points and sites below, so that adding
it edits no other module. This module is
below the search (the faults package never imports ``ckpt_chaos.search``) and imports nothing but the
probe's list of points: hypothesis is an optional extra, so a rule's arguments are plain values (a
``range`` draws an integer in it, a tuple one of its values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

from ckpt_chaos.probe import POINTS

if TYPE_CHECKING:
    from ckpt_chaos.scenario import Fault, Trigger

# A small job: 2 ranks, 8 steps, a checkpoint every 2 steps (4 saves); a launch from a warm launcher
# agent takes 2-4 s on a 2-core machine. A stopped rank is found when its peer's collective times
# out: 8 s is several times the longest wait of a run without a hang (a first step or a load, under
# 1 s; a save slowed by a `slow` fault, under 2 s) and halves what a hang costs against the
# catalogue's 15 s. The search runs alone, so no other job's load stretches those waits.
WORLD_SIZE = 2
TRAINER = {"max_steps": 8, "ckpt_every_steps": 2, "dataset_size": 96, "global_batch": 16, "grad_accum": 2,
           "collective_timeout_s": 8}


def _span(first: str, last: str) -> tuple[str, ...]:
    """The probe's points from ``first`` to ``last``, in the order a launch reaches them."""
    return POINTS[POINTS.index(first):POINTS.index(last) + 1]


# The reference trainer's points, by where they come in a launch: a relaunch recovers, then each step
# runs, and every ckpt_every_steps steps a save follows the step.
RECOVERY_POINTS = _span("train.start", "load.end")
STEP_POINTS = _span("step.begin", "step.end")
SAVE_POINTS = _span("ckpt.stage", "ckpt.retention")
# From .metadata on (written by DCP's coordinator), the save goes on in rank 0 alone.
RANK0_POINTS = _span("ckpt.metadata", "ckpt.retention")

# errno sites the reference trainer's save goes through (call, path glob, target, trigger point),
# the ones the storage catalogue exercises; {r} is the rank whose shard it is.
ERRNO_SITES = (
    ("write", ".tmp-*/__{r}_0.distcp", "rank:{r}", "ckpt.stage"),
    ("fsync", ".tmp-*/__{r}_0.distcp", "rank:{r}", "ckpt.stage"),
    ("open", ".tmp-*/.metadata*", "all", "ckpt.shard.done"),
    ("rename", ".tmp-step_*", "rank:0", "ckpt.manifest"),
    ("open", "latest.tmp", "rank:0", "ckpt.commit"),
)
DISK_FULL_PLACES = ("ckpt.stage", "ckpt.shard.write", "step.begin")
CORRUPT_FILES = ("__0_0.distcp", "__1_0.distcp", ".metadata", "manifest.json")
_RANKS = range(WORLD_SIZE)
_DELAY = range(4)  # steps after the cursor


def save_step(t: Trigger) -> int | None:
    """The step of the save a trigger names (``name = "step_00000004"``), None if it names none."""
    return int(t.name[5:]) if t.name and t.name.startswith("step_") else None


def position(t: Trigger) -> tuple[int, int] | None:
    """Where a trigger comes in a launch's order of events, comparable: (step, phase), recovery points
    first, then each step's points, then the points of the save at its end. None: not a training point."""
    if t.point in RECOVERY_POINTS:
        return 0, RECOVERY_POINTS.index(t.point) - len(RECOVERY_POINTS)
    if t.point in STEP_POINTS and t.step is not None:
        return t.step, STEP_POINTS.index(t.point)
    if t.point in SAVE_POINTS and save_step(t) is not None:
        return save_step(t), len(STEP_POINTS) + SAVE_POINTS.index(t.point)
    return None


def errno_site(call: str, point: str) -> str:
    return f"{call}@{point}"


class Story(Protocol):
    """The schedule being built, as a rule sees it (``ckpt_chaos/search/machine.py``): a story told in
    order, whose cursor (launch, step) each new fault lands at or after."""

    faults: list[Fault]  # the faults so far
    launch: int  # the launch a new fault belongs to (0: the first)
    step: int  # the first step a new fault of this launch may target
    full_from: int | None  # the disk is full: saves from this step fail in their shard write
    world_after: int | None  # the relaunches' world size (the topology family); None: unchanged

    def can(self, ends_launch: bool | None = None) -> bool:
        """Whether the rule's kind may add a fault here (``ends_launch``: if not as the kind says)."""

    def least_tried(self, drawn: Any, options: tuple, key: Callable = ...) -> Any:
        """``drawn`` moved onto the ``options`` the search has tried least, as the kind's account counts."""

    def places(self, *groups: tuple[str, ...]) -> tuple[str, ...]:
        """The points of ``groups`` a fault may strike next."""

    def at(self, place: str, rank: int, delay: int, beyond: int = 0) -> Trigger | None:
        """A trigger at ``place`` at or after the cursor (+ ``delay`` steps), where the run still gets."""

    def upload(self, point: str, delay: int, fraction: float | None = None) -> Trigger | None:
        """A trigger in the upload of the first checkpoint at or after the cursor (+ ``delay``)."""

    def before_last(self, when: Trigger) -> bool:
        """Whether ``when`` comes before this launch's latest fault."""

    def trigger(self, **keys: Any) -> Trigger:
        """A trigger with these keys."""

    def add(self, kind: str, when: Trigger, **keys: Any) -> None:
        """A fault of ``kind`` in this launch; the cursor moves past it (to the relaunch if it ends one)."""

    def attach(self, kind: str, when: Trigger, **keys: Any) -> None:
        """A fault of ``kind`` in this launch, the cursor left where it is (it comes with another fault)."""


@dataclass(frozen=True)
class Rule:
    """One rule of the search's state machine: it draws ``args`` and adds faults by ``add(story, **drawn)``."""

    name: str  # hypothesis's name of the rule: swarm testing switches rules off by it, and orders them by it
    family: str  # the search family (``ckpt-chaos explore --families``) that schedules it
    args: dict[str, range | tuple]  # what it draws: an integer in a range, or one of a tuple's values
    add: Callable[..., None]


@dataclass(frozen=True)
class SearchRule:
    """How the search schedules faults of one kind (``FaultKind.search``)."""

    rules: tuple[Rule, ...]
    # Where a fault of the kind strikes, as the search counts the places it has tried (account, place),
    # where that is not the kind's account (``crash`` for the kinds that crash) and its probe point.
    # None from it: the default too.
    where: Callable[[Fault], tuple[str, str] | None] | None = None
    with_next: bool = False  # the rule adds it with the fault after it, and the shrink drops the two together
    drop_first: bool = False  # the shrink tries to drop it before any other fault


# ---- process faults ----------------------------------------------------------------------------

def _kill(s: Story, place, rank, delay, whom) -> None:
    if not s.can():
        return
    place = s.least_tried(place, s.places(STEP_POINTS, SAVE_POINTS, RECOVERY_POINTS))
    if (when := s.at(place, rank, delay)) is None:
        return
    target = {"triggering": "triggering", "all": "all"}.get(whom, f"rank:{1 - when.rank}")
    s.add("kill", when, target=target)


def _kill_where(f: Fault) -> tuple[str, str] | None:
    if f.when.point in RANK0_POINTS and f.target == f"rank:{1 - (f.when.rank or 0)}":
        # rank 1 killed while rank 0 commits: rank 0 finishes the commit, so the disk is not left as a crash
        # at that point leaves it. Its own account, or the window would count as tried and never come up.
        return "peer_kill", f.when.point
    return None


def _kill_uploader(s: Story, delay, fraction) -> None:
    if s.can(ends_launch=False) and (when := s.upload("upload.write", delay, fraction)):
        s.add("kill", when, target="uploader")


KILL = SearchRule(rules=(
    Rule("kill", "process", {"place": STEP_POINTS + SAVE_POINTS + RECOVERY_POINTS, "rank": _RANKS, "delay": _DELAY,
                             "whom": ("triggering", "all", "other")}, _kill),
    # the remote tier's uploader killed mid-object: training goes on without it
    Rule("kill_uploader", "remote", {"delay": _DELAY, "fraction": (0.0, 0.5)}, _kill_uploader),
), where=_kill_where)


def _term(s: Story, place, rank, delay, whom) -> None:
    # A preemption needs a micro-batch boundary after it to stop at: never in the last step.
    last = TRAINER["max_steps"]
    if not (s.can() and s.step < last):
        return
    when = s.at(s.least_tried(place, STEP_POINTS + SAVE_POINTS), rank, delay)
    if when is not None and (when.step or save_step(when) or 0) >= last:
        when = s.trigger(point="step.begin", rank=rank, step=min(s.step, last - 1))
    if when is None or s.before_last(when):
        return
    s.add("term", when, target="ranks:0,1" if whom == "all" else "triggering", grace_s=30.0)


TERM = SearchRule(rules=(Rule("term", "process", {"place": STEP_POINTS + SAVE_POINTS, "rank": _RANKS,
                                                  "delay": _DELAY, "whom": ("all", "triggering")}, _term),))


def _stop(s: Story, place, rank, delay) -> None:
    # A stopped rank is noticed by its peers' collective timeout; a relaunch on one rank has no peer,
    # and the job would hang for any trainer.
    if not s.can() or (s.world_after == 1 and s.launch > 0):
        return
    if when := s.at(s.least_tried(place, STEP_POINTS + SAVE_POINTS), rank, delay):
        s.add("stop", when, target="triggering")


# A hang costs the collective timeout in every run that keeps it, and is rarely the cause.
STOP = SearchRule(rules=(Rule("stop", "process", {"place": STEP_POINTS + SAVE_POINTS, "rank": _RANKS,
                                                  "delay": _DELAY}, _stop),), drop_first=True)


def _raise(s: Story, place, rank, delay, error) -> None:
    # Raised in the training loop (an exception inside a save is a failed save that the trainer
    # survives by policy, which would need job_fails = false on that schedule).
    if not s.can():
        return
    if when := s.at(s.least_tried(place, STEP_POINTS), rank, delay):
        s.add("raise", when, error=error)


RAISE = SearchRule(rules=(Rule("raise_", "process", {"place": STEP_POINTS, "rank": _RANKS, "delay": _DELAY,
                                                     "error": ("oom", "runtime")}, _raise),))


# ---- storage faults ----------------------------------------------------------------------------

def _errno(s: Story, site, err, rank, delay, nth_call) -> None:
    if not s.can():
        return
    call, path, target, point = s.least_tried(site, ERRNO_SITES, key=lambda e: errno_site(e[0], e[3]))
    when = s.at(point, rank, delay, beyond=1)
    if when is None or when.point != point:  # no save left in this launch that gets to the call
        return
    r = when.rank
    s.add("errno", when, call=call, errno=err, path=path.format(r=r), target=target.format(r=r),
          nth_call=nth_call if call == "write" else 1)


ERRNO = SearchRule(rules=(Rule("errno", "storage", {"site": ERRNO_SITES, "err": ("EIO", "ENOSPC"), "rank": _RANKS,
                                                    "delay": _DELAY, "nth_call": range(1, 5)}, _errno),),
                   where=lambda f: ("errno", errno_site(f.params.call, f.when.point)))


def _disk_full(s: Story, place, rank, delay) -> None:
    if not s.can() or s.full_from is not None:  # full already: it would fill nothing
        return
    place = s.least_tried(place, DISK_FULL_PLACES)
    if when := s.at(place, rank, delay):
        s.add("disk_full", when, headroom_kb=0)


DISK_FULL = SearchRule(rules=(Rule("disk_full", "storage", {"place": DISK_FULL_PLACES, "rank": _RANKS,
                                                            "delay": _DELAY}, _disk_full),))


def _slow(s: Story, latency_ms, bandwidth) -> None:
    if not (s.can() and not any(f.kind == "slow" and f.attempt == s.launch for f in s.faults)):
        return
    if (when := s.at("step.begin", 0, 0)) is None:
        return
    s.add("slow", when, call="write", latency_ms=latency_ms, bandwidth_mb_s=bandwidth, target="all")


SLOW = SearchRule(rules=(Rule("slow", "storage", {"latency_ms": (1.0, 5.0), "bandwidth": (0.0, 8.0)}, _slow),))


def _power_loss(s: Story, place, rank, delay) -> None:
    if not s.can():
        return
    place = s.least_tried(place, s.places(STEP_POINTS, SAVE_POINTS, RECOVERY_POINTS))
    if when := s.at(place, rank, delay):
        s.add("power_loss", when)


POWER_LOSS = SearchRule(rules=(Rule("power_loss", "storage", {"place": STEP_POINTS + SAVE_POINTS + RECOVERY_POINTS,
                                                              "rank": _RANKS, "delay": _DELAY}, _power_loss),))


def _corrupt(s: Story, corruption, file, which, delay) -> None:
    # At the start of a step after the first save (a checkpoint exists: none of the faults that
    # fail saves came before), then a crash, so that a relaunch has to judge the damage.
    if not (s.can(ends_launch=True)  # it comes with a crash
            and not any(f.spec.fails_saves or f.spec.loses_unsynced for f in s.faults)):
        return
    file = s.least_tried(file, CORRUPT_FILES)
    if (when := s.at("step.begin", 0, delay)) is None:
        return
    when.step = max(when.step, TRAINER["ckpt_every_steps"] + 1)
    s.attach("corrupt", when, corruption=corruption, file=file, checkpoint=which)
    s.add("kill", s.trigger(**vars(when)), target="all")


CORRUPT = SearchRule(rules=(Rule("corrupt", "storage", {"corruption": ("truncate", "flip", "delete"),
                                                        "file": CORRUPT_FILES, "which": ("newest", "oldest"),
                                                        "delay": _DELAY}, _corrupt),),
                     where=lambda f: ("corrupt", f.params.file), with_next=True)


# ---- the remote tier (moto's S3 and the fault proxy: a run ~2 s longer) ---------------------------

def _lose_disk(s: Story, delay, point) -> None:
    if s.can() and (when := s.upload(point, delay, 0.5 if point == "upload.write" else None)):
        s.add("lose_disk", when, target="node:0")


LOSE_DISK = SearchRule(rules=(Rule("lose_disk", "remote", {"delay": _DELAY,
                                                           "point": ("upload.write", "upload.durable")}, _lose_disk),))


def _toxic(s: Story, delay, toxic) -> None:
    # Healed at the end of the last step, before the final save: a link that stays broken to the end
    # would fail final_durable for any trainer. Only on an early checkpoint's upload, so that it has
    # begun (or been skipped for a newer one) well before that heal.
    when = s.upload("upload.begin", delay) if s.can() else None
    if when is None or save_step(when) > TRAINER["max_steps"] - 2 * TRAINER["ckpt_every_steps"]:
        return
    s.attach("toxic", when, link="remote", toxic=toxic, attributes={"timeout": 0})
    s.attach("heal", s.trigger(point="step.end", rank=0, step=TRAINER["max_steps"]))


TOXIC = SearchRule(rules=(Rule("toxic", "remote", {"delay": _DELAY, "toxic": ("reset_peer", "timeout")}, _toxic),),
                   with_next=True)
