"""Ray Train (examples/ray_train, docs/analyses/ray_train.md): a trainer that restarts its own workers.

End to end (slow, nightly; needs ray, `make stacks`): rank 1's worker SIGKILLed as step 7 begins;
Ray's FailureConfig restarts the worker group inside the one launch, and both workers resume from the
checkpoint Ray registered last (ray/train/v2/_internal/execution/checkpoint/checkpoint_manager.py:
``before_init_train_context`` hands the new workers ``latest_checkpoint_result``).

Fast: what the harness needs to judge such a job. Ray tells a worker its rank at run time
(``os.environ["RANK"]``, ray/train/torch/config.py:178), and starts a new process for the same rank
after a failure with nothing that counts the restarts: the probe layer counts each rank's starts
itself (``auto_state.incarnation``), and a process that does not know its rank (the driver, Ray's
controller) is no rank. Ray's ``checkpoint_manager_snapshot.json`` names the checkpoint it resumes
from: ``complete = { pointer = ..., json = ... }``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from ckpt_chaos.probe.auto_state import ENV_COUNT_RESTARTS, ENV_RUN_DIR, INCARNATIONS
from ckpt_chaos.run.command import complete, pointer
from ckpt_chaos.scenario import ScenarioError, from_dict, load
from tests.helpers import REPO

SCENARIOS = REPO / "examples" / "ray_train" / "scenarios"
RAY_SNAPSHOT = {"pointer": "run/checkpoint_manager_snapshot.json",
                "json": "latest_checkpoint_result.checkpoint_dir_name", "format": "run/{}"}

# A worker as Ray starts one: the layer armed at start-up, the rank set in os.environ later.
_WORKER = """
import os, sys
from ckpt_chaos.probe import auto_state
from ckpt_chaos.probe.auto import configure
configure()
before = auto_state.incarnation()
if sys.argv[1] != "none":
    os.environ["RANK"] = sys.argv[1]
print(before, auto_state.incarnation(), auto_state._s.attempt)
"""


def _worker(tmp_path, rank: str, attempt: str = "0") -> list[str]:
    env = {**os.environ, ENV_COUNT_RESTARTS: "1", ENV_RUN_DIR: str(tmp_path), "CKPT_CHAOS_ATTEMPT": attempt,
           "PYTHONPATH": str(REPO)}
    env.pop("RANK", None)
    env.pop("CKPT_CHAOS_CONTROLLER", None)
    out = subprocess.run([sys.executable, "-c", _WORKER, rank], env=env, capture_output=True, text=True,
                         check=True, cwd=tmp_path)
    return out.stdout.split()


def test_each_start_of_a_rank_counts_as_a_restart_in_its_launch(tmp_path):
    """Rank 1 started three times (Ray's first group, then two restarts), rank 0 once: 0, 1, 2 and 0; the
    count adds to the launch the trajectory carries. A harness relaunch counts from 0 again."""
    assert _worker(tmp_path, "1") == ["None", "0", "0"]  # no rank before Ray sets RANK: not counted yet
    assert _worker(tmp_path, "0") == ["None", "0", "0"]
    assert _worker(tmp_path, "1") == ["None", "1", "1"]
    assert _worker(tmp_path, "1") == ["None", "2", "2"]
    assert _worker(tmp_path, "1", attempt="1") == ["None", "0", "1"]
    assert sorted(os.listdir(tmp_path / INCARNATIONS)) == ["0-0-0", "0-1-0", "0-1-1", "0-1-2", "1-1-0"]


def test_a_process_that_never_learns_its_rank_is_no_rank(tmp_path):
    """The driver and Ray's controller never get RANK: never counted, so they report no point."""
    assert _worker(tmp_path, "none") == ["None", "None", "0"]
    assert not (tmp_path / INCARNATIONS).exists()


def test_without_the_setting_nothing_is_counted(tmp_path):
    env = {**os.environ, ENV_RUN_DIR: str(tmp_path), "PYTHONPATH": str(REPO)}
    env.pop(ENV_COUNT_RESTARTS, None)
    out = subprocess.run([sys.executable, "-c", _WORKER, "1"], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", "None", "0"]


def _scenario(**recovery):
    return from_dict({"world_size": 2, "command": {"argv": ["{python}", "train.py"], "launcher": "self",
                                                   "complete": RAY_SNAPSHOT, "save_every": 4},
                      "recovery": recovery}, "chaos/ray.toml", "ray")


def test_relaunch_self_is_a_self_launched_trainer_restarting_its_own_workers():
    assert _scenario(relaunch="self").recovery.in_launch
    with pytest.raises(ScenarioError) as e:
        from_dict({"world_size": 2, "command": {"argv": ["train.py"]}, "recovery": {"relaunch": "self"}},
                  "chaos/ray.toml", "ray")
    assert str(e.value).startswith("chaos/ray.toml: recovery.relaunch: ") and "command.launcher" in str(e.value)
    with pytest.raises(ScenarioError, match="recovery.relaunch"):
        _scenario(relaunch="self", world_size=1)


def test_rays_snapshot_names_the_checkpoint_it_resumes_from(tmp_path):
    run = tmp_path / "checkpoints" / "run"
    for name in ("checkpoint_2026-01-01_00-00-01.000001", "checkpoint_2026-01-01_00-00-02.000002"):
        (run / name).mkdir(parents=True)
        (run / name / "state.pt").write_bytes(b"x" * 10)
    snap = {"ray_version": "2.60.0", "latest_checkpoint_result": {"checkpoint_dir_name":
                                                                   "checkpoint_2026-01-01_00-00-01.000001"}}
    (run / "checkpoint_manager_snapshot.json").write_text(json.dumps(snap))
    s = _scenario(relaunch="self")
    got = complete(s, tmp_path)
    # the newer folder is there too (a copy Ray never registered): not complete
    assert list(got) == ["checkpoints/run/checkpoint_2026-01-01_00-00-01.000001"], got
    assert got["checkpoints/run/checkpoint_2026-01-01_00-00-01.000001"]["via"] == \
        "checkpoints/run/checkpoint_manager_snapshot.json"
    (run / "checkpoint_manager_snapshot.json").write_text('{"ray_version": "2.60.0", "latest_checkpoint_result": null}')
    assert complete(s, tmp_path) == {}
    assert "names no checkpoint (latest_checkpoint_result.checkpoint_dir_name" in pointer(s, tmp_path)["problem"]
    (run / "checkpoint_manager_snapshot.json").write_text('{"ray_version": "2.60.0", "latest_check')  # torn
    assert "is garbled: no JSON value at latest_checkpoint_result" in pointer(s, tmp_path)["problem"]


def test_a_json_key_that_is_no_dotted_key_is_refused():
    with pytest.raises(ScenarioError) as e:
        from_dict(
            {"command": {"argv": ["t.py"], "complete": {"pointer": "s.json", "json": "a..b"}}}, "x.toml", "x")
    assert str(e.value).startswith("x.toml: command.complete.json: 'a..b' is not a dotted key; ")


KILL_RANK1 = SCENARIOS / "ray-train-kill-rank1-at-mid-epoch-step.toml"


@pytest.mark.slow
@pytest.mark.nightly  # make test: the fast tests above cover the restart count and Ray's snapshot pointer
@pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                    reason="ray is not installed (make stacks: pip install -c constraints.txt -e '.[ray]')")
def test_a_worker_killed_mid_epoch_is_restarted_by_ray_and_resumes_bit_for_bit(tmp_path, command_golden_root):
    from ckpt_chaos.run.runner import run_scenario

    s = load(KILL_RANK1)
    row = run_scenario(s, tmp_path / "out", command_golden_root).to_dict()
    c = {x["name"]: (x["verdict"], x["detail"]) for x in row["checks"]}
    assert c["fault_0_fired"][0] == "pass" and c["fault_0_job_failed"][0] == "pass", c  # Ray restarted the workers
    assert row["launches"] == 2, row  # Ray's restart counted as the second launch, within the harness's one
    assert c["trajectory"][0] == "pass", c["trajectory"]
    assert row["verdict"] == "pass", c


def test_a_checkpoint_in_a_folder_of_its_own_is_named_to_the_pointers_depth(tmp_path):
    """Ray keeps checkpoints in storage_path/<name>/checkpoint_N: a file read there belongs to
    checkpoints/run/checkpoint_N (``format = "run/{}"``), not to the folder of the whole run."""
    from types import SimpleNamespace

    from ckpt_chaos.check.evidence import Evidence

    (tmp_path / "trajectory.jsonl").write_text("")
    ev = Evidence(SimpleNamespace(s=_scenario(relaunch="self"), dir=tmp_path, golden=tmp_path))
    assert ev.checkpoint_of("checkpoints/run/checkpoint_000004/state.pt") == "checkpoints/run/checkpoint_000004"
    assert ev.checkpoint_of("elsewhere/state.pt") is None
    flat = from_dict({"command": {"argv": ["t.py"], "complete": {"pointer": "latest"}}}, "x.toml", "x")
    ev = Evidence(SimpleNamespace(s=flat, dir=tmp_path, golden=tmp_path))
    assert ev.checkpoint_of("checkpoints/global_step8/mp_rank_00_model_states.pt") == "checkpoints/global_step8"
