"""No false alarm for want of evidence: one stored run of a correct trainer (the plain DDP example
resuming after a kill half-way through its checkpoint) is checked again with each kind of evidence
taken out in turn, as a trainer the probe layer has no patch for, or a run without root, would
leave it. No check may turn into a fail; where the evidence is gone the check says unknown, or
decides from what is left. And the evidence that is there still catches a torn read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckpt_chaos.check import judge
from ckpt_chaos.check.evidence import Evidence
from ckpt_chaos.check.verdict import Run
from ckpt_chaos.scenario import load
from tests.helpers import REPO

pytestmark = pytest.mark.slow

MID_WRITE = REPO / "examples" / "plain_ddp" / "scenarios" / "plain-ddp-kill-rank0-mid-file-write.toml"
LAYER_FILES = ("file.write", "file.done", "file.read", "file.fsync", "file.rename", "file.remove", "file.copy",
               "ckpt.stage", "ckpt.shard.write", "ckpt.shard.done", "ckpt.metadata")


@pytest.fixture(scope="module")
def stored(plain_ddp_mid_write):
    """(scenario, run directory, golden directory) of one passing run of MID_WRITE: the session's, made
    once for every test that reads it (tests/conftest.py); never changed here (``_copy``)."""
    r = plain_ddp_mid_write
    assert r.scenario.source == load(MID_WRITE).source and r.row["verdict"] == "pass", r.row["reason"]
    return r.scenario, r.run_dir, r.golden


def _copy(stored, tmp_path: Path) -> tuple[Path, Path]:
    _, run_dir, golden = stored
    run, gold = tmp_path / "run", tmp_path / "golden"
    shutil.copytree(run_dir, run, symlinks=False, ignore=shutil.ignore_patterns("golden", "checkpoints"))
    shutil.copytree(golden, gold)
    return run, gold


def _rewrite(path: Path, keep=lambda rec: True, change=lambda rec: rec) -> None:
    if not path.exists():
        return
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    path.write_text("".join(json.dumps(change(r)) + "\n" for r in lines if keep(r)))


def _no_points(*points):
    return lambda run, gold: _rewrite(run / "history.jsonl", keep=lambda r: r.get("kind") not in points)


def _drop_keys(path: str, *keys, kind: str | None = None, prefix: str | None = None):
    def change(rec):
        if kind is None or rec.get("kind") == kind:
            rec = {k: v for k, v in rec.items() if k not in keys and not (prefix and k.startswith(prefix))}
        return rec
    return lambda run, gold: (_rewrite(run / path, change=change), _rewrite(gold / path, change=change))


def _remove(*names):
    def go(run, gold):
        for base in (run, gold):
            for n in names:
                (base / n).unlink(missing_ok=True)
    return go


REMOVALS = {
    "framework load points": _no_points("load.begin", "load.end"),
    "Python file points": _no_points(*LAYER_FILES),
    "every point of the layer's file patches": _no_points("load.begin", "load.end", *LAYER_FILES),
    "fanotify's file events": _remove("files.jsonl"),
    "what was complete at each launch's end": _drop_keys("history.jsonl", "complete", kind="exit"),
    "the checkpoint folder's listing at each launch's end": _drop_keys("history.jsonl", "files", kind="exit"),
    "the trajectory's times": _drop_keys("trajectory.jsonl", "t"),
    "the state digests": _drop_keys("trajectory.jsonl", prefix="pre_"),
    "the exit digests": _remove("events.jsonl"),
    "the golden run's file sizes": _remove("planned.json", "files.json", "probe.jsonl"),
}


@pytest.mark.parametrize("what", sorted(REMOVALS))
def test_taking_out_evidence_never_turns_a_correct_run_into_a_fail(stored, tmp_path, what):
    s = stored[0]
    run, gold = _copy(stored, tmp_path)
    REMOVALS[what](run, gold)
    report = judge.check_run(s, run, gold)
    failed = {c.name: c.detail for c in report.checks if c.verdict == "fail"}
    assert not failed, f"without {what}: {failed}"
    unknown = [c for c in report.checks if c.verdict == "unknown"]
    assert all(c.detail for c in unknown), "an unknown must say what was missing"


def test_a_resume_no_patch_saw_is_inferred_from_the_step_it_began_at(stored, tmp_path):
    """The false alarm of a trainer that loads with a library the layer has no patch for (as
    ``safetensors.torch.load_file`` is): no load point, and without root no fanotify record."""
    s = stored[0]
    run, gold = _copy(stored, tmp_path)
    _no_points("load.begin", "load.end", "file.read")(run, gold)
    _remove("files.jsonl")(run, gold)
    report = judge.check_run(s, run, gold)
    c = {c.name: c for c in report.checks}
    assert c["resumed_newest@1"].verdict == "pass", c["resumed_newest@1"].detail
    assert "inferred: it began at step 5 and checkpoints/step_00000004.pt holds step 4" in c["resumed_newest@1"].detail
    assert report.resumed_from == ["checkpoints/step_00000004.pt"]
    assert report.steps_lost == 4


def test_a_relaunch_that_reads_the_torn_file_is_named_with_how_much_was_missing(stored, tmp_path):
    s = stored[0]
    run, gold = _copy(stored, tmp_path)

    def torn_read(rec):
        if rec.get("kind") in ("load.begin", "load.end") and rec.get("launch") == 1:
            rec["info"]["path"] = "checkpoints/step_00000008.pt.tmp"
        return rec
    _rewrite(run / "history.jsonl", change=torn_read)
    report = judge.check_run(s, run, gold)
    c = {c.name: c for c in report.checks}
    assert c["no_torn_read@1"].verdict == "fail"
    assert "checkpoints/step_00000008.pt.tmp: 11575 bytes written, never completed" in c["no_torn_read@1"].detail \
        or "11575 of 23149 bytes" in c["no_torn_read@1"].detail, c["no_torn_read@1"].detail
    assert c["resumed_newest@1"].verdict == "fail"


def test_one_source_of_resumed_from_for_every_check_and_the_report(stored, tmp_path):
    s, run_dir, golden = stored
    run = Run.load(s, run_dir, golden)
    r = Evidence(run).resumed_from(1)
    report = judge.check_run(s, run_dir, golden)
    assert r.decided and r.checkpoint == "checkpoints/step_00000004.pt"
    assert report.resumed_from == [r.checkpoint]
    assert r.checkpoint in {c.name: c.detail for c in report.checks}["resumed_newest@1"]


def test_a_relaunch_whose_optimizer_counts_from_one_again_is_compared_from_its_checkpoints_step(stored, tmp_path):
    """The layer numbers steps by the optimizer's own count: an optimizer whose state a resume did
    not restore counts from 1 again. The checks put the relaunch's steps after the step of the
    checkpoint it was seen to resume from, instead of reporting steps never trained."""
    s = stored[0]
    run, gold = _copy(stored, tmp_path)
    _rewrite(run / "trajectory.jsonl",
             change=lambda r: {**r, "step": r["step"] - 4} if r.get("attempt") == 1 else r)
    report = judge.check_run(s, run, gold)
    c = {c.name: c for c in report.checks}
    assert c["job_completed"].verdict == "pass", c["job_completed"].detail
    assert c["lost_work@1"].detail.startswith("4 step(s) trained again"), c["lost_work@1"].detail
    assert c["trajectory"].verdict == "pass", c["trajectory"].detail


def test_a_checkpoints_step_is_taken_from_the_writers_own_times_not_the_recorders(stored, tmp_path):
    """The file-event recorder stamps events when it reads them, which under load is after the
    trainer's next step: the step a checkpoint holds comes from the probe layer's times where it saw
    the write, so a late stamp does not make step_00000004.pt hold step 5."""
    s = stored[0]
    run, gold = _copy(stored, tmp_path)
    step5 = next(json.loads(x)["t"] for x in (run / "trajectory.jsonl").read_text().splitlines()
                 if json.loads(x)["step"] == 5 and json.loads(x).get("attempt", 0) == 0)
    _rewrite(run / "files.jsonl", change=lambda r: {**r, "t": step5 + 0.01}
             if r.get("launch") == 0 and "step_00000004" in r.get("path", "") else r)
    ev = Evidence(Run.load(s, run, gold))
    assert ev.saved_steps()["checkpoints/step_00000004.pt"] == 4, ev.saved_steps()
    c = {c.name: c for c in judge.check_run(s, run, gold).checks}
    assert c["lost_work@1"].detail.startswith("4 step(s) trained again"), c["lost_work@1"].detail


def test_reads_the_recorder_stamped_late_still_count_as_the_relaunchs_load(stored, tmp_path):
    """Where no load point was seen, the files fanotify saw a relaunch open before it first wrote say
    where it resumed from. The recorder stamps its events late, after the trainer's own probe has
    stamped the relaunch's first write: each source's reads are held to that source's first write."""
    s = stored[0]
    run, gold = _copy(stored, tmp_path)
    _no_points("load.begin", "load.end", "file.read")(run, gold)
    history = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
    first_write = min(h["t"] for h in history if h.get("launch") == 1 and h.get("kind") in LAYER_FILES
                      and h.get("kind") != "file.read" and "checkpoints/" in str(h.get("info", {}).get("path")))
    events = [json.loads(x) for x in (run / "files.jsonl").read_text().splitlines()]
    first_open = min(r["t"] for r in events if r.get("launch") == 1 and r.get("op") == "open"
                     and "step_00000004" in r.get("path", ""))
    lag = first_write - first_open + 0.05  # the recorder read launch 1's events this much late
    _rewrite(run / "files.jsonl", change=lambda r: {**r, "t": r["t"] + lag} if r.get("launch") == 1 else r)
    r = Evidence(Run.load(s, run, gold)).resumed_from(1)
    assert r.decided and r.checkpoint == "checkpoints/step_00000004.pt", r
    assert "fanotify saw it open checkpoints/step_00000004.pt" in r.how, r
