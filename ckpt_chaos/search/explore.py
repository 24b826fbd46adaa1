"""Fault-schedule search: random schedules of faults, run against the real trainer, shrunk to the
smallest schedule that still fails, written out as a scenario file that ``ckpt-chaos run`` replays.

Hand-written scenarios test the failures someone thought of. The search composes them: a
hypothesis rule-based state machine (``FaultSchedule``) whose rules each add one fault to a
schedule (kill, term, stop, raise; errno, disk_full, slow, power_loss, corrupt) or let training
go on. The schedule is a story told in order: a *cursor* (launch, step) says where the story
is, each fault lands at or after it, and a fault that ends the launch (kill, stop, raise, term,
power loss) moves the story to the next launch, where the recovery points (``train.start``,
``load.begin``, ``load.end``) become reachable. Triggers count events (a step number, the
checkpoint's name, a rank, a fraction of a shard), never time, so a schedule replays exactly.
A launch's faults come in the order of its events, and the story knows what its faults did to
the saves: a save an errno failed never reaches its later points, a full disk fails every later
save's shard write (and is filled once), so no fault is planned where the run cannot get to.

Two more families are off by default, so a search without them draws the schedules it always
drew: ``topology`` (in every example, every relaunch comes back on half the ranks; faults of the
relaunches are aimed at ranks that exist there, and the trajectory is compared within the
catalogue's tolerance; not a rule, so swarm testing cannot switch it off, and the deletion pass
tries each finding without it) and ``remote`` (rules in a mixin, ``machine_for``: the uploader
killed mid-object, the node's disk lost mid-upload or after a checkpoint became durable, a reset
or a stall on the upload link healed before the final save; moto and the fault proxy make such a
run ~2 s longer).

Each example is one real run (``runner.run_scenario``: torchrun, the probe, the nemesis, the
relaunches), made once, in ``teardown``, after the rules have built the schedule; the harness's
checkers are the invariant. A failed check raises, and hypothesis shrinks the schedule.

Coverage: at a few real runs a minute a search runs tens of schedules, and a narrow window (a crash
between two steps of the commit protocol: 2 of 15 places) drawn at random comes up late. So each
rule moves its drawn place onto the places the search has tried least (``_least_tried``; the three
crashes share one account), and a schedule that tries no new place and no new pair of consecutive
faults (``tries``) passes without a run (a kill of rank 1 while rank 0 commits is not a crash at that
point of the commit: rank 0 finishes it). Both depend only on the schedules run before, and stand
still while a failure shrinks, so the same draws make the same schedule whenever hypothesis replays
them; hypothesis runs in rounds of a fixed number of examples (a new seed each), so a longer search
with the same seed runs the shorter one's schedules first, and with the constants hypothesis takes
from imported modules held fixed (``fixed_constants``), whatever else the process imported.

Swarm testing comes with hypothesis's stateful testing: ``RuleStrategy`` draws a shared
``FeatureFlags`` per example (``st.shared(FeatureStrategy(at_least_one_of=rule_names))``, see
hypothesis/stateful.py) and only draws rules it enables, with a per-example probability of
disabling each. One rule is one fault kind here, so every example runs a random subset of the
kinds (some examples are all kills, some all storage faults), and the flags "shrink open":
while shrinking, the steps of kinds that do not matter are deleted.

What is a finding, and what is not:

* the identity of a failure is its first failed check, named without launch or fault numbers
  (``Check.check``: ``trajectory``, ``latest_valid``, ``fault_surfaced``...). Each identity raises its own
  exception type, so hypothesis shrinks a failure to a smaller schedule that fails *the same
  way*, never to a different bug;
* ``fault_N_fired`` failing only says that the story did not happen as planned (a kill in a
  launch that a storage fault already ended, a load in a launch with nothing to load): not the
  trainer's fault, and never a finding on its own;
* the expectations of a generated schedule are derived so that a correct trainer passes every
  one (``expected()``): no ``resume_from``, a lost-work bound of one checkpoint interval unless
  a storage fault may fail saves (then none), ``job_fails`` inferred by the checker, a spare
  relaunch. ``tests/test_explore.py`` and ``benchmarks/explore_planted.py`` hold the reference
  trainer to that (no finding in the same budget that finds the planted bugs).

Budget: hypothesis has no clock, so the search keeps one. No new schedule is run after
``budget_s`` (later examples pass without running, and hypothesis runs out of them in
milliseconds); a failure then gets about ``shrink_s`` of shrinking, every run of it real except
repeats, which are answered from a cache of verdicts keyed by the scenario's TOML (exact, because
the same schedule fails the same way). Half of it goes to hypothesis's shrinker; the other half,
on its own clock (so a run the shrinker started late, with a hang, does not eat it), to a
deletion pass over the faults of what it returned (``Search._reduce``, hangs tried first): one run
removes a whole fault, where the shrinker spends most of its candidates on the values inside the
steps. After the shrink the scenario is written to a file, loaded back and run once more: a
failure that does not fail the same way again is reported as "did not reproduce", never as a
finding. Then the search goes on (a new round, failures of a known identity no longer
interesting) until the budget is spent.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from hypothesis import HealthCheck, Phase, Verbosity, seed as hypothesis_seed, settings, strategies as st
from hypothesis.control import current_build_context
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from ckpt_chaos.config import cache_dir, golden_dir, out_dir
from ckpt_chaos.faults import KINDS as KINDS_BY_NAME
from ckpt_chaos.scenario import Expect, Fault, Recovery, Remote, Scenario, ScenarioError, Storage, Trigger, load, validate

# A small job: 2 ranks, 8 steps, a checkpoint every 2 steps (4 saves); a launch from a warm launcher
# agent takes 2-4 s on this 2-core machine. A stopped rank is found when its peer's collective times
# out: 8 s is several times the longest wait of a run without a hang (a first step or a load, under
# 1 s; a save slowed by a `slow` fault, under 2 s) and halves what a hang costs against the
# catalogue's 15 s. The search runs alone, so no other job's load stretches those waits.
WORLD_SIZE = 2
TRAINER = {"max_steps": 8, "ckpt_every_steps": 2, "dataset_size": 96, "global_batch": 16, "grad_accum": 2,
           "collective_timeout_s": 8}
MAX_LAUNCHES = 2  # launch-ending faults per schedule: each relaunch costs 2-4 s here, a hang 8 s more
# The fault kinds the search composes, by family. node/network (docker, netns) and remote (moto,
# toxiproxy) cost seconds to minutes of set-up per run; they stay out of the search for now.
KINDS: dict[str, tuple[str, ...]] = {
    "process": ("kill", "term", "stop", "raise"),
    "storage": ("errno", "disk_full", "slow", "power_loss", "corrupt"),
    # Not a fault: every relaunch comes back on fewer ranks (a node lost for good). Its own family, off by
    # default: the trajectory is then compared within a tolerance, and the default search stays as it was.
    "topology": ("resize",),
    # The remote tier (moto's S3 and the fault proxy, ~2 s more per run): the uploader killed mid-object,
    # the node's disk lost mid-upload, a reset on the upload link. Off by default, like topology.
    "remote": ("kill_uploader", "lose_disk", "toxic"),
}
DEFAULT_FAMILIES = ("process", "storage")
# Of a failure's shrinking time, hypothesis's shrinker gets this share; a fault-level deletion pass
# (``Search._reduce``) the rest, on its own clock: at 30-60 s a run, hypothesis alone gets through
# few candidates.
HYPOTHESIS_SHRINK_SHARE = 0.5
# Examples per hypothesis round; the search runs rounds (seed, seed + 1, ...) until its budget is spent.
EXAMPLES_PER_ROUND = 20

STEP_POINTS = ("step.begin", "microstep.end", "step.end")
SAVE_POINTS = ("ckpt.stage", "ckpt.shard.write", "ckpt.shard.done", "ckpt.metadata", "ckpt.fsync",
               "ckpt.manifest", "ckpt.commit", "ckpt.latest", "ckpt.retention")
RANK0_POINTS = ("ckpt.metadata", "ckpt.fsync", "ckpt.manifest", "ckpt.commit", "ckpt.latest", "ckpt.retention")
RECOVERY_POINTS = ("train.start", "load.begin", "load.end")
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

# Checks that say the schedule did not happen as planned, not that the trainer is wrong.
NOT_FINDINGS = ("fault_fired",)


def _account(kind: str) -> str:
    """The kind under which the search counts the places a fault of ``kind`` has tried: faults that end
    a process where it stands (a kill; a stop, which the peers' timeout turns into a kill; a power cut)
    leave the disk as it was at that point, so they share one account (``FaultKind.crashes``)."""
    return "crash" if kind in KINDS_BY_NAME and KINDS_BY_NAME[kind].crashes else kind


def _errno_site(call: str, point: str) -> str:
    return f"{call}@{point}"


def where(f: Fault) -> tuple[str, str]:
    """Where a fault strikes, as the search counts what it has tried: its kind (crashes as one), and
    its probe point, errno call and point, or corrupted file."""
    if f.kind == "errno":
        return "errno", _errno_site(f.params.call, f.when.point)
    if f.kind == "corrupt":
        return "corrupt", f.params.file
    if f.kind == "kill" and f.when.point in RANK0_POINTS and f.target == f"rank:{1 - (f.when.rank or 0)}":
        # rank 1 killed while rank 0 commits: rank 0 finishes the commit, so the disk is not left as a crash
        # at that point leaves it. Its own account, or the window would count as tried and never come up.
        return "peer_kill", f.when.point
    return _account(f.kind), f.when.point


def _position(t: Trigger) -> tuple[int, int] | None:
    """Where a trigger comes in a launch's order of events, comparable: (step, phase), recovery points
    first, then each step's points, then the points of the save at its end. None: not a training point."""
    if t.point in RECOVERY_POINTS:
        return 0, RECOVERY_POINTS.index(t.point) - len(RECOVERY_POINTS)
    if t.point in STEP_POINTS and t.step is not None:
        return t.step, STEP_POINTS.index(t.point)
    if t.point in SAVE_POINTS and _save_step(t) is not None:
        return _save_step(t), len(STEP_POINTS) + SAVE_POINTS.index(t.point)
    return None


def tries(faults: list[Fault]) -> set[tuple]:
    """What a schedule tries that another may already have: where each fault strikes (``where``, in the
    first launch or a relaunch), and each pair of consecutive faults (so that combinations count)."""
    one = [(*where(f), f.attempt > 0) for f in faults]
    return set(one) | set(zip(one, one[1:]))


def identity(checks: list[dict]) -> str | None:
    """How a run failed: the name of its first failed check that is a finding, the same for every
    fault and subject (``Check.check``: ``fault_surfaced``, ``committed_survives``); None if none is."""
    for c in checks:
        if c["verdict"] == "fail" and c["check"] not in NOT_FINDINGS:
            return c["check"]
    return None


class ScheduleFailed(AssertionError):
    """A generated schedule failed a check. Subclassed per identity (``failure_type``)."""


_FAILURE_TYPES: dict[str, type[ScheduleFailed]] = {}


def failure_type(ident: str) -> type[ScheduleFailed]:
    # hypothesis tells failures apart by exception type and origin: one type per identity keeps a
    # shrink on the same bug.
    if ident not in _FAILURE_TYPES:
        name = "Failed_" + re.sub(r"\W", "_", ident)
        _FAILURE_TYPES[ident] = type(name, (ScheduleFailed,), {"__module__": __name__})
    return _FAILURE_TYPES[ident]


def expected(faults: list[Fault]) -> Expect:
    """What a correct trainer guarantees under any of these schedules (module docstring)."""
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
    if name is None:
        digest = hashlib.sha256(s.to_toml().encode()).hexdigest()[:10]
        name = f"explore-{digest}"
    s.name = name
    validate(s)
    return s


class FaultSchedule(RuleBasedStateMachine):
    """A schedule of faults against the search's trainer, run once in ``teardown``.

    A rule that does not apply where the story is (a third crash, a preemption in the last step, a
    kind outside ``--families``) does nothing, rather than being a precondition: with swarm testing
    an example whose enabled rules all failed their preconditions would be thrown away."""

    def __init__(self, search: "Search"):
        super().__init__()
        self.search = search
        self.kinds = search.kinds
        self.faults: list[Fault] = []
        self.launch = 0
        self.step = 1  # the first step a new fault of this launch may target
        self.fresh = False  # a relaunch that has trained nothing yet: recovery points come first
        self._new_launch()
        # topology: every relaunch of every example comes back on half the ranks. Not a rule: swarm
        # testing disabled a resize rule in about half the examples, and a bug that only a smaller
        # world shows was then found by 2 searches of 5. The deletion pass still tries without it.
        self.world_after: int | None = WORLD_SIZE // 2 if "resize" in self.kinds else None

    # -- the story's cursor -------------------------------------------------------------------

    def _new_launch(self) -> None:
        # A launch's faults come in the order of its events (``_position``), so each one is composed
        # knowing what the earlier ones did to the saves: a fault at a point a failed save never
        # reaches does not fire, and a fifth of the faults planned were such (errnos after a full
        # disk, a second disk_full, a crash at the commit of a save whose shard write failed).
        self.last = (0, -len(RECOVERY_POINTS) - 1)  # position of this launch's latest fault
        self.save_dies: dict[int, int] = {}  # save step -> index in SAVE_POINTS of its first point not reached
        self.full_from: int | None = None  # the disk is full: saves from this step fail in their shard write

    def _can(self, kind: str, ends_launch: bool | None = None) -> bool:
        """Whether rule ``kind`` may add a fault here; ``ends_launch``: whether it ends the launch, if not
        as the fault kind of that name does."""
        if kind not in self.kinds:
            return False
        if (KINDS_BY_NAME[kind].ends_launch if ends_launch is None else ends_launch) and self.launch >= MAX_LAUNCHES:
            return False
        return self.fresh or self.step <= TRAINER["max_steps"]

    def _least_tried(self, kind: str, drawn, options: tuple, key: Callable = lambda o: o):
        """``drawn`` moved onto the options this search has tried least so far (``Search.tried``).

        The search runs a few schedules a minute, and a window such as a crash between two steps
        of the commit protocol is 2 of 15 places: drawn at random, places come up again long
        before every one has been tried. The drawn value's index picks among the least-tried
        options, so the draw still decides (and shrinks towards the first of them), and the
        mapping depends only on schedules that ran before this example, none during a shrink:
        the same draws make the same schedule while hypothesis replays them."""
        group = _account(kind)
        here = collections.Counter(where(f) for f in self.faults)  # and this schedule's faults so far
        counts = [self.search.tried[(group, key(o))] + here[(group, key(o))] for o in options]
        least = [o for o, n in zip(options, counts) if n == min(counts)]
        return least[options.index(drawn) % len(least)] if drawn in options else least[0]

    def _places(self, *groups: tuple[str, ...]) -> tuple[str, ...]:
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

    def _at(self, place: str, rank: int, delay: int, beyond: int = 0) -> Trigger | None:
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

    def _add(self, fault: Fault) -> None:
        fault.attempt = self.launch
        self.faults.append(fault)
        if fault.ends_launch:
            # The next launch resumes at or before the step this one reached, so every later step
            # is certain to come again; recovery points come first. A preemption stops at the next
            # micro-batch boundary and saves there: the relaunch resumes inside the next step.
            reached = fault.when.step or _save_step(fault.when) or self.step
            self.launch += 1
            self.step = max(self.step, reached + (2 if fault.spec.notice else 1))
            self.fresh = True
            self._new_launch()
            return
        if fault.when.step is not None:
            self.step = max(self.step, fault.when.step)
        if (position := _position(fault.when)) is not None:
            self.last = max(self.last, position)
        save = _save_step(fault.when)
        if fault.spec.fails_saves and save is not None:  # the save fails after the trigger point
            dies = SAVE_POINTS.index(fault.when.point) + 1
            self.save_dies[save] = min(self.save_dies.get(save, len(SAVE_POINTS)), dies)
        if fault.spec.fills_disk:  # and every later save in its shard write (this one's may have begun)
            self.full_from = (fault.when.step if save is None
                              else save + TRAINER["ckpt_every_steps"] if dies > 1 else save)

    # -- rules: training progress -----------------------------------------------------------

    @rule(steps=st.integers(1, 3))
    def train_on(self, steps):
        """Training goes on for a few steps before the next fault (always possible: past the last
        step it only means the job runs to its end, and hypothesis needs one rule that can run)."""
        self.step = min(self.step + steps, TRAINER["max_steps"] + 1)
        self.fresh = False

    # -- rules: process faults -------------------------------------------------------------

    @rule(place=st.sampled_from(STEP_POINTS + SAVE_POINTS + RECOVERY_POINTS), rank=st.integers(0, WORLD_SIZE - 1),
          delay=st.integers(0, 3), whom=st.sampled_from(("triggering", "all", "other")))
    def kill(self, place, rank, delay, whom):
        if not (self._can("kill")):
            return
        place = self._least_tried("kill", place, self._places(STEP_POINTS, SAVE_POINTS, RECOVERY_POINTS))
        if (when := self._at(place, rank, delay)) is None:
            return
        target = {"triggering": "triggering", "all": "all"}.get(whom, f"rank:{1 - when.rank}")
        self._add(Fault(kind="kill", when=when, target=target))

    @rule(place=st.sampled_from(STEP_POINTS + SAVE_POINTS), rank=st.integers(0, WORLD_SIZE - 1),
          delay=st.integers(0, 3), whom=st.sampled_from(("all", "triggering")))
    def term(self, place, rank, delay, whom):
        # A preemption needs a micro-batch boundary after it to stop at: never in the last step.
        if not (self._can("term") and self.step < TRAINER["max_steps"]):
            return
        when = self._at(self._least_tried("term", place, STEP_POINTS + SAVE_POINTS), rank, delay)
        if when is not None and (when.step or _save_step(when) or 0) >= TRAINER["max_steps"]:
            when = Trigger(point="step.begin", rank=rank, step=min(self.step, TRAINER["max_steps"] - 1))
        if when is None or _position(when) < self.last:
            return
        self._add(Fault(kind="term", when=when, target="ranks:0,1" if whom == "all" else "triggering", grace_s=30.0))

    @rule(place=st.sampled_from(STEP_POINTS + SAVE_POINTS), rank=st.integers(0, WORLD_SIZE - 1),
          delay=st.integers(0, 3))
    def stop(self, place, rank, delay):
        # A stopped rank is noticed by its peers' collective timeout; a relaunch on one rank has no peer,
        # and the job would hang for any trainer.
        if not self._can("stop") or (self.world_after == 1 and self.launch > 0):
            return
        if when := self._at(self._least_tried("stop", place, STEP_POINTS + SAVE_POINTS), rank, delay):
            self._add(Fault(kind="stop", when=when, target="triggering"))

    @rule(place=st.sampled_from(STEP_POINTS), rank=st.integers(0, WORLD_SIZE - 1), delay=st.integers(0, 3),
          error=st.sampled_from(("oom", "runtime")))
    def raise_(self, place, rank, delay, error):
        # Raised in the training loop (an exception inside a save is a failed save that the
        # trainer survives by policy, which would need job_fails = false on that schedule).
        if not (self._can("raise")):
            return
        if when := self._at(self._least_tried("raise", place, STEP_POINTS), rank, delay):
            self._add(Fault(kind="raise", when=when, error=error))

    # -- rules: storage faults -------------------------------------------------------------

    @rule(site=st.sampled_from(ERRNO_SITES), err=st.sampled_from(("EIO", "ENOSPC")),
          rank=st.integers(0, WORLD_SIZE - 1), delay=st.integers(0, 3), nth_call=st.integers(1, 4))
    def errno(self, site, err, rank, delay, nth_call):
        if not (self._can("errno")):
            return
        call, path, target, point = self._least_tried("errno", site, ERRNO_SITES, key=lambda e: _errno_site(e[0], e[3]))
        when = self._at(point, rank, delay, beyond=1)
        if when is None or when.point != point:  # no save left in this launch that gets to the call
            return
        r = when.rank
        self._add(Fault(kind="errno", when=when, call=call, errno=err, path=path.format(r=r),
                        target=target.format(r=r), nth_call=nth_call if call == "write" else 1))

    @rule(place=st.sampled_from(DISK_FULL_PLACES),
          rank=st.integers(0, WORLD_SIZE - 1), delay=st.integers(0, 3))
    def disk_full(self, place, rank, delay):
        if not self._can("disk_full") or self.full_from is not None:  # full already: it would fill nothing
            return
        place = self._least_tried("disk_full", place, DISK_FULL_PLACES)
        if when := self._at(place, rank, delay):
            self._add(Fault(kind="disk_full", when=when, headroom_kb=0))

    @rule(latency_ms=st.sampled_from((1.0, 5.0)), bandwidth=st.sampled_from((0.0, 8.0)))
    def slow(self, latency_ms, bandwidth):
        if not (self._can("slow") and not any(f.kind == "slow" and f.attempt == self.launch for f in self.faults)):
            return
        if (when := self._at("step.begin", 0, 0)) is None:
            return
        self._add(Fault(kind="slow", when=when, call="write", latency_ms=latency_ms, bandwidth_mb_s=bandwidth,
                        target="all"))

    @rule(place=st.sampled_from(STEP_POINTS + SAVE_POINTS + RECOVERY_POINTS), rank=st.integers(0, WORLD_SIZE - 1),
          delay=st.integers(0, 3))
    def power_loss(self, place, rank, delay):
        if not (self._can("power_loss")):
            return
        place = self._least_tried("power_loss", place, self._places(STEP_POINTS, SAVE_POINTS, RECOVERY_POINTS))
        if when := self._at(place, rank, delay):
            self._add(Fault(kind="power_loss", when=when))

    @rule(corruption=st.sampled_from(("truncate", "flip", "delete")),
          file=st.sampled_from(CORRUPT_FILES),
          which=st.sampled_from(("newest", "oldest")), delay=st.integers(0, 3))
    def corrupt(self, corruption, file, which, delay):
        # At the start of a step after the first save (a checkpoint exists: none of the faults that
        # fail saves came before), then a crash, so that a relaunch has to judge the damage.
        if not (self._can("corrupt", ends_launch=True)  # it comes with a crash
                and not any(f.spec.fails_saves or f.spec.loses_unsynced for f in self.faults)):
            return
        file = self._least_tried("corrupt", file, CORRUPT_FILES)
        if (when := self._at("step.begin", 0, delay)) is None:
            return
        when.step = max(when.step, TRAINER["ckpt_every_steps"] + 1)
        self.faults.append(Fault(kind="corrupt", when=when, corruption=corruption, file=file, checkpoint=which,
                                 attempt=self.launch))
        self._add(Fault(kind="kill", when=Trigger(**vars(when)), target="all"))

    def teardown(self):
        # teardown runs in a ``finally``: when hypothesis abandons an example (StopTest: it ran out of
        # choices while replaying or shrinking; an invalid draw) the schedule is incomplete, and a
        # failure raised here would be dropped with the example. Run only complete schedules.
        if sys.exc_info()[0] is not None:
            return
        self.search.judge(self.faults, final=current_build_context().is_final, world_after=self.world_after)


# The remote family's rules live in a mixin: a search without it runs the very class it ran
# before they existed, so its seeds draw the same schedules.
class _RemoteRules:
    def _upload(self, point: str, delay: int, fraction: float | None = None) -> Trigger | None:
        """A trigger in the upload of the first checkpoint at or after the cursor (+ delay), if any."""
        every, max_steps = TRAINER["ckpt_every_steps"], TRAINER["max_steps"]
        save = -(-min(self.step + delay, max_steps) // every) * every
        if save > max_steps:
            return None
        self.fresh = False
        return Trigger(point=point, name=f"step_{save:08d}", min_fraction=fraction or None)

    @rule(delay=st.integers(0, 3), fraction=st.sampled_from((0.0, 0.5)))
    def kill_uploader(self, delay, fraction):
        if self._can("kill_uploader", ends_launch=False) and (when := self._upload("upload.write", delay, fraction)):
            self._add(Fault(kind="kill", when=when, target="uploader"))

    @rule(delay=st.integers(0, 3), point=st.sampled_from(("upload.write", "upload.durable")))
    def lose_disk(self, delay, point):
        if self._can("lose_disk") and (when := self._upload(point, delay, 0.5 if point == "upload.write" else None)):
            self._add(Fault(kind="lose_disk", when=when, target="node:0"))

    @rule(delay=st.integers(0, 3), toxic=st.sampled_from(("reset_peer", "timeout")))
    def toxic(self, delay, toxic):
        # Healed at the end of the last step, before the final save: a link that stays broken to the end
        # would fail final_durable for any trainer. Only on an early checkpoint's upload, so that it has
        # begun (or been skipped for a newer one) well before that heal.
        when = self._upload("upload.begin", delay) if self._can("toxic") else None
        if when is None or _save_step(when) > TRAINER["max_steps"] - 2 * TRAINER["ckpt_every_steps"]:
            return
        self.faults.append(Fault(kind="toxic", when=when, link="remote", toxic=toxic, attributes={"timeout": 0},
                                 attempt=self.launch))
        self.faults.append(Fault(kind="heal", when=Trigger(point="step.end", rank=0, step=TRAINER["max_steps"]),
                                 attempt=self.launch))


_MIXINS = {"kill_uploader": _RemoteRules}
_MACHINES: dict[tuple, type] = {}


def machine_for(kinds: set[str]) -> type[FaultSchedule]:
    """The state machine with the rules of the families searched."""
    mixins = tuple(m for k, m in _MIXINS.items() if k in kinds)
    if not mixins:
        return FaultSchedule
    if mixins not in _MACHINES:
        _MACHINES[mixins] = type("FaultSchedule+" + "+".join(m.__name__.strip("_") for m in mixins),
                                 (*mixins, FaultSchedule), {})
    return _MACHINES[mixins]


def _without(faults: list[Fault], i: int) -> list[Fault]:
    """The schedule without fault ``i`` (a corrupt goes with its crash), later launches renumbered."""
    drop = {i}
    f = faults[i]
    if f.kind == "corrupt" and i + 1 < len(faults):
        drop.add(i + 1)
    if f.kind == "kill" and i > 0 and faults[i - 1].kind == "corrupt" and faults[i - 1].when == f.when:
        drop.add(i - 1)
    if f.kind == "toxic" and i + 1 < len(faults) and faults[i + 1].kind == "heal":  # a toxic goes with its heal
        drop.add(i + 1)
    if f.kind == "heal" and i > 0 and faults[i - 1].kind == "toxic":
        drop.add(i - 1)
    launch = f.attempt
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
    """Which fault the deletion pass tries to drop first: hangs (``stop``: 15 s of collective timeout
    in every run that keeps it, and rarely the cause), then the latest first."""
    return sorted(range(len(faults)), key=lambda i: (faults[i].kind != "stop", -i))


def _save_step(t: Trigger) -> int | None:
    return int(t.name[5:]) if t.name and t.name.startswith("step_") else None


# ---- the search ---------------------------------------------------------------------------------

@contextlib.contextmanager
def fixed_constants():
    """Make a seed draw the same schedules whatever the process imported.

    hypothesis (6.1xx) draws about one integer in twenty from the constants it finds in the
    project's modules present in ``sys.modules`` (``providers._get_local_constants``), a pool that
    grows as modules are imported: the same seed drew other schedules from the CLI, from a benchmark
    and from a test, and could change mid-search when a run imported a module lazily. Inside this
    context the pool is empty (hypothesis's global constants stay). If a hypothesis release renames
    the hook, nothing is patched and ``tests/test_explore.py`` says so."""
    from hypothesis.internal.conjecture import providers

    hook = getattr(providers, "_get_local_constants", None)
    if hook is None:
        yield
        return
    empty = providers.Constants()
    providers._get_local_constants = lambda: empty
    providers.CONSTANTS_CACHE.cache.clear()  # may hold the permitted values of the pool seen so far
    try:
        yield
    finally:
        providers._get_local_constants = hook
        providers.CONSTANTS_CACHE.cache.clear()


@dataclass
class Attempt:
    """One schedule run (or answered from the cache)."""

    name: str
    verdict: str
    identity: str | None
    faults: int
    fired: int
    wall_s: float
    reason: str = ""
    run_dir: str = ""


@dataclass
class Finding:
    identity: str
    scenario: str  # the scenario's name
    faults: int
    reason: str
    file: str
    reproduced: bool
    rerun_reason: str = ""
    found_after_s: float = 0.0  # from the start of the search to the first run that failed this way
    shrink_runs: int = 0


@dataclass
class Summary:
    trainer: str
    families: list[str]
    seed: int | None
    budget_s: float
    shrink_s: float
    schedules: int = 0  # distinct schedules run for real
    cache_hits: int = 0
    faults_planned: int = 0
    faults_fired: int = 0
    not_run: int = 0  # examples that came after the budget, passed without a run
    nothing_new: int = 0  # examples passed without a run: every place and pair of faults already tried
    rounds: int = 0
    findings: list[Finding] = field(default_factory=list)
    not_reproduced: list[Finding] = field(default_factory=list)
    wall_s: float = 0.0
    run_s: float = 0.0  # time spent in runs
    first_failure_s: float | None = None
    error: str = ""

    @property
    def schedules_per_minute(self) -> float:
        return 60 * self.schedules / self.run_s if self.run_s else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "schedules_per_minute": self.schedules_per_minute}


Runner = Callable[[Scenario, Path, Path], object]  # run_scenario's signature, returns a Result


class Search:
    """The search loop around the state machine: budget, cache, rounds, writing and re-running findings.

    ``runner`` is ``runner.run_scenario`` unless a test gives another (for example a checker
    whose verdict changes between runs, to see a failure that does not reproduce reported so).
    """

    def __init__(self, trainer_module: str = "reference_trainer", families=DEFAULT_FAMILIES,
                 budget_s: float = 600, shrink_s: float | None = None, seed: int | None = None,
                 out: Path | str | None = None, regressions: Path | str | None = None,
                 golden_root: Path | str | None = None, runner: Runner | None = None,
                 database: Path | str | None | bool = True, max_faults: int = 4, max_findings: int | None = None,
                 on_event: Callable[[str, "Search", object], None] | None = None):
        unknown = [f for f in families if f not in KINDS]
        if unknown:
            raise ValueError(f"unknown family {unknown[0]!r} for the search; searchable: {', '.join(KINDS)}")
        from ckpt_chaos.run.runner import run_scenario

        self.trainer_module = trainer_module
        self.kinds = {k for f in families for k in KINDS[f]}
        self.summary = Summary(trainer=trainer_module, families=list(families), seed=seed, budget_s=budget_s,
                               shrink_s=shrink_s if shrink_s is not None else min(300.0, max(60.0, budget_s / 2)))
        self.seed = seed
        self.out = Path(out) if out else out_dir() / "explore"
        # Findings stay with the search's output unless the caller keeps them elsewhere (the repository's
        # Makefile: in the catalogue's regressions folder, so they join the default suite).
        if regressions is None:
            regressions = self.out / "found"
        self.regressions = Path(regressions)
        self.golden_root = Path(golden_root) if golden_root else golden_dir()
        self.runner = runner or run_scenario
        if database is True:
            key = f"{trainer_module}-{'-'.join(sorted(families))}"
            database = cache_dir() / "explore" / key
        self.database = DirectoryBasedExampleDatabase(str(database)) if database else None
        self.max_faults = max_faults
        self.max_findings = max_findings  # stop after this many (benchmarks: the time to the first)
        self.on_event = on_event or (lambda *_: None)
        self.cache: dict[str, Attempt] = {}
        # Where the faults of the schedules run so far struck (``where``): new faults go to the least tried.
        self.tried: collections.Counter = collections.Counter()
        # Examples judged, for a guard: at most one per 2 s of budget, so that a search whose runs take no
        # time (the tests' runners) ends; a real run takes 8 s or more, and most examples run nothing.
        self.examples = 0
        self.seen: set[tuple] = set()  # ``tries`` of every schedule run: a schedule with nothing new is not run
        self.known: set[str] = set()  # identities already found (later rounds look past them)
        self.started = 0.0
        self.found_at: float | None = None  # when the failure being shrunk was found
        self.first_seen: dict[str, float] = {}
        self.shrink_runs = 0
        self.final: list[tuple[list[Fault], int | None, Attempt]] = []

    # -- the clock ----------------------------------------------------------------------------

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def may_run(self) -> bool:
        if self.found_at is not None:  # shrinking: its own allowance
            return time.monotonic() - self.found_at < self.summary.shrink_s * HYPOTHESIS_SHRINK_SHARE
        return self.elapsed() < self.summary.budget_s

    # -- one example --------------------------------------------------------------------------

    def judge(self, faults: list[Fault], final: bool = False, world_after: int | None = None) -> None:
        """Run the schedule (or recall its verdict) and raise if it failed in a new way."""
        if self.found_at is None:
            self.examples += 1
        if not faults:
            return  # no fault, nothing to learn: the golden run already is that run
        s = build(faults, self.trainer_module, world_after=world_after)
        key = s.to_toml()
        attempt = self.cache.get(key)
        if attempt is not None:
            self.summary.cache_hits += 1
        elif not (final or self.may_run()):
            self.summary.not_run += 1
            return
        elif self.found_at is None and tries(faults) <= self.seen:
            # hypothesis generates many near-repeats (mutations of earlier examples); at a few real runs a
            # minute, one that tries no new place and no new pair of faults is a run of nothing new.
            self.summary.nothing_new += 1
            return
        else:
            attempt = self._run(s)
            self.cache[key] = attempt
        if final:
            self.final.append((list(faults), world_after, attempt))
        if attempt.identity is None or attempt.identity in self.known:
            if self.found_at is None:  # frozen while a failure shrinks: its draws must make the same schedules
                self.tried.update(where(f) for f in faults)
                self.seen |= tries(faults)
            return
        if self.found_at is None:
            self.found_at = time.monotonic()
        self.first_seen.setdefault(attempt.identity, self.elapsed())
        raise failure_type(attempt.identity)(f"{attempt.name}: {attempt.reason}")

    def _run(self, s: Scenario) -> Attempt:
        started = time.monotonic()
        r = self.runner(s, self.out / "runs", self.golden_root)
        checks = r.checks
        fired = sum(1 for c in checks if c["check"] == "fault_fired" and c["verdict"] == "pass")
        ident = identity(checks) if r.verdict == "fail" else None
        reason = "; ".join(f"{c['name']}: {c['detail']}" for c in checks
                           if c["verdict"] == "fail" and c["check"] not in NOT_FINDINGS)
        a = Attempt(name=s.name, verdict=r.verdict, identity=ident, faults=len(s.faults), fired=fired,
                    wall_s=time.monotonic() - started, reason=reason, run_dir=r.run_dir)
        sm = self.summary
        sm.schedules += 1
        sm.faults_planned += a.faults
        sm.faults_fired += fired
        sm.run_s += a.wall_s
        if self.found_at is not None:
            self.shrink_runs += 1
        if ident is not None and ident not in self.known and sm.first_failure_s is None:
            sm.first_failure_s = self.elapsed()
        self.on_event("run", self, a)
        return a

    # -- the whole search ---------------------------------------------------------------------

    def settings(self, round_no: int) -> settings:
        return settings(
            # Each example takes 10-40 s of real training: no per-example deadline; the clock bounds
            # the search (``may_run``), which goes on round after round (``run``). A small cap per
            # round, never derived from the budget (hypothesis draws differently for another
            # max_examples): a longer search with the same seed runs the shorter one's schedules
            # first, and each round starts hypothesis afresh, which spreads the faults sooner than one
            # long round (whose first tenth, up to 50 examples, are its simplest).
            max_examples=EXAMPLES_PER_ROUND,
            deadline=None,
            stateful_step_count=self.max_faults,
            # the project's example database replays earlier failures first, in the first round only
            # (a later round treats known failures as passing, which would evict them)
            database=self.database if round_no == 0 else None,
            # no explain phase: it reruns the failing example many times for a better message
            phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
            # the only health check real runs trip: examples that take seconds. Filtering and data size
            # stay checked.
            suppress_health_check=[HealthCheck.too_slow],
            report_multiple_bugs=False,  # one bug at a time; the next round looks for the next one
            verbosity=Verbosity.quiet,
            print_blob=False,
        )

    def run(self) -> Summary:
        self.started = time.monotonic()
        sm = self.summary
        round_no = 0
        while self.elapsed() < sm.budget_s:
            self.found_at, self.shrink_runs, self.final = None, 0, []
            machine = machine_for(self.kinds)
            factory = lambda: machine(self)  # noqa: E731
            if self.seed is not None:
                factory = hypothesis_seed(self.seed + round_no)(factory)
            sm.rounds += 1
            self.on_event("round", self, round_no)
            try:
                with fixed_constants():
                    run_state_machine_as_test(factory, settings=self.settings(round_no))
                failure = None
            except ScheduleFailed as e:
                failure = e
            except Exception as e:  # hypothesis itself (flaky, health check): say so, stop
                sm.error = f"{type(e).__name__}: {e}"
                break
            round_no += 1
            if failure is None:
                if self.elapsed() < sm.budget_s and self.examples < max(EXAMPLES_PER_ROUND, sm.budget_s / 2):
                    continue  # the round's examples are spent, the budget is not: the next round
                break  # the budget ran out with nothing (new) found
            self._report(failure)
            if self.max_findings is not None and len(sm.findings) + len(sm.not_reproduced) >= self.max_findings:
                break
        sm.wall_s = self.elapsed()
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "summary.json").write_text(json.dumps(sm.to_dict(), indent=1) + "\n")
        return sm

    def _try(self, faults: list[Fault], world_after: int | None, ident: str) -> Attempt | None:
        """The attempt of this schedule if it fails as ``ident`` (run, or recalled from the cache)."""
        try:
            s = build(faults, self.trainer_module, world_after=world_after) if faults else None
        except ScenarioError:
            return None
        if s is None:
            return None
        key = s.to_toml()
        a = self.cache.get(key) or self._run(s)
        self.cache[key] = a
        return a if a.identity == ident else None

    def _reduce(self, faults: list[Fault], world_after: int | None, attempt: Attempt,
                ident: str) -> tuple[list[Fault], int | None, Attempt]:
        """After hypothesis's shrink, drop the resize (if any), then one fault at a time (hangs first,
        then the latest first), keeping each removal after which the schedule still fails the same
        way, until no single fault can go or the shrink time is spent."""
        # Its own share, counted from now: a run hypothesis's shrinker started near the end of its
        # share (a hang: 16 s more, 45 s before stopped ranks were reaped) used to leave nothing for this pass.
        started = time.monotonic()

        def time_left() -> bool:
            return time.monotonic() - started < self.summary.shrink_s * (1 - HYPOTHESIS_SHRINK_SHARE)

        if world_after is not None and time_left() and (a := self._try(faults, None, ident)):
            world_after, attempt = None, a
        smaller_found = True
        while smaller_found and time_left():
            smaller_found = False
            for i in _deletion_order(faults):
                if not time_left():
                    break
                smaller = _without(faults, i)
                if a := self._try(smaller, world_after, ident):
                    faults, attempt, smaller_found = smaller, a, True
                    break  # indices moved: start over (schedules already run are answered from the cache)
        return faults, world_after, attempt

    def _report(self, failure: ScheduleFailed) -> None:
        """Write the shrunk schedule out, load it back, run it again; a finding only if it fails the same way."""
        ident = next(i for i, t in _FAILURE_TYPES.items() if isinstance(failure, t))
        self.known.add(ident)
        faults, world_after, attempt = next(((f, w, a) for f, w, a in reversed(self.final) if a.identity == ident),
                                            (None, None, None))
        if faults is None:  # hypothesis replays the shrunk example once more; that is where it comes from
            self.summary.error = f"no final replay recorded for {ident}"
            return
        faults, world_after, attempt = self._reduce(faults, world_after, attempt, ident)
        name = f"explore-{re.sub(r'[^a-z0-9]+', '-', ident.lower()).strip('-')}-{attempt.name[-6:]}"
        reference = self.trainer_module == "reference_trainer"
        s = build(faults, self.trainer_module, name=name, suites=("default",) if reference else ("explore",),
                  world_after=world_after,
                  description=f"found by ckpt-chaos explore (seed {self.seed}): fails {ident}")
        self.regressions.mkdir(parents=True, exist_ok=True)
        path = self.regressions / f"{name}.toml"
        shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
        header = (f"# Found by `ckpt-chaos explore --trainer {self.trainer_module} --seed {self.seed}`, shrunk to "
                  f"{len(faults)} fault(s).\n# Reproduce: ckpt-chaos run {shown}\n"
                  f"# It failed: {attempt.reason[:400]}\n")
        path.write_text(header + s.to_toml())
        rerun = self.runner(load(path), self.out / "reruns", self.golden_root)
        again = {c["check"] for c in rerun.checks if c["verdict"] == "fail"}
        finding = Finding(identity=ident, scenario=name, faults=len(faults), reason=attempt.reason, file=str(path),
                          reproduced=ident in again, rerun_reason=rerun.reason,
                          found_after_s=self.first_seen.get(ident, 0.0), shrink_runs=self.shrink_runs)
        if finding.reproduced:
            self.summary.findings.append(finding)
        else:  # not a finding: the file goes, the report says why
            path.unlink()
            finding.file = ""
            self.summary.not_reproduced.append(finding)
        self.on_event("finding", self, finding)
