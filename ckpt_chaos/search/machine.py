"""The state machine that draws a schedule: the story's cursor, and one hypothesis rule per ``Rule`` of
the kinds that have one (``FaultKind.search``, ``ckpt_chaos/faults/search_rules.py``)."""

from __future__ import annotations

import collections
import sys
from typing import Any, Callable, Iterable, Protocol

from hypothesis import strategies as st
from hypothesis.control import current_build_context
from hypothesis.stateful import RuleBasedStateMachine, rule

from ckpt_chaos.faults import FaultKind
from ckpt_chaos.faults.search_rules import Rule
from ckpt_chaos.scenario import Fault, Trigger
from ckpt_chaos.search.schedule import (DEFAULT_FAMILIES, MAX_LAUNCHES, RANK0_POINTS, RECOVERY_POINTS, SAVE_POINTS,
                                        STEP_POINTS, TOPOLOGY, TRAINER, WORLD_SIZE, account, position, rules,
                                        save_step, where)


class Searching(Protocol):
    """What the state machine asks of the search that runs it (``explore.Search``)."""

    families: tuple[str, ...]  # searched
    tried: collections.Counter  # where the faults of the schedules run so far struck (``where``)

    def judge(self, faults: list[Fault], final: bool = False, world_after: int | None = None) -> None:
        """Run the schedule (or recall its verdict); raises if it failed in a new way."""


class FaultSchedule(RuleBasedStateMachine):
    """A schedule of faults against the search's trainer, run once in ``teardown``; the ``Story`` its
    kinds' rules add faults to (``machine_for`` gives it their rules).

    A rule that does not apply where the story is (a third crash, a preemption in the last step, a
    kind outside ``--families``) does nothing, rather than being a precondition: with swarm testing
    an example whose enabled rules all failed their preconditions would be thrown away."""

    def __init__(self, search: Searching):
        super().__init__()
        self.search = search
        self.families = frozenset(search.families)
        self.kind: FaultKind | None = None  # the kind whose rule runs now
        self.faults: list[Fault] = []
        self.launch = 0
        self.step = 1  # the first step a new fault of this launch may target
        self.fresh = False  # a relaunch that has trained nothing yet: recovery points come first
        self._new_launch()
        # topology: every relaunch of every example comes back on half the ranks. Not a rule: swarm
        # testing disabled a resize rule in about half the examples, and a bug that only a smaller
        # world shows was then found by 2 searches of 5. The deletion pass still tries without it.
        self.world_after: int | None = WORLD_SIZE // 2 if TOPOLOGY in self.families else None

    # -- the story's cursor -------------------------------------------------------------------

    def _new_launch(self) -> None:
        # A launch's faults come in the order of its events (``position``), so each one is composed
        # knowing what the earlier ones did to the saves: a fault at a point a failed save never
        # reaches does not fire, and a fifth of the faults planned were such (errnos after a full
        # disk, a second disk_full, a crash at the commit of a save whose shard write failed).
        self.last = (0, -len(RECOVERY_POINTS) - 1)  # position of this launch's latest fault
        self.save_dies: dict[int, int] = {}  # save step -> index in SAVE_POINTS of its first point not reached
        self.full_from: int | None = None  # the disk is full: saves from this step fail in their shard write

    def can(self, ends_launch: bool | None = None) -> bool:
        """Whether the rule running now may add a fault here; ``ends_launch``: whether it ends the launch,
        if not as its kind does."""
        if (self.kind.ends_launch if ends_launch is None else ends_launch) and self.launch >= MAX_LAUNCHES:
            return False
        return self.fresh or self.step <= TRAINER["max_steps"]

    def least_tried(self, drawn: Any, options: tuple, key: Callable = lambda o: o) -> Any:
        """``drawn`` moved onto the options this search has tried least so far (``Search.tried``).

        The search runs a few schedules a minute, and a window such as a crash between two steps
        of the commit protocol is 2 of 15 places: drawn at random, places come up again long
        before every one has been tried. The drawn value's index picks among the least-tried
        options, so the draw still decides (and shrinks towards the first of them), and the
        mapping depends only on schedules that ran before this example, none during a shrink:
        the same draws make the same schedule while hypothesis replays them."""
        group = account(self.kind)
        here = collections.Counter(where(f) for f in self.faults)  # and this schedule's faults so far
        counts = [self.search.tried[(group, key(o))] + here[(group, key(o))] for o in options]
        least = [o for o, n in zip(options, counts) if n == min(counts)]
        return least[options.index(drawn) % len(least)] if drawn in options else least[0]

    def places(self, *groups: tuple[str, ...]) -> tuple[str, ...]:
        """The points of ``groups`` a fault may strike next: recovery points only in a fresh relaunch."""
        return tuple(p for g in groups for p in g if self.fresh or p not in RECOVERY_POINTS)

    def _reaches(self, save: int, point: str, beyond: int = 0) -> bool:
        """Whether the save at step ``save`` gets to ``point`` (and ``beyond`` more points: an errno's
        call comes after its trigger point) after this launch's faults so far, not before the latest."""
        i = SAVE_POINTS.index(point)
        dies = self.save_dies.get(save, len(SAVE_POINTS))
        if self.full_from is not None and save >= self.full_from:
            dies = min(dies, 1)  # staged, then the shard's write fails
        return i + beyond < dies and (save, len(STEP_POINTS) + i) >= self.last

    def at(self, place: str, rank: int, delay: int, beyond: int = 0) -> Trigger | None:
        """A trigger at or after the cursor and this launch's latest fault, at a save that gets there
        (``_reaches``), or at the nearest step point when none does; None if training has no such point
        left. ``place`` is a probe point."""
        max_steps, every = TRAINER["max_steps"], TRAINER["ckpt_every_steps"]
        if place in RECOVERY_POINTS:
            if self.fresh:
                return Trigger(point=place, rank=rank)
            place = "step.begin"  # nothing to recover from in this launch: the nearest training point
        self.fresh = False
        step = min(self.step + delay, max_steps)
        if place in SAVE_POINTS:
            save = -(-step // every) * every  # the first save at or after that step
            while save <= max_steps and not self._reaches(save, place, beyond):
                save += every
            if save <= max_steps:
                rank = 0 if place in RANK0_POINTS else rank
                return Trigger(point=place, rank=rank, name=f"step_{save:08d}",
                               min_fraction=0.5 if place == "ckpt.shard.write" else None)
            place = "step.end"
        phase = STEP_POINTS.index(place)
        if (step, phase) < self.last:
            step = self.last[0] + (phase < self.last[1])
        return Trigger(point=place, rank=rank, step=step) if step <= max_steps else None

    def upload(self, point: str, delay: int, fraction: float | None = None) -> Trigger | None:
        """A trigger in the upload of the first checkpoint at or after the cursor (+ delay), if any."""
        every, max_steps = TRAINER["ckpt_every_steps"], TRAINER["max_steps"]
        save = -(-min(self.step + delay, max_steps) // every) * every
        if save > max_steps:
            return None
        self.fresh = False
        return Trigger(point=point, name=f"step_{save:08d}", min_fraction=fraction or None)

    def before_last(self, when: Trigger) -> bool:
        return position(when) < self.last

    def trigger(self, **keys: Any) -> Trigger:
        return Trigger(**keys)

    def attach(self, kind: str, when: Trigger, **keys: Any) -> None:
        self.faults.append(Fault(kind=kind, when=when, attempt=self.launch, **keys))

    def add(self, kind: str, when: Trigger, **keys: Any) -> None:
        fault = Fault(kind=kind, when=when, **keys)
        fault.attempt = self.launch
        self.faults.append(fault)
        if fault.ends_launch:
            # The next launch resumes at or before the step this one reached, so every later step
            # is certain to come again; recovery points come first. A preemption stops at the next
            # micro-batch boundary and saves there: the relaunch resumes inside the next step.
            reached = fault.when.step or save_step(fault.when) or self.step
            self.launch += 1
            self.step = max(self.step, reached + (2 if fault.spec.notice else 1))
            self.fresh = True
            self._new_launch()
            return
        if fault.when.step is not None:
            self.step = max(self.step, fault.when.step)
        if (at := position(fault.when)) is not None:
            self.last = max(self.last, at)
        save = save_step(fault.when)
        if fault.spec.fails_saves and save is not None:  # the save fails after the trigger point
            dies = SAVE_POINTS.index(fault.when.point) + 1
            self.save_dies[save] = min(self.save_dies.get(save, len(SAVE_POINTS)), dies)
        if fault.spec.fills_disk:  # and every later save in its shard write (this one's may have begun)
            self.full_from = (fault.when.step if save is None
                              else save + TRAINER["ckpt_every_steps"] if dies > 1 else save)

    # -- rules: training progress; the kinds' rules come from ``machine_for`` ---------------------

    @rule(steps=st.integers(1, 3))
    def train_on(self, steps):
        """Training goes on for a few steps before the next fault (always possible: past the last
        step it only means the job runs to its end, and hypothesis needs one rule that can run)."""
        self.step = min(self.step + steps, TRAINER["max_steps"] + 1)
        self.fresh = False

    def teardown(self):
        # teardown runs in a ``finally``: when hypothesis abandons an example (StopTest: it ran out of
        # choices while replaying or shrinking; an invalid draw) the schedule is incomplete, and a
        # failure raised here would be dropped with the example. Run only complete schedules.
        if sys.exc_info()[0] is not None:
            return
        self.search.judge(self.faults, final=current_build_context().is_final, world_after=self.world_after)


def _strategy(values: range | tuple) -> st.SearchStrategy:
    return st.integers(values.start, values.stop - 1) if isinstance(values, range) else st.sampled_from(values)


def _hypothesis_rule(kind: FaultKind, r: Rule):
    """``r`` as a rule of the state machine: it runs only where its family is searched."""
    def method(self: FaultSchedule, **drawn):
        if r.family in self.families:
            self.kind = kind
            r.add(self, **drawn)

    # hypothesis names, orders and switches rules (swarm testing) by the function's name
    method.__name__ = method.__qualname__ = r.name
    method.__doc__ = r.add.__doc__
    return rule(**{k: _strategy(v) for k, v in r.args.items()})(method)


_MACHINES: dict[frozenset, type[FaultSchedule]] = {}


def machine_for(families: Iterable[str]) -> type[FaultSchedule]:
    """The state machine with the rules of the default families and of the families searched.

    The default families' rules are in every machine (doing nothing where their family is not
    searched), another family's only where it is: hypothesis draws among the rules a machine has, so
    a search without that family draws the schedules it drew before the family had rules."""
    present = frozenset(DEFAULT_FAMILIES) | {r.family for _, r in rules() if r.family in set(families)}
    if present not in _MACHINES:
        extra = sorted(present - set(DEFAULT_FAMILIES))
        namespace = {r.name: _hypothesis_rule(kind, r) for kind, r in rules() if r.family in present}
        _MACHINES[present] = type("+".join(["FaultSchedule", *extra]), (FaultSchedule,), namespace)
    return _MACHINES[present]
