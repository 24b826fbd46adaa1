"""What a scenario promises of a ``[command]`` trainer is held to, and what the checks measure of it is
said: one stored run of the plain DDP example (rank 0 killed half-way through its 2nd checkpoint file,
the session's ``plain_ddp_mid_write``) checked again under other declarations of the same trainer."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from ckpt_chaos import cli
from ckpt_chaos.check import judge
from ckpt_chaos.run.runner import run_scenario
from ckpt_chaos.scenario import Fault, Recovery, ScenarioError, from_dict

pytestmark = pytest.mark.slow


def recheck(stored, expect: dict | None = None, command: dict | None = None, when: dict | None = None,
            run_dir: Path | None = None) -> dict[str, tuple[str, str]]:
    """The stored run's checks (or those of ``run_dir``, a changed copy of it) under the scenario with
    ``expect``, ``command`` and its fault's ``when`` keys changed (the files are read only)."""
    s = stored.scenario
    f = s.faults[0]
    s = dataclasses.replace(s, expect=dataclasses.replace(s.expect, **(expect or {})),
                            command=dataclasses.replace(s.command, **(command or {})),
                            faults=[Fault(f.kind, dataclasses.replace(f.when, **(when or {})), f.target, f.attempt,
                                          params=f.params)])
    report = judge.check_run(s, run_dir or stored.run_dir, stored.golden)
    return {c.name: (c.verdict, c.detail) for c in report.checks}


def changed_copy(stored, tmp_path: Path, change) -> Path:
    """A copy of the stored run whose ``history.jsonl`` records went through ``change``."""
    run = tmp_path / "run"
    shutil.copytree(stored.run_dir, run, symlinks=True, ignore=shutil.ignore_patterns("checkpoints"))
    lines = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines() if x.strip()]
    (run / "history.jsonl").write_text("".join(json.dumps(change(r)) + "\n" for r in lines))
    return run


# ---- lost work: expect.max_lost_steps and command.saves_in_flight ----------------------------------

def test_max_lost_steps_is_the_bound_for_a_command_trainer(plain_ddp_mid_write):
    # the example saves every 4 steps, each save whole before the next step: killed half-way through
    # the save of step 8, it resumes from step 4 and trains steps 5..8 again, more than a promise of 3
    c = recheck(plain_ddp_mid_write, expect={"max_lost_steps": 3})
    assert c["lost_work@1"] == ("fail", "4 step(s) trained again, at most 3 allowed (expect.max_lost_steps): it "
                                        "went back to step 4 from 8"), c["lost_work@1"]
    assert recheck(plain_ddp_mid_write, expect={"max_lost_steps": 4})["lost_work@1"][0] == "pass"


def test_saves_in_flight_allows_a_save_more_to_be_lost(plain_ddp_mid_write):
    # a save of the example's is whole before the next step, so at most one is ever in flight
    c = recheck(plain_ddp_mid_write, command={"saves_in_flight": 1})
    assert c["lost_work@1"] == ("pass", "4 step(s) trained again, at most 8 allowed (2 × command.save_every: "
                                        "command.saves_in_flight = 1)"), c["lost_work@1"]


def test_without_a_bound_lost_work_says_what_to_declare(plain_ddp_mid_write):
    c = recheck(plain_ddp_mid_write, command={"save_every": None})
    assert c["lost_work@1"] == ("n/a", "neither command.save_every nor expect.max_lost_steps is given")
    c = recheck(plain_ddp_mid_write, command={"save_every": None}, expect={"max_lost_steps": 4})
    assert c["lost_work@1"][0] == "pass", c["lost_work@1"]


COMMAND = {"argv": ["train.py"], "save_every": 4}


@pytest.mark.parametrize("command, expect, key, message", [
    ({"saves_in_flight": 1, "save_every": None}, {}, "command.saves_in_flight",
     "counts saves of command.save_every steps, which is not given; give command.save_every"),
    ({"saves_in_flight": -1}, {}, "command.saves_in_flight", "-1; use how many saves may still be writing"),
    ({}, {"max_lost_steps": -2}, "expect.max_lost_steps", "-2; use the steps a relaunch may train again"),
])
def test_a_bound_that_cannot_hold_is_refused_naming_the_key(command, expect, key, message):
    table = {"command": {k: v for k, v in {**COMMAND, **command}.items() if v is not None}, "expect": expect}
    with pytest.raises(ScenarioError, match=rf"^s\.toml: {key}: ") as e:
        from_dict(table, "s.toml", "s")
    assert message in str(e.value), e.value


# ---- where a fault on a file write landed ------------------------------------------------------------

TMP = "checkpoints/step_00000008.pt.tmp"  # the example's torch.save writes here, then renames it


def test_a_kill_at_half_of_a_file_is_measured_at_half_of_the_golden_file(plain_ddp_mid_write):
    verdict, detail = {c["name"]: (c["verdict"], c["detail"]) for c in plain_ddp_mid_write.row["checks"]}[
        "fault_0_landed"]
    assert (verdict, detail) == ("pass", f"{TMP} (checkpoints/step_00000008.pt in the golden run) held 11575 of the "
                                         "golden run's 23149 bytes (50%) when the fault fired (on disk as its launch "
                                         "ended), for a trigger at 50%")
    # a trigger at no fraction: where it landed is said all the same
    assert recheck(plain_ddp_mid_write, when={"min_fraction": None})["fault_0_landed"][1].endswith(
        "(50%) when the fault fired (on disk as its launch ended), for a trigger at no fraction")


def test_a_landing_short_of_its_trigger_fails(plain_ddp_mid_write):
    # the same run judged as if its trigger had asked for 80 % of the file: the point came at half
    verdict, detail = recheck(plain_ddp_mid_write, when={"min_fraction": 0.8})["fault_0_landed"]
    assert verdict == "fail" and detail.endswith("(50%) when the fault fired (on disk as its launch ended), for a "
                                                 "trigger at 80%: the point reported a share of the file it did "
                                                 "not have (its plan was not the golden file's size)"), detail


def test_fewer_bytes_on_disk_than_the_point_reported_fail(plain_ddp_mid_write, tmp_path):
    def shrink(rec):
        if rec.get("kind") == "exit" and rec.get("launch") == 0:
            rec["files"][TMP] = 5000
        return rec

    verdict, detail = recheck(plain_ddp_mid_write, run_dir=changed_copy(plain_ddp_mid_write, tmp_path, shrink))[
        "fault_0_landed"]
    assert (verdict, detail) == ("fail", f"{TMP} (checkpoints/step_00000008.pt in the golden run) held 5000 bytes "
                                         "as launch 0 ended, which the fault ended, but the file.write it fired on "
                                         "reported 11575 written: the layer reported progress the file did not have")


# ---- a run with no relaunch -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def no_relaunch(plain_ddp_mid_write, command_golden_root, tmp_path_factory) -> dict:
    """The same kill with no relaunch (its golden run the session's): step 4's file whole, step 8's left
    half written under its temporary name (the example renames it into place only once written and
    fsynced). Its result's row."""
    from ckpt_chaos.report import results

    s = dataclasses.replace(plain_ddp_mid_write.scenario, name="plain-ddp-no-relaunch",
                            recovery=Recovery(relaunch="none"))
    return results.scenario_row(run_scenario(s, tmp_path_factory.mktemp("no-relaunch"), command_golden_root), s)


# ---- ckpt-chaos ckpts on a [command] run -------------------------------------------------------------

def test_ckpts_lists_a_command_runs_checkpoints_whole_or_torn(no_relaunch, capsys):
    run_dir = Path(no_relaunch["run_dir"])
    assert cli.main(["ckpts", "--json", str(run_dir)]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows == {
        "step_00000004.pt": {"name": "step_00000004.pt", "path": "checkpoints/step_00000004.pt", "complete": True,
                             "valid": True, "reason": "", "files": 1, "bytes": 23149, "step": 4, "strays": [],
                             "newest": True},
        "step_00000008.pt.tmp": {"name": "step_00000008.pt.tmp", "path": TMP, "complete": False, "valid": False,
                                 "reason": f"{TMP}: 11575 of 23149 bytes written (the golden run's "
                                           "checkpoints/step_00000008.pt), never completed",
                                 "files": 1, "bytes": 11575, "step": None, "strays": [], "newest": False}}
    # the checkpoint folder itself names the same run
    assert cli.main(["ckpts", str(run_dir / "checkpoints")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("checkpoints: complete = step_*.pt; * the newest complete and whole"), out
    assert out[1].split() == ["*", "step_00000004.pt", "complete", "whole", "step", "4", "1", "file(s)", "23149",
                              "bytes"], out
    assert out[2].split()[:2] == ["step_00000008.pt.tmp", "TORN"], out


# ---- the timings of a [command] run ------------------------------------------------------------------

def test_a_command_runs_timings_are_measured(plain_ddp_mid_write):
    row, run_dir = plain_ddp_mid_write.row, plain_ddp_mid_write.run_dir
    assert row["timings_why"] == {}, row["timings_why"]
    history = [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]
    fault = next(h for h in history if h["kind"] == "fault")
    end = next(h for h in history if h["kind"] == "exit" and h["launch"] == 0)
    # rank 0 is the one killed, so the job noticed when its launch ended
    assert row["time_to_detect_s"] == pytest.approx(end["t"] - fault["t"])
    # back where it was: step 8 trained again by the relaunch
    steps = [json.loads(x) for x in (run_dir / "trajectory.jsonl").read_text().splitlines()]
    back = next(r for r in steps if r["attempt"] == 1 and r["step"] == 8)
    assert row["time_to_recover_s"] == pytest.approx(back["t"] - fault["t"])
    # each save is whole before the loop goes on, so training waits for all of it
    assert 0 < row["save_s"] < row["time_to_recover_s"] and row["save_stall_s"] == row["save_s"]


def test_a_timing_the_run_does_not_allow_says_why_and_the_report_shows_it(no_relaunch, tmp_path):
    from ckpt_chaos.report import results

    why = "no launch came after launch 0, which the fault hit"
    assert no_relaunch["time_to_recover_s"] is None and no_relaunch["timings_why"] == {"time_to_recover_s": why}
    assert no_relaunch["time_to_detect_s"] > 0 and no_relaunch["save_s"] > 0  # step 4's save, whole
    html = results.render(tmp_path, "t", [no_relaunch], 1.0, plots=False).read_text()
    assert f'<td class="num why" title="{why}">&ndash;</td>' in html
    assert f'<p class="timings">Not measured: <b>recover (s)</b>: {why}</p>' in html
