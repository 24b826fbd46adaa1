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
tries each finding without it) and ``remote`` (rules only in its own machine, ``machine_for``: the
uploader killed mid-object, the node's disk lost mid-upload or after a checkpoint became durable, a
reset or a stall on the upload link healed before the final save; moto and the fault proxy make
such a run ~2 s longer).

The search is in modules by concern: ``schedule`` (the families, where a fault strikes, the
scenario a schedule runs as), ``machine`` (the state machine: the story's cursor, and a rule per
``Rule`` of the kinds that have one), ``reduce`` (the deletion pass), ``_hypothesis_compat`` (the
patch of hypothesis's constants, ``fixed_constants``) and this one (the search loop). Each kind's
rule is its ``FaultKind``'s ``search`` (``ckpt_chaos/faults/search_rules.py``): a kind without one
is never scheduled, and the search asks a kind's rule and facts, never its name.

Each example is one real run (``runner.run_scenario``: torchrun, the probe, the nemesis, the
relaunches), made once, in ``teardown``, after the rules have built the schedule; the harness's
checkers are the invariant. A failed check raises, and hypothesis shrinks the schedule.

Coverage: at a few real runs a minute a search runs tens of schedules, and a narrow window (a crash
between two steps of the commit protocol: 2 of 15 places) drawn at random comes up late. So each
rule moves its drawn place onto the places the search has tried least (``least_tried``; the three
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
deletion pass over the faults of what it returned (``reduce``, hangs tried first): one run
removes a whole fault, where the shrinker spends most of its candidates on the values inside the
steps. After the shrink the scenario is written to a file, loaded back and run once more: a
failure that does not fail the same way again is reported as "did not reproduce", never as a
finding. Then the search goes on (a new round, failures of a known identity no longer
interesting) until the budget is spent.
"""

from __future__ import annotations

import collections
import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from hypothesis import HealthCheck, Phase, Verbosity, seed as hypothesis_seed, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.stateful import run_state_machine_as_test

from ckpt_chaos.config import cache_dir, golden_dir, out_dir
from ckpt_chaos.scenario import Fault, Scenario, ScenarioError, load
from ckpt_chaos.search._hypothesis_compat import fixed_constants
from ckpt_chaos.search.machine import machine_for
from ckpt_chaos.search.reduce import reduce
from ckpt_chaos.search.schedule import DEFAULT_FAMILIES, KINDS, build, tries, where

# The search and what it reports; the schedules it draws are search/schedule.py's, the state machine
# that draws them search/machine.py's, the deletion pass search/reduce.py's.
__all__ = ["EXAMPLES_PER_ROUND", "HYPOTHESIS_SHRINK_SHARE", "NOT_FINDINGS", "Attempt", "Finding", "Search",
           "ScheduleFailed", "Summary", "failure_type", "identity"]

# Of a failure's shrinking time, hypothesis's shrinker gets this share; a fault-level deletion pass
# (``reduce``) the rest, on its own clock: at 30-60 s a run, hypothesis alone gets through few candidates.
HYPOTHESIS_SHRINK_SHARE = 0.5
# Examples per hypothesis round; the search runs rounds (seed, seed + 1, ...) until its budget is spent.
EXAMPLES_PER_ROUND = 20

# Checks that say the schedule did not happen as planned, not that the trainer is wrong.
NOT_FINDINGS = ("fault_fired",)


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
        self.families = tuple(families)
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
            machine = machine_for(self.families)
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
        """After hypothesis's shrink, the deletion pass (``reduce``) on its own share of the shrink time."""
        # Its own share, counted from now: a run hypothesis's shrinker started near the end of its
        # share (a hang: 16 s more, 45 s before stopped ranks were reaped) used to leave nothing for this pass.
        started = time.monotonic()

        def time_left() -> bool:
            return time.monotonic() - started < self.summary.shrink_s * (1 - HYPOTHESIS_SHRINK_SHARE)

        return reduce(faults, world_after, attempt, lambda f, w: self._try(f, w, ident), time_left)

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

