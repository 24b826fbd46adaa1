"""The fault-schedule search (ckpt_chaos/search/explore.py): what it generates, how it shrinks, what it reports.

The fast tests drive the real state machine and search loop with checkers that run no training
(a verdict computed from the schedule, or one that changes between runs); the slow one searches
against a planted-bug trainer for real.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from ckpt_chaos.search import explore
from ckpt_chaos.search.explore import Search, identity
from ckpt_chaos.search.reduce import _deletion_order
from ckpt_chaos.check.verdict import Report
from ckpt_chaos.run.runner import Result, run_scenario
from ckpt_chaos.scenario import Fault, Trigger, from_dict, load
from ckpt_chaos.search.schedule import (DEFAULT_FAMILIES, ERRNO_SITES, MAX_LAUNCHES, SAVE_POINTS, STEP_POINTS, TRAINER,
                                        rules, tries, where)


def _checks(*checks: tuple[str, str, str]) -> list[dict]:
    """Checks as the checker writes them, from (name, verdict, detail): ``fault_N_x`` is about fault
    N, ``x@y`` about y."""
    report = Report()
    for name, verdict, detail in checks:
        if "@" in name:
            report.add(name.split("@")[0], verdict, detail, at=name.split("@")[1])
        elif name.startswith("fault_"):
            report.add(name.split("_", 2)[2], verdict, detail, fault=int(name.split("_")[1]))
        else:
            report.add(name, verdict, detail)
    assert [c.name for c in report.checks] == [c[0] for c in checks]
    return [dataclasses.asdict(c) for c in report.checks]


def _result(s, failed: dict[str, str]) -> Result:
    """A Result as the checker writes it: every fault fired, plus the given failed checks."""
    checks = _checks(*[(f"fault_{i}_fired", "pass", "fired") for i in range(len(s.faults))],
                     *[(n, "fail", d) for n, d in failed.items()])
    return Result(scenario=s.name, verdict="fail" if failed else "pass", checks=checks,
                  reason="; ".join(f"{n}: {d}" for n, d in failed.items()))


def _round_tripping_runner(seen: list):
    """A runner that checks each generated scenario validates and survives TOML unchanged (as
    `ckpt-chaos run FILE` would load it), keeps it in ``seen``, and passes it without training."""
    def runner(s, out, golden):
        text = s.to_toml()
        assert from_dict(tomllib.loads(text), "round-trip", s.name).to_toml() == text
        seen.append(s)
        return _result(s, {})

    return runner


def test_generated_schedules_validate_round_trip_and_follow_the_story(tmp_path):
    seen = []
    sm = Search(runner=_round_tripping_runner(seen), budget_s=400, database=None, seed=3, out=tmp_path).run()
    assert sm.schedules == len(seen) >= 40 and not sm.findings and not sm.error
    kinds = collections.Counter(f.kind for s in seen for f in s.faults)
    # every kind with a rule in the default families is drawn (a kind added with one too), and no other
    drawable = {kind.name for kind, r in rules() if r.family in DEFAULT_FAMILIES}
    assert {"kill", "term", "stop", "raise", "errno", "disk_full", "slow", "power_loss", "corrupt"} <= drawable
    assert set(kinds) == drawable
    for s in seen:
        launches = [f.attempt for f in s.faults]
        assert launches == sorted(launches) and max(launches) <= MAX_LAUNCHES
        assert s.recovery.max_restarts == max(launches) + 1  # one spare relaunch
        for i, f in enumerate(s.faults):
            if f.kind == "term":  # a preemption needs a micro-batch after it
                assert (f.when.step or int(f.when.name[5:])) < TRAINER["max_steps"]
            if f.kind == "corrupt":  # always followed by a crash at the same point, so a relaunch judges it
                assert s.faults[i + 1].kind == "kill" and s.faults[i + 1].when == f.when
        if any(f.spec.fills_disk for f in s.faults):
            assert s.storage.fs == "tmpfs"
        assert s.expect.resume_from is None and s.expect.job_fails is None
    # Swarm testing: examples enable a subset of the kinds, so many multi-fault schedules use one kind only.
    single_kind = [s for s in seen if len(s.faults) >= 2 and len({f.kind for f in s.faults}) == 1]
    assert len(single_kind) >= 3


def _order(f) -> tuple[int, int] | None:
    """When a fault's trigger comes in its launch: (step, phase), a save's points after its step's."""
    t = f.when
    if t.point in STEP_POINTS:
        return t.step, STEP_POINTS.index(t.point)
    if t.point in SAVE_POINTS and t.name:
        return int(t.name[5:]), len(STEP_POINTS) + SAVE_POINTS.index(t.point)
    return None


def test_each_launchs_faults_come_in_order_and_only_where_the_saves_still_get_to(tmp_path):
    """The story stays possible: a launch's faults in the order of their events, one fault that fills the
    disk a launch, and nothing at a point of a save that an earlier errno (or the full disk) already failed. Such a
    fault never fires: a fifth of the faults planned were, before the generator knew."""
    seen = []
    Search(runner=_round_tripping_runner(seen), budget_s=400, database=None, seed=3, out=tmp_path).run()
    for s in seen:
        for launch in range(max(f.attempt for f in s.faults) + 1):
            faults = [f for f in s.faults if f.attempt == launch]
            orders = [o for f in faults if (o := _order(f)) is not None]
            assert orders == sorted(orders), f"{s.name}: launch {launch} out of order"
            assert sum(f.spec.fills_disk for f in faults) <= 1, f"{s.name}: a second fault that fills the disk"
            dies: dict[int, int] = {}  # save step -> first index in SAVE_POINTS it no longer reaches
            full_from = None
            for f in faults:
                o = _order(f)
                if o is not None and o[1] >= len(STEP_POINTS):
                    save, i = o[0], o[1] - len(STEP_POINTS)
                    limit = min(dies.get(save, 99), 1 if full_from is not None and save >= full_from else 99)
                    reached = i + (f.kind == "errno")  # an errno's call comes after its trigger point
                    assert reached < limit, f"{s.name}: {f.kind} at {f.when.point} of {f.when.name} is never reached"
                    if f.spec.fails_saves:
                        dies[save] = min(dies.get(save, 99), i + 1)
                    if f.spec.fills_disk:
                        full_from = save if i == 0 else save + TRAINER["ckpt_every_steps"]
                elif f.spec.fills_disk:
                    full_from = f.when.step


def test_a_seed_draws_the_same_schedules_whatever_the_process_imported(tmp_path, monkeypatch):
    """hypothesis draws some integers from constants it finds in the modules the process imported;
    the search keeps that pool fixed, so the CLI, a benchmark and a test run the same schedules."""
    from hypothesis.internal.conjecture import providers

    def first_schedules():
        seen = []
        providers.CONSTANTS_CACHE.cache.clear()
        Search(runner=_round_tripping_runner(seen), budget_s=100, database=None, seed=2, out=tmp_path).run()
        return [s.to_toml() for s in seen[:30]]

    monkeypatch.setattr(providers, "_get_local_constants", lambda: providers.Constants())
    few = first_schedules()
    # As if the process had imported modules full of small numbers (a benchmark script, the runner).
    monkeypatch.setattr(providers, "_get_local_constants", lambda: providers.Constants(integers=set(range(-5, 60))))
    many = first_schedules()
    assert len(few) == 30 and few == many


def test_the_topology_family_relaunches_on_fewer_ranks_and_aims_at_ranks_that_exist(tmp_path):
    seen = []
    sm = Search(runner=_round_tripping_runner(seen), families=("process", "topology"), budget_s=300, database=None, seed=5,
                out=tmp_path).run()
    assert not sm.error and not sm.findings
    resized = [s for s in seen if s.recovery.world_size == 1]
    # Every schedule with a relaunch resizes (not a swarm-switchable rule: a bug that only a smaller
    # world shows must be reachable in every example).
    relaunched = [s for s in seen if any(f.attempt > 0 for f in s.faults)]
    assert resized and all(s.recovery.world_size == 1 for s in relaunched)
    for s in resized:
        assert s.expect.trajectory == "tolerance" and "topology" in s.labels
        for f in s.faults:
            if f.attempt > 0:  # the relaunches run on rank 0 alone, and a stop there would hang any trainer
                assert f.when.rank in (None, 0) and f.target in ("triggering", "all", "rank:0")
                assert f.kind != "stop"
    assert all(s.expect.trajectory == "bit-exact" for s in seen if s.recovery.world_size is None)


def test_a_longer_search_with_the_same_seed_runs_the_shorter_ones_schedules_first(tmp_path):
    """So a longer budget finds at least what a shorter one found (hypothesis draws differently for
    another max_examples: the cap must not come from the budget)."""
    short, long = [], []
    Search(runner=_round_tripping_runner(short), budget_s=100, database=None, seed=4, out=tmp_path / "s").run()
    Search(runner=_round_tripping_runner(long), budget_s=400, database=None, seed=4, out=tmp_path / "l").run()
    assert len(short) >= 30
    assert [s.to_toml() for s in short[:30]] == [s.to_toml() for s in long[:30]]


def test_every_schedule_run_tries_something_new_and_crashes_spread_over_every_point(tmp_path):
    """Coverage: a schedule whose every fault place and pair of faults was tried is not run, and
    fault places are drawn least-tried first, so a narrow window (a crash between two steps of the
    commit protocol, an I/O error on a shard) comes up within the first few dozen schedules."""
    seen = []
    sm = Search(runner=_round_tripping_runner(seen), budget_s=400, database=None, seed=3, out=tmp_path).run()
    assert sm.nothing_new > 0
    tried = set()
    for s in seen:
        assert not tries(s.faults) <= tried, f"{s.name} tried nothing new"
        tried |= tries(s.faults)
    first = seen[:40]
    crash_points = {where(f)[1] for s in first for f in s.faults if where(f)[0] == "crash"}
    assert len(crash_points) == 15  # every step, save and recovery point
    errno_sites = {where(f)[1] for s in first for f in s.faults if f.kind == "errno"}
    assert errno_sites == {f"{call}@{point}" for call, _, _, point in ERRNO_SITES}


def test_a_kill_of_the_peer_while_rank_0_commits_is_not_counted_as_a_crash_there():
    """Rank 0 finishes that commit: the window between two of its steps stays untried until rank 0 dies in it."""
    f = Fault(kind="kill", when=Trigger(point="ckpt.fsync", rank=0, name="step_00000002"), target="rank:1")
    assert where(f) == ("peer_kill", "ckpt.fsync")
    assert where(dataclasses.replace(f, target="triggering")) == ("crash", "ckpt.fsync")


def test_unfired_faults_are_not_findings_and_a_failure_is_named_without_its_numbers():
    checks = _checks(("fault_0_fired", "fail", ""), ("fault_1_surfaced", "fail", ""), ("lost_work@1", "fail", ""))
    assert identity(checks[:1]) is None
    assert identity(checks) == "fault_surfaced"
    assert identity(checks[2:]) == "lost_work"
    # checks that could not tell or do not apply are no findings either
    assert identity(_checks(("detected_in_time", "unknown", ""), ("fault_0_detected", "n/a", ""))) is None


def test_a_failure_shrinks_to_the_fault_that_causes_it_and_is_written_out(tmp_path):
    # A checker that fails every schedule with a SIGKILL of rank 1 at a save point: the minimal
    # failing schedule is that one fault.
    def runner(s, out, golden):
        bad = any(f.kind == "kill" and f.when.point.startswith("ckpt.") for f in s.faults)
        return _result(s, {"committed_survives@0": "lost"} if bad else {})

    sm = Search(runner=runner, budget_s=400, shrink_s=60, database=None, seed=1, out=tmp_path,
                regressions=tmp_path / "regressions", max_findings=1).run()
    assert len(sm.findings) == 1 and not sm.not_reproduced
    f = sm.findings[0]
    assert f.identity == "committed_survives" and f.reproduced and f.faults == 1
    s = load(f.file)  # the written file is a catalogue scenario
    assert [x.kind for x in s.faults] == ["kill"] and s.faults[0].when.point.startswith("ckpt.")
    # a failure of the reference trainer is a regression: it joins the default suite
    assert s.suites == ["default", "full"] and s.trainer_module == "reference_trainer"
    assert "Reproduce: ckpt-chaos run" in open(f.file).read()


def test_the_deletion_pass_tries_to_drop_hangs_first():
    """A SIGSTOP hang adds the 15 s collective timeout (45 s before the runner reaped stopped ranks) to every run that keeps it and is rarely the cause: the deletion pass
    tries it before anything else (with 60 s of deletion time, a schedule with a hang got one run),
    then the latest faults first."""
    faults = [SimpleNamespace(kind=k) for k in ("kill", "stop", "errno", "stop")]
    assert _deletion_order(faults) == [3, 1, 2, 0]


def test_a_failure_that_does_not_reproduce_is_reported_so(tmp_path):
    # A flaky checker: each schedule fails the first time it is run and passes after. The search
    # finds and shrinks a failure (repeats come from its cache), then runs the written file again.
    runs = collections.Counter()

    def flaky(s, out, golden):
        runs[repr(s.faults)] += 1  # the schedule, whatever the file's name and description
        return _result(s, {"trajectory": "diverges"} if runs[repr(s.faults)] == 1 else {})

    sm = Search(runner=flaky, budget_s=60, shrink_s=30, database=None, seed=2, out=tmp_path / "o",
                regressions=tmp_path / "found", max_findings=1).run()
    assert not sm.findings
    assert len(sm.not_reproduced) == 1
    f = sm.not_reproduced[0]
    assert f.identity == "trajectory" and not f.reproduced and f.file == ""
    assert not list((tmp_path / "found").glob("*.toml"))  # nothing left to mistake for a regression


def test_a_schedule_drawn_again_is_recalled_from_the_cache_not_run_again(tmp_path):
    runs = []

    def runner(s, out, golden):
        runs.append(s.to_toml())
        return _result(s, {})

    sm = Search(runner=runner, budget_s=60, shrink_s=0, database=None, seed=0, out=tmp_path,
                regressions=tmp_path / "r", max_findings=1)
    kill = [Fault(kind="kill", target="rank:1", when=Trigger(point="ckpt.shard.write", rank=1, save=1))]
    sm.judge(kill, final=True)  # final: judged whatever is left of the budget (the search's clock has not started)
    sm.judge(kill, final=True)
    assert len(runs) == 1 and sm.summary.cache_hits == 1 and sm.summary.schedules == 1


def test_a_raised_out_of_memory_is_torchs_own_error():
    """What a ``raise`` fault with ``error = "oom"`` raises in the rank (the search draws it)."""
    import torch

    from ckpt_chaos.probe import _exception

    e = _exception("oom", "at step.end")
    assert isinstance(e, torch.OutOfMemoryError) and "simulated out of memory: at step.end" in str(e)


# Nightly: the search runs in `make chaos` (90 s against the reference trainer); what only this run
# reached is held by the two tests above.
@pytest.mark.nightly
@pytest.mark.slow
def test_search_finds_rng_not_saved_and_shrinks_it_to_a_reproducing_file(tmp_path, golden_root):
    sm = Search(trainer_module="tests.planted.rng_not_saved", families=("process",), budget_s=150, shrink_s=90,
                seed=0, database=None, out=tmp_path / "search", golden_root=golden_root,
                max_findings=1).run()
    assert sm.findings, f"nothing found in {sm.schedules} schedules: {sm.to_dict()}"
    f = sm.findings[0]
    assert f.identity == "trajectory" and f.reproduced and 1 <= f.faults <= 3
    assert str(tmp_path) in f.file  # a planted trainer's failure stays out of scenarios/regressions
    s = load(f.file)
    assert s.trainer_module == "tests.planted.rng_not_saved"
    # The written file fails the same way under the real runner (the search already did this once).
    r = run_scenario(s, tmp_path / "again", golden_root)
    assert r.verdict == "fail" and "rng state differs" in r.reason


def test_the_remote_family_builds_valid_remote_scenarios(tmp_path):
    seen = []
    sm = Search(runner=_round_tripping_runner(seen), families=("process", "remote"), budget_s=300, database=None, seed=7,
                out=tmp_path).run()
    assert not sm.error and not sm.findings
    remote = [s for s in seen if s.remote is not None]
    kinds = collections.Counter(f.kind for s in remote for f in s.faults)
    assert kinds["lose_disk"] and kinds["toxic"] and any(f.target == "uploader" for s in remote for f in s.faults)
    for s in remote:
        assert s.trainer["step_delay_s"] > 0  # uploads are under way when faults aim at them
        for i, f in enumerate(s.faults):
            if f.kind == "toxic":  # healed before the final save, or final_durable would fail any trainer
                assert s.faults[i + 1].kind == "heal" and s.faults[i + 1].when.step == TRAINER["max_steps"]
            if f.target == "uploader" and i + 1 < len(s.faults):  # the uploader's death does not end the launch
                assert s.faults[i + 1].attempt == f.attempt
    assert all(s.remote is None for s in seen if not any(f.kind in ("lose_disk", "toxic") or f.target == "uploader"
                                                         for f in s.faults))


def test_the_search_module_exports_only_what_it_defines():
    """No facade: what explore.py exports is its own and public; the rest is imported where it is defined."""
    tree = ast.parse(Path(explore.__file__).read_text())
    own = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    own |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert [n for n in explore.__all__ if n.startswith("_") or n not in own] == []
