"""The power_loss fault's mode, and the sentence that names what a power cut lost (no processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt_chaos.check.verdict import Run
from ckpt_chaos.check.durability import power_loss_summary
from ckpt_chaos.check.history import Exited, FaultFired, History, LaunchStarted, read_history
from ckpt_chaos.scenario import ScenarioError, load

SCENARIO = """
description = "power loss"
world_size = 2
[trainer]
max_steps = 12
[[faults]]
kind = "power_loss"
when = { point = "ckpt.commit", rank = 0, save = 2 }
"""

# faultfs's crash account, as the power_loss nemesis stores it (a plain DDP save: step_8.pt.tmp
# written without fsync, renamed, power cut before the folder fsync)
UNDO = {"mode": "undo", "root": "checkpoints", "truncated": ["step_8.pt"], "restored": [],
        "undone": ["rename step_8.pt.tmp -> step_8.pt", "create step_8.pt.tmp"],
        "data_lost": [{"path": "step_8.pt", "size_before": 123456, "size_after": 0, "ever_fsynced": False}],
        "entries_undone": [{"op": "rename", "path": "step_8.pt", "src": "step_8.pt.tmp", "folder_ever_fsynced": False},
                           {"op": "create", "path": "step_8.pt.tmp", "folder_ever_fsynced": False}],
        "entries_kept": []}


def stored_run(tmp_path: Path, lost: dict | None, fault: str = "power_loss") -> Run:
    """A run directory as the harness leaves it: a launch that a fault ended at step 8, and a relaunch."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    s = load(_write(tmp_path / "s.toml", SCENARIO))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    h = History(run_dir / "history.jsonl")
    h.add(LaunchStarted(t=100.0, launch=0, world_size=2, pid=1, mode="harness"))
    h.add(FaultFired(t=109.0, index=0, fault=fault, target="all", launch=0,
                     at={"point": "file.rename", "rank": 0, "info": {"path": "checkpoints/step_8.pt"}},
                     detail={"pids": [11, 12], **({"lost": lost} if lost is not None else {})}))
    h.add(Exited(t=110.0, launch=0, rc=-9, snapshot={"checkpoints": {}}))
    h.add(LaunchStarted(t=111.0, launch=1, world_size=2, pid=2, mode="harness"))
    h.close()
    steps = [{"step": n, "attempt": 0, "t": 100.0 + n} for n in range(1, 9)]
    steps += [{"step": n, "attempt": 1, "t": 110.0 + n} for n in range(5, 13)]
    (run_dir / "trajectory.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    return Run.load(s, run_dir, tmp_path / "golden")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_summary_names_the_file_that_lost_its_data_and_the_rename_undone(tmp_path):
    run = stored_run(tmp_path, UNDO)
    assert read_history(run.dir)[1].detail["lost"] == UNDO  # as stored, read back
    assert power_loss_summary(run, 0) == (
        "power was cut at step 8: checkpoints/step_8.pt lost its data (never fsynced: 123456 -> 0 bytes) and "
        "the rename of checkpoints/step_8.pt.tmp -> checkpoints/step_8.pt and the creation of "
        "checkpoints/step_8.pt.tmp were undone (the folder was never fsynced)")
    assert power_loss_summary(run, 1) is None  # no power cut ended launch 1


def test_the_summary_of_entries_kept_and_of_folders_fsynced_before(tmp_path):
    lost = {**UNDO, "mode": "entries-kept", "undone": [], "entries_undone": [],
            "data_lost": [{"path": "step_8.pt", "size_before": 123456, "size_after": 0, "ever_fsynced": False},
                          {"path": "log.txt", "size_before": 1234, "size_after": 1000, "ever_fsynced": True}],
            "entries_kept": [{"op": "rename", "path": "step_8.pt", "src": "step_8.pt.tmp", "folder_ever_fsynced": True},
                             {"op": "unlink", "path": "step_0.pt", "folder_ever_fsynced": True}]}
    assert power_loss_summary(stored_run(tmp_path, lost), 0) == (
        "power was cut at step 8 (mode entries-kept): checkpoints/step_8.pt lost its data (never fsynced: "
        "123456 -> 0 bytes) and checkpoints/log.txt lost its data (written again after its last fsync: 1234 -> "
        "1000 bytes) and the rename of checkpoints/step_8.pt.tmp -> checkpoints/step_8.pt and the removal of "
        "checkpoints/step_0.pt were kept although the folder was not fsynced after them")


def test_the_summary_of_entries_kept_whose_data_was_fsynced(tmp_path):
    # the record of plain-ddp-power-loss-entries-kept-before-folder-fsync: the file fsynced, then renamed
    lost = {"mode": "entries-kept", "root": "checkpoints", "truncated": [], "restored": [], "undone": [],
            "data_lost": [], "entries_undone": [], "entries_kept": [
                {"op": "create", "path": "step_8.pt.tmp", "folder_ever_fsynced": True},
                {"op": "rename", "path": "step_8.pt", "src": "step_8.pt.tmp", "folder_ever_fsynced": True}]}
    assert power_loss_summary(stored_run(tmp_path, lost), 0) == (
        "power was cut at step 8 (mode entries-kept): no file lost data (every one written had been fsynced) and "
        "the creation of checkpoints/step_8.pt.tmp and the rename of checkpoints/step_8.pt.tmp -> "
        "checkpoints/step_8.pt were kept although the folder was not fsynced after them")


def test_the_summary_of_a_cut_that_found_everything_durable_and_of_other_faults(tmp_path):
    nothing = {**UNDO, "truncated": [], "undone": [], "data_lost": [], "entries_undone": []}
    assert power_loss_summary(stored_run(tmp_path / "a", nothing), 0) == (
        "power was cut at step 8; everything in checkpoints had been fsynced (file data and folders), so the cut "
        "lost nothing")
    assert power_loss_summary(stored_run(tmp_path / "b", None, fault="kill"), 0) is None


def test_the_summary_of_a_record_from_before_the_sizes_were_kept(tmp_path):
    old = {"truncated": ["step_8.pt"], "restored": [], "undone": ["rename step_8.pt.tmp -> step_8.pt"]}
    assert power_loss_summary(stored_run(tmp_path, old), 0) == (
        "power was cut at step 8: checkpoints/step_8.pt lost its un-fsynced data and "
        "rename step_8.pt.tmp -> step_8.pt undone")


def test_many_files_are_counted_past_the_first_four(tmp_path):
    lost = {**UNDO, "entries_undone": [], "data_lost": [
        {"path": f"f{i}", "size_before": 10, "size_after": 0, "ever_fsynced": False} for i in range(6)]}
    text = power_loss_summary(stored_run(tmp_path, lost), 0)
    assert text.endswith("checkpoints/f3 lost its data (never fsynced: 10 -> 0 bytes) and 2 more files")


@pytest.mark.parametrize("mode", ["undo", "entries-kept"])
def test_the_power_loss_mode_is_a_key_of_the_fault(tmp_path, mode):
    s = load(_write(tmp_path / "s.toml", SCENARIO.replace('kind = "power_loss"', f'kind = "power_loss"\nmode = "{mode}"')))
    assert s.faults[0].params.mode == mode
    assert s.faults[0].keys() == ({} if mode == "undo" else {"mode": mode})
    again = load(_write(tmp_path / "again.toml", s.to_toml()))
    assert again.faults[0].params.mode == mode


def test_an_unknown_power_loss_mode_names_the_file_the_key_and_the_fix(tmp_path):
    path = _write(tmp_path / "bad.toml", SCENARIO.replace('kind = "power_loss"', 'kind = "power_loss"\nmode = "keep"'))
    with pytest.raises(ScenarioError) as e:
        load(path)
    text = str(e.value)
    assert str(path) in text and "faults[0].mode: unknown power-loss mode 'keep'" in text
    assert text.endswith("; allowed: undo, entries-kept")
