"""Scenarios under a real throwaway Slurm cluster: Slurm's own preemption and requeue catch the
planted bugs a scheduler exposes, bad Slurm scenarios are refused with the fix, and a run cut
short by Ctrl-C leaves nothing behind. (The six catalogue scenarios themselves run in the
default suite, ``make chaos``.)"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpt_chaos.check.history import LaunchStarted, of, read_history
from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.env.slurm import leftovers, listening, missing
from ckpt_chaos.run.runner import run_scenario
from ckpt_chaos.scenario import ScenarioError, from_dict, load
from tests.helpers import REPO, golden_of_the_reference

NO_SLURM = missing()
SCENARIOS = builtin_scenarios() / "slurm"


def run(tmp_path, golden_root, scenario_file: str, module: str):
    s = dataclasses.replace(load(SCENARIOS / scenario_file), trainer_module=module)
    golden_of_the_reference(s, golden_root)
    return run_scenario(s, tmp_path, golden_root)


def checks(result) -> dict[str, tuple[str, str]]:
    return {c["name"]: (c["verdict"], c["detail"]) for c in result.checks}


slurm = pytest.mark.skipif(NO_SLURM is not None, reason=f"no Slurm cluster here: {NO_SLURM}")


@slurm
@pytest.mark.slow
def test_a_trainer_that_ignores_sigterm_wastes_the_grace_period_and_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "slurm-preempt-mid-shard-write-grace-honoured.toml", "tests.planted.ignores_sigterm")
    assert r.verdict == "fail"
    c = checks(r)
    assert c["fault_0_preemption_handled"] == (
        "fail", "the job did not stop with an emergency checkpoint after Slurm's SIGTERM"), c
    # the job was requeued all the same (its batch script saw the preemption), and lost the step-8 work
    assert c["fault_0_requeued"][0] == "pass", c
    assert "launch 1 ran with SLURM_RESTART_COUNT=1" in c["fault_0_requeued"][1], c
    assert r.resumed_from == ["step_00000004"], r.resumed_from
    assert c["lost_work@1"][0] == "fail", c


@slurm
@pytest.mark.slow
def test_a_checkpoint_folder_keyed_on_the_restart_count_is_caught_resuming_from_scratch(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "slurm-kill-rank1-mid-shard-write.toml", "tests.planted.ckpt_dir_per_restart")
    assert r.verdict == "fail"
    failed = {k: d for k, (v, d) in checks(r).items() if v == "fail"}
    assert r.resumed_from == ["scratch"], r.resumed_from
    assert any("scratch" in d for d in failed.values()), failed
    launches = of(read_history(r.run_dir), LaunchStarted)
    assert [x.slurm["restart_count"] for x in launches] == [0, 1]
    assert [x.slurm["requeued_by"] for x in launches] == [None, "harness"]


HARNESS_SCENARIO = "slurm-kill-rank1-mid-shard-write"


@slurm
@pytest.mark.slow
@pytest.mark.nightly
def test_ctrl_c_during_a_slurm_scenario_leaves_no_daemon_job_or_port(tmp_path):
    out = tmp_path / "out"
    cli = subprocess.Popen([sys.executable, "-m", "ckpt_chaos.cli", "run", HARNESS_SCENARIO, "--out", str(out),
                            "--golden-dir", str(tmp_path / "golden"), "--plots", "none"],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    log = None
    try:
        end = time.monotonic() + 240
        while time.monotonic() < end and cli.poll() is None:
            found = list(out.rglob("slurm-job.log"))
            if found and "attempt 0" in found[0].read_text(errors="replace") and list(out.rglob("events.jsonl")):
                log = found[0]
                break
            time.sleep(0.2)
        assert log is not None, "the job never ran"
        conf = (log.parent / "slurm" / "slurm.conf").read_text()
        ports = [int(p) for p in re.findall(r"(?:SlurmctldPort|Port)=(\d+)", conf)]
        assert leftovers(owner=cli.pid), "the cluster should be running now"
        cli.send_signal(signal.SIGINT)
        cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.communicate()
    assert leftovers(owner=cli.pid) == []
    assert listening(ports) == []
    marker_left = [line for line in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
                   .splitlines() if str(out) in line]
    assert marker_left == [], marker_left


BASE = {"world_size": 2, "cluster": {"backend": "slurm"}, "trainer": {"max_steps": 8, "ckpt_every_steps": 4}}


@pytest.mark.parametrize("change, key, fix", [
    ({"cluster": {"backend": "local"}, "faults": [{"kind": "preempt", "when": {"point": "step.end", "step": 2}}]},
     "faults[0].kind", 'add [cluster] backend = "slurm"'),
    ({"faults": [{"kind": "node_down", "target": "rank:1", "when": {"point": "step.end", "step": 2}}]},
     "faults[0].target", 'use target = "node:N"'),
    ({"faults": [{"kind": "node_down", "target": "node:1", "when": {"point": "step.end", "step": 2}}]},
     "recovery.world_size", "set recovery.world_size = 1"),
    ({"faults": [{"kind": "signal", "signal": "KILL", "when": {"point": "step.end", "step": 2}}]},
     "faults[0].signal", "allowed: TERM, INT, USR1, USR2"),
    ({"faults": [{"kind": "pause", "target": "node:1", "when": {"point": "step.end", "step": 2}}]},
     "faults[0].kind", "on Slurm, node_down loses a node"),
    ({"recovery": {"relaunch": "torchrun"}}, "recovery.relaunch", 'use relaunch = "harness"'),
    ({"faults": [{"kind": "time_limit", "minutes": 1, "warn_s": 90, "when": {"point": "step.end", "step": 2}}]},
     "faults[0].warn_s", "use minutes >= 1 and 0 < warn_s < 60 * minutes"),
])
def test_an_impossible_slurm_scenario_is_refused_naming_the_key_and_the_fix(change, key, fix):
    with pytest.raises(ScenarioError) as e:
        from_dict({**BASE, **change}, "bad.toml", "bad")
    message = str(e.value)
    assert message.startswith(f"bad.toml: {key}:"), message
    assert fix in message, message


def test_the_slurm_scenarios_are_in_the_default_suite_and_name_slurm_faults():
    names = {p.stem: load(p) for p in SCENARIOS.glob("*.toml")}
    assert len(names) >= 6
    assert all("default" in s.suites and s.cluster.backend == "slurm" for s in names.values())
    kinds = {f.kind for s in names.values() for f in s.faults}
    assert {"preempt", "requeue", "signal", "node_down", "time_limit"} <= kinds, kinds


def test_without_slurm_a_slurm_scenario_is_skipped_with_the_reason(tmp_path, monkeypatch):
    from ckpt_chaos.env import slurm as slurm_env

    monkeypatch.setattr(slurm_env, "_which", lambda name: None)
    r = run_scenario(load(SCENARIOS / "slurm-kill-rank1-mid-shard-write.toml"), tmp_path)
    assert r.verdict == "skipped"
    assert "slurm backend" in r.reason and "make setup" in r.reason, r.reason
    assert r.checks == []
