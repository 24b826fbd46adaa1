"""Save and resume idioms the automatic probe layer must see as they are, each a small real trainer
(tests/trainers/, 2 ranks under torchrun) run through the harness with a fault, its verdict declared
from what the trainer's code does:

* ``os_write_writer.py`` saves as DeepSpeed does (``os.open``, a loop of ``os.write``, fsync, close,
  rename; rank 0 then replaces ``latest``): a correct atomic save. A ``file.write`` trigger aimed at
  the final name fires on the temporary file's ``os.write`` calls, the kill lands at exactly half of
  its bytes, and the relaunch resumes from ``global_step4`` bit for bit: every check passes.
* ``dcp_get_state_dict.py`` resumes in torchtitan's idiom (``get_state_dict`` → ``dcp.load`` →
  ``set_state_dict``, saves with ``dcp.async_save``); ``get_state_dict`` first steps the fresh
  optimizer at a zero learning rate to create its state. Killed as step 12's save starts, the job
  resumes from ``step_8`` (the newest whole one: the trainer awaits step 8's save before starting
  step 12's) and trains steps 9..12 again, bit for bit: every check passes, 4 steps lost.
* ``async_uncopied.py`` hands the live ``state_dict()``s to a writer thread that writes after the
  next step: ``step_0008.pt`` records step 8 beside the model and Adam's state of step 9 or later.
  Killed as step 13 begins (step 12's file not yet written), the job resumes from it at step 9 by its
  own counter and data position: the trajectory fails at step 9, naming the model and optimizer state
  (the torch RNG, which the trainer never draws from, is the golden run's), with 4 steps trained
  again, although Adam's count says the relaunch began later.
* ``rng_restored_late.py`` restores the torch RNG, then makes the epoch's data iterator, which draws
  its seed from it. Killed as step 7 begins, it resumes from ``step_0004.pt`` mid-epoch with the model
  and optimizer whole and the RNG one draw on: the trajectory fails at step 5, naming the torch RNG.
  It does so too where the golden run's two fault-free runs took their state digests at different
  steps (a save the layer sees a step late, as on faultfs or from a writer thread): a digest one run
  took and the other did not is no instability.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckpt_chaos.check import judge
from ckpt_chaos.check.history import read_jsonl
from ckpt_chaos.run import command
from ckpt_chaos.run.runner import run_scenario
from ckpt_chaos.scenario import load
from tests.helpers import REPO

pytestmark = pytest.mark.slow

TRAINERS = REPO / "tests" / "trainers"


def scenario(tmp_path: Path, trainer: str, body: str, *options: str):
    """A ``[command]`` scenario running ``tests/trainers/<trainer>`` with ``options``; ``body``: the rest."""
    path = TRAINERS / trainer
    argv = ", ".join(json.dumps(a) for a in (str(path), "--ckpt-dir", "{ckpt_dir}", *options))
    toml = tmp_path / f"{Path(trainer).stem}.toml"
    toml.write_text(f'description = "{trainer}"\nworld_size = 2\n[command]\nargv = [{argv}]\nkey = ["{path}"]\n'
                    + body)
    return load(toml)


def checks(result) -> dict[str, tuple[str, str]]:
    return {c["name"]: (c["verdict"], c["detail"]) for c in result.checks}


@pytest.mark.nightly  # make test: test_auto_probe's os.write test, the idiom cell's kill mid-write
def test_a_file_written_with_os_write_is_seen_and_a_kill_lands_at_half_of_it(tmp_path, command_golden_root):
    final = "checkpoints/global_step8/rank1_state.pt"
    s = scenario(tmp_path, "os_write_writer.py", f"""complete = {{ pointer = "latest" }}
save_every = 4
[[faults]]
kind = "kill"
target = "rank:1"
when = {{ point = "file.write", rank = 1, path = "{final}", min_fraction = 0.5 }}
""", "--steps", "8")
    r = run_scenario(s, tmp_path / "out", command_golden_root)
    c = checks(r)
    assert r.verdict == "pass", r.checks
    assert c["resumed_newest@1"] == ("pass", "it loaded checkpoints/global_step4, the newest complete checkpoint "
                                             "(its torch.load)"), c
    assert c["trajectory"][1].startswith("8 steps identical to the golden run, bit for bit"), c
    # the kill landed on the temporary file's os.write at half of the file's size in the golden run
    run_dir = Path(r.run_dir)
    fired = [e for e in read_jsonl(run_dir / "history.jsonl") if e.get("kind") == "file.write" and e["rank"] == 1 and e["launch"] == 0
             and final in e["info"].get("aliases", ())]
    last = fired[-1]["info"]
    assert last["via"] == "os.write" and last["fraction"] >= 0.5, last
    whole = (run_dir / final).stat().st_size  # written again by the relaunch, whole
    torn = run_dir / last["path"]
    assert torn.name.startswith(".rank1_state.pt.tmp") and torn.stat().st_size == last["bytes"] == -(-whole // 2)


@pytest.mark.nightly  # make test: test_auto_probe's optimizer-state step is no step
def test_a_resume_through_dcps_state_dict_helpers_is_numbered_from_the_checkpoint(tmp_path, command_golden_root):
    s = scenario(tmp_path, "dcp_get_state_dict.py", """complete = "step_*/.metadata"
save_every = 4
[[faults]]
kind = "kill"
target = "all"
when = { point = "ckpt.stage", rank = 0, name = "step_12" }
""")
    r = run_scenario(s, tmp_path / "out", command_golden_root)
    c = checks(r)
    assert r.verdict == "pass", r.checks
    assert c["resumed_newest@1"] == ("pass", "it loaded checkpoints/step_8, the newest complete checkpoint "
                                             "(its dcp.load)"), c
    assert c["lost_work@1"] == ("pass", "4 step(s) trained again, at most 4 allowed"), c
    assert c["trajectory"][1].startswith("12 steps identical to the golden run, bit for bit"), c
    # the zero-learning-rate step get_state_dict takes before the load is no step of the trajectory
    relaunch = [x["step"] for x in read_jsonl(Path(r.run_dir) / "trajectory.jsonl") if x["attempt"] == 1]
    assert relaunch == [9, 10, 11, 12], relaunch


def test_state_handed_uncopied_to_a_writer_thread_is_caught_at_the_step_it_diverges(tmp_path, command_golden_root):
    s = scenario(tmp_path, "async_uncopied.py", """complete = "step_*.pt"
save_every = 4
digest_every = 4
[[faults]]
kind = "kill"
target = "all"
when = { point = "step.begin", rank = 0, step = 13 }
""")
    r = run_scenario(s, tmp_path / "out", command_golden_root)
    c = checks(r)
    assert r.verdict == "fail", r.checks
    assert c["resumed_newest@1"][0] == "pass" and "checkpoints/step_0008.pt" in c["resumed_newest@1"][1], c
    assert c["lost_work@1"] == ("pass", "4 step(s) trained again, at most 4 allowed"), c
    verdict, detail = c["trajectory"]
    assert verdict == "fail", c
    assert detail.startswith("trajectory diverges at step 9 (loss_hex); it is the first step after resuming from "
                             "checkpoints/step_0008.pt (launch 1), where the optimizer's own step count went on "
                             "from "), detail
    assert ("while its name and the samples it trained on say it resumed after step 8 (its steps are compared as "
            "steps 9..): the optimizer state it loaded is that of a later step than the checkpoint's; the model, "
            "optimizer state it resumed with differs from the golden run's at step 9 (torch RNG identical)") in detail


def test_an_rng_restored_too_early_is_named_whatever_steps_the_golden_runs_digested(tmp_path, command_golden_root):
    s = scenario(tmp_path, "rng_restored_late.py", """complete = "step_*.pt"
save_every = 4
[[faults]]
kind = "kill"
target = "all"
when = { point = "step.begin", rank = 0, step = 7 }
""")
    r = run_scenario(s, tmp_path / "out", command_golden_root)
    named = ("trajectory diverges at step 5 (loss_hex); it is the first step after resuming from "
             "checkpoints/step_0004.pt (launch 1); the torch RNG state it resumed with differs from the golden "
             "run's at step 5 (model, optimizer identical)")
    assert checks(r)["trajectory"] == ("fail", named), r.checks
    # The golden run's second fault-free run as one that saw the save after step 4 a step late: its
    # digests before step 6, not 5. golden.json's unstable fields are made from the two as golden_run
    # makes them, and the run is judged again.
    run_dir = Path(r.run_dir)
    gold = tmp_path / "golden"
    shutil.copytree(run_dir / "golden", gold)
    twin = tmp_path / "twin"
    twin.mkdir()
    recs = read_jsonl(gold / "trajectory.jsonl")
    pre = {k: v for k, v in recs[4].items() if k.startswith("pre_")}
    assert recs[4]["step"] == 5 and "pre_rng" in pre, recs[4]
    recs[4] = {k: v for k, v in recs[4].items() if k not in pre}
    recs[5] = {**recs[5], **pre}
    (twin / "trajectory.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    meta = json.loads((gold / "golden.json").read_text())
    # what really differed between its two runs (Python's and NumPy's RNG, unseeded) still does
    meta["unstable"] = sorted(set(command.unstable(gold, twin)) | set(meta["unstable"]))
    (gold / "golden.json").write_text(json.dumps(meta))
    assert "pre_rng" not in meta["unstable"] and "pre_model_digest" not in meta["unstable"], meta["unstable"]
    report = judge.check_run(s, run_dir, gold)
    assert {c.name: (c.verdict, c.detail) for c in report.checks}["trajectory"] == ("fail", named)
