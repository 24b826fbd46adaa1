"""The checks that hold a trainer to its own promises (ckpt_chaos/check/promises.py), on histories
written here: retention keeps exactly what its declared policy promises, a committed checkpoint is
gone only through retention or kept aside when rejected, and the relaunch cases are generated from
every field the trainer declares (no processes)."""

from __future__ import annotations

import dataclasses

import pytest

from ckpt_chaos.check.history import Exited, FaultFired
from ckpt_chaos.check.promises import (UNCHANGEABLE, command_retention, committed_kept, final_directory,
                                       refused_keys, relaunch_cases, save_failure_policy)
from ckpt_chaos.check.verdict import Report, Run
from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.scenario import Command, Scenario, ScenarioError, load, validate

N4, N8, N12 = "step_00000004", "step_00000008", "step_00000012"


def _snap(*names: str, rejected: dict | None = None, bad: dict | None = None) -> dict:
    snap = {"checkpoints": {n: (bad or {}).get(n) for n in names}, "latest": names[-1] if names else None,
            "strays": [], "newest_valid": names[-1] if names else None}
    if rejected is not None:
        snap["rejected"] = rejected
    return snap


def _commit(name: str, t: float, attempt: int = 0, loss: float | None = None) -> dict:
    return {"event": "committed", "name": name, "t": t, "attempt": attempt, "loss": loss}


def _run(tmp_path, events, exits, trainer=None, faults=(), s=None) -> Run:
    s = s or Scenario(name="x", trainer={"max_steps": 12, "ckpt_every_steps": 4, **(trainer or {})})
    return Run(s, tmp_path, tmp_path, [*faults, *exits], events)


def _checks(run: Run, make=final_directory) -> dict[str, tuple[str, str]]:
    report = Report()
    make(run, report)
    return {c.name: (c.verdict, c.detail) for c in report.checks}


# ---- retention ------------------------------------------------------------------------------------------

def _retention(tmp_path, final: tuple[str, ...], trainer=None, deleted=((N4,), ()), crash_kept=(N4,)):
    events = [_commit(N4, 1.0), {"event": "loaded", "attempt": 1, "name": N4, "step": 4, "t": 3.0},
              _commit(N8, 4.0, 1), {"event": "retention", "attempt": 1, "t": 4.1, "deleted": list(deleted[0])},
              _commit(N12, 5.0, 1), {"event": "retention", "attempt": 1, "t": 5.1, "deleted": list(deleted[1])},
              {"event": "finished", "attempt": 1, "t": 6.0}]
    exits = [Exited(t=2.0, launch=0, rc=-9, snapshot=_snap(*crash_kept)),
             Exited(t=6.5, launch=1, rc=0, snapshot=_snap(*final))]
    return _checks(_run(tmp_path, events, exits, trainer))["retention"]


def test_retention_fails_one_checkpoint_fewer_than_keep_last_naming_the_missing_one(tmp_path):
    verdict, detail = _retention(tmp_path, (N12,), deleted=((N4,), (N8,)))
    assert verdict == "fail"
    assert "a retention pass of launch 1 deleted step_00000004, one of the last 2 valid checkpoints keep_last=2 " \
           "promises (step_00000008, step_00000004)" in detail
    assert "after launch 1 kept 1 of the last 2 valid checkpoints keep_last=2 promises: missing step_00000008" \
           in detail


def test_retention_passes_exactly_the_last_k_and_fails_one_more(tmp_path):
    verdict, detail = _retention(tmp_path, (N8, N12), deleted=((), (N4,)))
    assert verdict == "pass", detail
    assert "exactly what keep_last=2 promises" in detail
    verdict, detail = _retention(tmp_path, (N4, N8, N12), deleted=((), ()))
    assert verdict == "fail"
    assert "kept step_00000004 at the end, which no promise of keep_last=2 accounts for" in detail


def test_one_too_many_kept_is_no_broken_promise_where_no_pruning_could_run_after_it(tmp_path):
    """step_00000004 became one too many with step_00000012's commit, and the launch died right after it
    (before its retention pass), and no later save succeeded: a trainer that prunes after each save
    had no chance to delete it (found by the search: a power cut at a commit, then a full disk). Once
    a pass could run after that commit and kept it, the promise is broken."""
    events = [_commit(N4, 1.0), _commit(N8, 2.0), _commit(N12, 3.0),
              {"event": "loaded", "attempt": 1, "name": N12, "step": 12, "t": 5.0},
              {"event": "finished", "attempt": 1, "t": 6.0}]
    exits = [Exited(t=3.5, launch=0, rc=-9, snapshot=_snap(N4, N8, N12)),
             Exited(t=6.5, launch=1, rc=0, snapshot=_snap(N4, N8, N12))]
    verdict, detail = _checks(_run(tmp_path, events, exits))["retention"]
    assert verdict == "pass", detail
    assert "step_00000004, which no retention pass had the chance to delete" in detail
    events.insert(3, {"event": "retention", "attempt": 0, "t": 3.1, "deleted": []})
    verdict, detail = _checks(_run(tmp_path, events, exits))["retention"]
    assert verdict == "fail", detail
    assert "kept step_00000004 at the end, which no promise of keep_last=2 accounts for" in detail


def test_retention_counts_milestones_and_the_best_as_promised(tmp_path):
    trainer = {"keep_last": 1, "keep_every": 8}
    assert _retention(tmp_path, (N8, N12), trainer, deleted=((N4,), ()))[0] == "pass"
    verdict, detail = _retention(tmp_path, (N4, N8, N12), trainer, deleted=((), ()))
    assert verdict == "fail" and "kept step_00000004" in detail and "keep_last=1, keep_every=8" in detail


def test_a_checkpoint_damaged_in_place_takes_its_place_among_the_last_k_but_is_not_owed(tmp_path):
    corrupt = FaultFired(t=1.5, index=0, fault="corrupt", target="triggering", launch=0,
                         at={"point": "step.begin", "rank": 0, "info": {}}, detail={"checkpoint": N8})
    s = Scenario(name="x", trainer={"keep_last": 2}, faults=[_corrupt_fault()])
    events = [_commit(N4, 1.0), _commit(N8, 1.2), {"event": "finished", "attempt": 0, "t": 3.0}]
    exits = [Exited(t=3.5, launch=0, rc=0, snapshot=_snap(N4, N8, bad={N8: "checksum mismatch"}))]
    verdict, detail = _checks(_run(tmp_path, events, exits, faults=[corrupt], s=s))["retention"]
    assert verdict == "pass", detail


def _corrupt_fault():
    from ckpt_chaos.scenario import Fault, Trigger

    return Fault(kind="corrupt", when=Trigger(point="step.begin", rank=0, step=3), corruption="flip",
                 file="__0_0.distcp", checkpoint="newest")


def test_retention_of_a_run_that_did_not_finish_judges_only_the_crashes(tmp_path):
    events = [_commit(N4, 1.0), _commit(N8, 1.5)]
    exits = [Exited(t=2.0, launch=0, rc=-9, snapshot=_snap(N8))]
    verdict, detail = _checks(_run(tmp_path, events, exits))["retention"]
    assert verdict == "fail" and "after launch 0 kept 1 of the last 2" in detail and "missing step_00000004" in detail
    exits = [Exited(t=2.0, launch=0, rc=-9, snapshot=_snap(N4, N8))]
    assert "retention" not in _checks(_run(tmp_path, events, exits))  # no verdict: nothing wrong, no end seen


# ---- committed data -------------------------------------------------------------------------------------

def _committed(tmp_path, rejected: dict | None, note_failed: bool = False):
    events = [_commit(N4, 1.0), _commit(N8, 1.5),
              {"event": "ckpt_rejected", "attempt": 1, "name": N8, "reason": "__0_0.distcp: checksum mismatch",
               "t": 3.0},
              *([{"event": "quarantine_note_failed", "attempt": 1, "name": N8, "t": 3.1}] if note_failed else []),
              _commit(N8, 4.0, 1), _commit(N12, 5.0, 1),
              {"event": "retention", "attempt": 1, "t": 5.1, "deleted": [N4]},
              {"event": "finished", "attempt": 1, "t": 6.0}]
    exits = [Exited(t=2.0, launch=0, rc=-9, snapshot=_snap(N4, N8)),
             Exited(t=6.5, launch=1, rc=0, snapshot=_snap(N8, N12, rejected=rejected))]
    return _checks(_run(tmp_path, events, exits), committed_kept)["committed_kept"]


def test_committed_kept_explains_each_checkpoint_gone_by_retention_or_kept_aside_with_its_reason(tmp_path):
    verdict, detail = _committed(tmp_path, {N8 + ".1732712345678": "__0_0.distcp: checksum mismatch"})
    assert verdict == "pass", detail
    assert "4 commit(s), each accounted for: 2 kept, 1 removed by retention, 1 kept aside" in detail
    # on a full disk the note cannot be written: the reason is in events.jsonl
    assert _committed(tmp_path, {N8 + ".1732712345678": None}, note_failed=True)[0] == "pass"


def test_committed_kept_fails_a_rejected_checkpoint_that_was_deleted_naming_it(tmp_path):
    verdict, detail = _committed(tmp_path, {})
    assert verdict == "fail"
    assert "step_00000008, committed by launch 0, was rejected on load (__0_0.distcp: checksum mismatch) and is " \
           "gone: not kept aside in rejected/ with its reason" in detail
    verdict, detail = _committed(tmp_path, {N8 + ".1732712345678": None})
    assert verdict == "fail" and "moved to rejected/step_00000008.1732712345678 without its reason" in detail


def test_committed_kept_is_unknown_where_the_snapshot_does_not_list_what_was_kept_aside(tmp_path):
    verdict, detail = _committed(tmp_path, None)
    assert verdict == "unknown" and "whether it was kept aside is not known" in detail


def test_committed_kept_fails_a_checkpoint_gone_without_retention_or_rejection(tmp_path):
    events = [_commit(N4, 1.0), _commit(N8, 1.5), {"event": "finished", "attempt": 0, "t": 3.0}]
    exits = [Exited(t=3.5, launch=0, rc=0, snapshot=_snap(N8, rejected={}))]
    verdict, detail = _checks(_run(tmp_path, events, exits), committed_kept)["committed_kept"]
    assert verdict == "fail"
    assert detail == ("step_00000004, committed by launch 0, is gone at the end: no retention pass reported deleting "
                      "it and no load rejected it")


# ---- what a failed save does ---------------------------------------------------------------------------

def test_a_save_failed_under_policy_stop_must_end_its_launch_non_zero_with_no_step_after(tmp_path):
    """The emergency save of a preemption failed, and the trainer, whose policy is to stop, swallowed
    the error and exited 0: the scheduler takes that for a clean end."""
    (tmp_path / "trajectory.jsonl").write_text("".join(
        f'{{"attempt": 0, "step": {n}, "t": {n}.0, "loss": 1.0}}\n' for n in (5, 6, 7)))
    failed = {"event": "save_failed", "attempt": 0, "name": "step_00000006.001", "reason": "preempt",
              "policy": "stop", "t": 6.5}

    def verdict(rc, t=6.5, policy="stop"):
        events = [{**failed, "t": t, "policy": policy}]
        checks = _checks(_run(tmp_path, events, [Exited(t=9.0, launch=0, rc=rc, snapshot=_snap(N4))]),
                         save_failure_policy)
        return checks.get("save_failure_policy", (None, None))

    assert verdict(1, t=7.5)[0] == "pass"
    v, detail = verdict(0)
    assert v == "fail" and "exited with status 0" in detail and "after training on to step 7" in detail, detail
    v, detail = verdict(1, t=5.5)
    assert v == "fail" and "trained on to step 7 before it exited (status 1)" in detail, detail
    assert verdict(0, policy="continue") == (None, None)  # going on is what that policy promises


# ---- configuration on relaunch --------------------------------------------------------------------------

BASE = builtin_scenarios() / "process" / "relaunch-with-changed-lr-is-refused.toml"


def test_the_keys_a_relaunch_must_refuse_are_those_the_reference_trainer_declares():
    from reference_trainer.config import RESUMABLE_CHANGES, TrainConfig

    s = load(BASE)
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert refused_keys(s) == fields - RESUMABLE_CHANGES
    assert refused_keys(dataclasses.replace(s, trainer_module="tests.planted.refuses_only_lr")) == refused_keys(s)
    assert refused_keys(dataclasses.replace(s, trainer_module="my_trainer")) == {"lr"}  # its expect.refused only


def test_a_relaunch_case_is_generated_for_every_declared_field_or_left_out_with_why():
    from reference_trainer.config import RESUMABLE_CHANGES, TrainConfig

    cases, left_out = relaunch_cases(load(BASE))
    fields = [f.name for f in dataclasses.fields(TrainConfig)]
    assert sorted([c.field for c in cases] + list(left_out)) == sorted(fields)
    assert set(left_out) == set(UNCHANGEABLE)
    for c in cases:
        assert c.refused == (c.field not in RESUMABLE_CHANGES)
        assert c.scenario.recovery.changes == [{c.field: c.value}]
        assert c.scenario.expect.refused == ([c.field] if c.refused else [])
        assert c.value != {**TrainConfig().to_dict(), **c.scenario.trainer}[c.field]
        validate(c.scenario)  # a case is a scenario the loader accepts
    by_field = {c.field: c for c in cases}
    assert by_field["seed"].refused and not by_field["keep_last"].refused


# ---- a [command] trainer --------------------------------------------------------------------------------

class _Evidence:
    def __init__(self, steps):
        self.steps = steps

    def checkpoint_of(self, path):
        return "checkpoints/" + path.split("/")[1]

    def saved_steps(self):
        return self.steps


def test_a_command_trainer_that_declares_keep_last_keeps_exactly_its_newest_k(tmp_path):
    s = Scenario(name="x", command=Command(argv=["train.py"], complete="step_*.pt", keep_last=2))
    steps = {"checkpoints/step_4.pt": 4, "checkpoints/step_8.pt": 8, "checkpoints/step_12.pt": 12,
             "checkpoints/latest": 12}

    def verdict(*kept):
        exits = [Exited(t=6.5, launch=1, rc=0, snapshot=_snap(), complete={f"checkpoints/{k}": [1, 1] for k in kept})]
        report = Report()
        run = Run(s, tmp_path, tmp_path, exits, [])
        run.evidence = _Evidence(steps)  # the files' evidence, as check/evidence.py would give it
        command_retention(run, report)
        (c,) = report.checks
        return c.verdict, c.detail

    assert verdict("step_8.pt", "step_12.pt")[0] == "pass"
    v, detail = verdict("step_12.pt")
    assert v == "fail" and detail == ("kept 1 of the last 2 checkpoints keep_last=2 promises: missing "
                                      "checkpoints/step_8.pt")
    v, detail = verdict("step_4.pt", "step_8.pt", "step_12.pt")
    assert v == "fail" and "kept checkpoints/step_4.pt, older than the last 2" in detail


@pytest.mark.parametrize("keys,key,words", [("keep_last = 0", "command.keep_last", "0"),
                                            ("keep_last = 2\ncomplete = { pointer = \"latest\" }", "command.keep_last",
                                             "a pointer names one checkpoint")], ids=["zero", "pointer"])
def test_the_loader_refuses_a_command_keep_last_it_cannot_check(tmp_path, keys, key, words):
    path = tmp_path / "x.toml"
    path.write_text(f"[command]\nargv = [\"train.py\"]\n{keys}\n")
    with pytest.raises(ScenarioError) as e:
        load(path)
    assert str(path) in str(e.value) and key in str(e.value) and words in str(e.value)


# ---- the generated relaunch cases, run: every one nightly, the seed's in make test ----------------------

CASES, _ = relaunch_cases(load(BASE))


@pytest.mark.parametrize("case", [pytest.param(c, id=c.field, marks=[pytest.mark.slow] + (
    [] if c.field == "seed" else [pytest.mark.nightly])) for c in CASES])
def test_the_reference_trainer_keeps_its_promise_about_each_field_changed_on_a_relaunch(tmp_path, golden_root, case):
    from ckpt_chaos.run.runner import run_scenario

    r = run_scenario(case.scenario, tmp_path, golden_root)
    assert r.verdict == "pass", r.reason
    verdicts = {c["name"]: c["verdict"] for c in r.checks}
    assert verdicts["config_refused@1" if case.refused else "config_accepted@1"] == "pass", verdicts
