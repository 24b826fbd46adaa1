"""Typed history records and check verdicts (ckpt_chaos/check/): what is written reads back as the same
records, files written before the records were typed still read, a damaged file says where, and a
run's verdict is the worst of its checks with "n/a" counting as nothing (no processes)."""

from __future__ import annotations

import json

import pytest

from ckpt_chaos.check.verdict import Report
from ckpt_chaos.check.history import (DeadlineHit, Exited, FaultFired, HarnessError, Healed, History, HistoryError,
                                      LaunchStarted, ProbeEvent, RankExited, Reaped, TornDown, of, read_history)

SNAPSHOT = {"checkpoints": {"step_00000004": None}, "latest": "step_00000004", "strays": [],
            "newest_valid": "step_00000004"}


def test_every_record_reads_back_as_written(tmp_path):
    records = [
        LaunchStarted(t=1.0, launch=0, world_size=2, pid=10, mode="harness"),
        ProbeEvent(t=2.0, point="ckpt.stage", rank=1, pid=11, launch=0, info={"name": "step_00000004"}),
        ProbeEvent(t=2.5, point="upload.begin", rank=0, pid=12, launch=0, role="uploader"),
        FaultFired(t=3.0, index=0, fault="errno", target="rank:1", launch=0,
                   at={"point": "ckpt.stage", "rank": 1, "info": {}}, detail={"rule": 1, "via": "faultfs",
                                                                             "pids": [11]}),
        RankExited(t=4.0, launch=0, rank=1, pid=11),
        Reaped(t=4.5, launch=0, pids=[11], why="torchrun is closing it"),
        TornDown(t=4.6, launch=0, nodes=[1], after_s=30.0),
        Healed(t=5.0, launch=0, detail={"faultfs": {"injected": [{"rule": 1, "op": "fsync"}]}}),
        Exited(t=6.0, launch=0, rc=1, snapshot=SNAPSHOT, grace_expired=[5.5]),
        DeadlineHit(t=7.0, launch=1, deadline_s=300.0),
        HarnessError(t=8.0, error="boom"),
    ]
    history = History(tmp_path / "history.jsonl")
    for r in records:
        history.add(r)
    history.close()
    again = read_history(tmp_path)
    assert again == records
    assert of(again, FaultFired)[0].pids == [11] and of(again, Healed)[0].injected == [{"rule": 1, "op": "fsync"}]
    assert of(again, ProbeEvent, launch=0)[1].role == "uploader"


def test_a_record_is_stamped_with_the_time_it_is_written(tmp_path):
    history = History(tmp_path / "history.jsonl")
    written = history.add(HarnessError(error="x"))
    history.close()
    assert written.t > 0 and read_history(tmp_path)[0].t == written.t


def test_a_history_written_before_the_records_were_typed_reads(tmp_path):
    """Lines as the harness wrote them with History.add("harness", "fault", **record): the nemesis's
    account flattened in, optional keys left out."""
    old = [
        {"t": 1.0, "source": "harness", "kind": "launch", "launch": 0, "world_size": 2, "pid": 7, "mode": "harness",
         "probe": True},
        {"t": 2.0, "source": "probe", "kind": "ckpt.shard.write", "rank": 1, "pid": 8, "launch": 0,
         "info": {"fraction": 0.5}},
        {"t": 3.0, "source": "harness", "kind": "fault", "index": 0, "fault": "corrupt", "target": "triggering",
         "launch": 0, "at": {"point": "step.begin", "rank": 0, "info": {}}, "checkpoint": "step_00000004",
         "files": ["__0_0.distcp: deleted"]},
        {"t": 4.0, "source": "harness", "kind": "exit", "launch": 0, "rc": None, "deadline_hit": True,
         "grace_expired": [], "snapshot": SNAPSHOT},
    ]
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(x) + "\n" for x in old) + '{"t": 5.0, "sou')
    launch, probe, fault, exit_ = read_history(tmp_path)  # the torn last line is ignored
    assert probe.point == "ckpt.shard.write" and probe.role == "rank" and probe.info == {"fraction": 0.5}
    assert fault.detail == {"checkpoint": "step_00000004", "files": ["__0_0.distcp: deleted"]}
    assert fault.snapshot_before is None and fault.remote_after is None
    assert exit_.rc is None and exit_.remote is None and exit_.deadline_hit


@pytest.mark.parametrize("line, words", [
    ({"t": 1.0, "source": "harness", "kind": "exit", "launch": 0}, "harness record 'exit' lacks rc, snapshot"),
    ({"t": 1.0, "source": "harness", "kind": "coffee"}, "not a history record (source 'harness', kind 'coffee')"),
    ({"t": 1.0, "kind": "launch"}, "not a history record (source None"),
])
def test_a_line_that_is_no_record_names_the_file_and_line(tmp_path, line, words):
    ok = {"t": 0.5, "source": "harness", "kind": "error", "error": "x"}
    (tmp_path / "history.jsonl").write_text(json.dumps(ok) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(HistoryError) as e:
        read_history(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'history.jsonl'}:2: ")
    assert words in str(e.value)


def test_the_verdict_is_the_worst_check_and_not_applicable_counts_as_nothing():
    report = Report()
    report.add("no_hang", True, "ended in time")
    report.add("detected", "n/a", "resumed from a newer one", fault=1)
    assert report.verdict == "pass" and report.reason == ""
    report.add("detected_in_time", "unknown", "not measured")
    assert report.verdict == "unknown" and report.reason == "detected_in_time: not measured (could not tell)"
    report.add("committed_survives", False, "lost", at=0)
    assert report.verdict == "fail"
    assert Report(checks=[c for c in report.checks if c.verdict == "n/a"]).verdict == "pass"
    with pytest.raises(ValueError, match="verdict 'maybe' is none of pass, fail, unknown, n/a"):
        report.add("x", "maybe", "")


def test_a_failures_headline_is_its_root_check_with_what_failed_after_it_named():
    # in the order a [command] trainer's judge makes them: the job's end first, the torn file's root last
    report = Report()
    report.add("job_completed", False, "launch 1 exited 1")
    report.add("no_torn_read", False, "it loaded checkpoints/step_8.pt, torn (4096 of 8192 bytes)", at=1)
    report.add("trajectory", "unknown", "the relaunch trained no step")
    report.add("retention", False, "3 checkpoints kept, 2 promised")
    report.add("committed_valid", False, "checkpoints/step_8.pt is torn (4096 of 8192 bytes)")
    report.add("landed", True, "at 50%", fault=0)
    assert report.reason == ("committed_valid: checkpoints/step_8.pt is torn (4096 of 8192 bytes) "
                             "(and then no_torn_read@1, retention, job_completed)")
    # where nothing failed, what could not tell, in the same order
    unknown = Report(checks=[c for c in report.checks if c.verdict != "fail"])
    assert unknown.reason == "trajectory: the relaunch trained no step (could not tell)"


def test_a_check_carries_what_it_is_about_as_fields():
    report = Report()
    report.add("surfaced", False, "swallowed", fault=2)
    report.add("committed_survives", True, "kept", at=1)
    report.add("remote_durable_complete", True, "complete", at="fault_0", fault=0)
    report.add("trajectory", True, "identical")
    got = [(c.name, c.check, c.fault, c.at) for c in report.checks]
    assert got == [("fault_2_surfaced", "fault_surfaced", 2, None),
                   ("committed_survives@1", "committed_survives", None, "1"),
                   ("remote_durable_complete@fault_0", "remote_durable_complete", 0, "fault_0"),
                   ("trajectory", "trajectory", None, None)]


def test_dcp_metadata_is_read_without_torch_as_dcp_reads_it(tmp_path):
    import subprocess
    import sys

    import torch
    import torch.distributed.checkpoint as dcp

    from ckpt_chaos.check.history import _dcp_metadata, dcp_problem

    dcp.save({"w": torch.arange(1000.0), "b": torch.ones(7)}, checkpoint_id=str(tmp_path), no_dist=True)
    ours = {(i.relative_path, i.offset, i.length) for i in _dcp_metadata(tmp_path).storage_data.values()}
    theirs = {(i.relative_path, i.offset, i.length)
              for i in dcp.FileSystemReader(str(tmp_path)).read_metadata().storage_data.values()}
    assert ours == theirs and ours
    assert dcp_problem(tmp_path) is None
    shard = tmp_path / sorted(ours)[0][0]
    shard.write_bytes(shard.read_bytes()[:100])
    assert "has 100 bytes, .metadata references bytes up to" in dcp_problem(tmp_path)
    # and in a process that never imported torch, torch stays out
    code = ("import sys; from ckpt_chaos.check.history import dcp_problem; "
            f"print(dcp_problem({str(tmp_path)!r})); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert "has 100 bytes" in out[0] and out[1] == "False"


def _timings_verdict(tmp_path, events: list[dict]) -> tuple[str, str]:
    """reported_timings of a run that started at t=990 and reported ``events``."""
    from ckpt_chaos.check.timings import reported_timings
    from ckpt_chaos.check.verdict import Report, Run
    from ckpt_chaos.check.history import LaunchStarted

    run = Run(None, tmp_path, tmp_path, [LaunchStarted(t=990.0, launch=0, world_size=2, pid=1, mode="harness")],
              events)
    report = Report()
    reported_timings(run, report)
    (c,) = report.checks
    return c.verdict, c.detail


def test_reported_timings_fail_a_phase_longer_than_its_save_and_pass_measurements(tmp_path):
    def verdict(phases: dict) -> tuple[str, str]:
        return _timings_verdict(tmp_path, [{"event": "saved", "name": "step_00000004", "t": 1000.0, "stall_s": 0.1,
                                            "total_s": 0.5, "phases": phases}])

    assert verdict({"commit_s": 0.02, "write_data_s": 0.3})[0] == "pass"
    v, detail = verdict({"commit_s": 0.02, "wait_staged_s": 0.9})
    assert v == "fail" and detail == ("saved step_00000004: phases.wait_staged_s = 0.9s, longer than the save's "
                                      "total_s = 0.5s")
    v, detail = verdict({"commit_s": -0.01})
    assert v == "fail" and "phases.commit_s = -0.01 is not a duration" in detail


def test_reported_timings_fail_a_stop_whose_save_outlasted_the_time_since_its_signal(tmp_path):
    def verdict(save_s: float, since_signal_s: float) -> tuple[str, str]:
        return _timings_verdict(tmp_path, [{"event": "stopped", "reason": "preempt", "step": 5, "t": 1000.0,
                                            "save_s": save_s, "since_signal_s": since_signal_s}])

    assert verdict(0.587, 0.601)[0] == "pass"
    assert verdict(0.0, 2.35)[0] == "pass"  # nothing left to save: the checkpoint of this step was there
    v, detail = verdict(1.0, 0.646)
    assert v == "fail" and detail == ("stopped at step 5: save_s = 1s, longer than since_signal_s = 0.646s, though the "
                                      "stop began after the signal")


def test_reported_timings_fail_a_save_without_a_phase_every_golden_save_of_its_kind_reported(tmp_path):
    from ckpt_chaos.check.timings import reported_timings
    from ckpt_chaos.check.verdict import Report, Run
    from ckpt_chaos.scenario import Recovery, Scenario

    golden = tmp_path / "golden"
    golden.mkdir()
    saved = {"event": "saved", "t": 1000.0, "stall_s": 0.1, "total_s": 0.5}
    golden_saves = [{**saved, "name": "step_00000002", "asynchronous": True,
                     "phases": {"stage_s": 0.1, "commit_s": 0.1, "wait_staged_s": 0.1}},
                    {**saved, "name": "step_00000004", "asynchronous": True,
                     "phases": {"stage_s": 0.1, "commit_s": 0.1}},
                    {**saved, "name": "step_00000006", "asynchronous": False, "phases": {"commit_s": 0.1}}]
    (golden / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in golden_saves))

    def verdict(asynchronous: bool, phases: dict, attempt: int = 0, changes: tuple = ()) -> tuple[str, str]:
        s = Scenario(name="x", trainer={"max_steps": 8},
                     recovery=Recovery(changes=list(changes)))
        events = [{**saved, "name": "step_00000008", "asynchronous": asynchronous, "phases": phases,
                   "attempt": attempt}]
        run = Run(s, tmp_path, golden, [LaunchStarted(t=990.0, launch=0, world_size=2, pid=1, mode="harness")], events)
        report = Report()
        reported_timings(run, report)
        (c,) = report.checks
        return c.verdict, c.detail

    # wait_staged_s came in only one of the golden run's asynchronous saves: not required
    assert verdict(True, {"stage_s": 0.1, "commit_s": 0.1})[0] == "pass"
    assert verdict(False, {"commit_s": 0.1})[0] == "pass"
    v, detail = verdict(True, {"commit_s": 0.1})
    assert v == "fail" and detail == ("saved step_00000008: no stage_s among its phases, which every asynchronous "
                                      "save of the golden run reported")
    assert verdict(False, {})[0] == "fail"
    # a relaunch that changed the configuration may save differently
    assert verdict(True, {"commit_s": 0.1}, attempt=1, changes=({"manifest_format": 1},))[0] == "pass"


def test_lost_work_allows_the_interval_an_async_save_was_still_writing_and_no_more(tmp_path):
    from ckpt_chaos.check.resume import lost_work as _lost_work
    from ckpt_chaos.check.verdict import Report, Run
    from ckpt_chaos.scenario import Scenario

    def verdict(reached: int, async_save: bool) -> tuple[str, str]:
        (tmp_path / "trajectory.jsonl").write_text("".join(
            json.dumps({"attempt": 0, "step": step}) + "\n" for step in range(1, reached + 1)))
        s = Scenario(name="x", trainer={"max_steps": 12, "ckpt_every_steps": 4, "async_save": async_save})
        events = [{"event": "fresh_start", "attempt": 0},
                  {"event": "loaded", "attempt": 1, "name": "step_00000004", "step": 4}]
        report = Report()
        _lost_work(Run(s, tmp_path, tmp_path, [], events), report)
        (c,) = report.checks
        return c.verdict, c.detail

    assert verdict(8, async_save=False)[0] == "pass"
    v, detail = verdict(9, async_save=False)
    assert v == "fail" and detail.endswith("5 step(s) lost, at most 4 allowed")
    # step 8's save was still writing when step 9 trained; step 12's save would have waited for it
    assert verdict(11, async_save=True)[0] == "pass"
    v, detail = verdict(12, async_save=True)
    assert v == "fail" and detail.endswith("8 step(s) lost, at most 7 allowed")


def test_restored_durable_fails_a_restore_that_misreports_the_bytes_it_fetched(tmp_path):
    from ckpt_chaos.check.remote import remote_tier as _remote_tier
    from ckpt_chaos.check.verdict import Report, Run
    from ckpt_chaos.scenario import Remote, Scenario

    def verdict(reported) -> tuple[str, str]:
        remote = {"checkpoints": {"step_00000004": None}, "partial": [], "newest_durable": "step_00000004",
                  "bytes": {"step_00000004": 1850784}}
        records = [Exited(t=6.0, launch=0, rc=1, snapshot=SNAPSHOT, remote=remote)]
        events = [{"event": "fresh_start", "attempt": 0},
                  {"event": "restored_from_remote", "attempt": 1, "name": "step_00000004", "bytes": reported}]
        report = Report()
        _remote_tier(Run(Scenario(name="x", remote=Remote()), tmp_path, tmp_path, records, events), report)
        (c,) = [c for c in report.checks if c.name.startswith("restored_durable")]
        return c.verdict, c.detail

    assert verdict(1850784) == ("pass", "launch 1 restored step_00000004, complete on the remote tier "
                                        "(1850784 bytes, as the trainer reported)")
    v, detail = verdict(1850783)
    assert v == "fail" and detail.endswith("1850784 bytes of objects besides its manifest, but the trainer reported "
                                           "1850783 bytes fetched")


def test_restored_in_place_fails_a_restore_reported_whose_copy_is_not_in_the_folder(tmp_path):
    """The restore's rename into place failed and was swallowed: restored_from_remote was logged, and
    the launch then died reading the manifest of a folder that is not there."""
    from ckpt_chaos.check.remote import remote_tier as _remote_tier
    from ckpt_chaos.check.verdict import Report, Run
    from ckpt_chaos.scenario import Remote, Scenario

    remote = {"checkpoints": {"step_00000004": None}, "partial": [], "newest_durable": "step_00000004",
              "bytes": {"step_00000004": 10}}

    def verdict(held: dict, loaded: bool = False) -> tuple[str, str] | None:
        snap = {**SNAPSHOT, "checkpoints": held}
        records = [Exited(t=2.0, launch=0, rc=-9, snapshot=SNAPSHOT, remote=remote),
                   Exited(t=4.0, launch=1, rc=1, snapshot=snap, remote=remote)]
        events = [{"event": "fresh_start", "attempt": 0, "t": 1.0},
                  {"event": "restored_from_remote", "attempt": 1, "name": "step_00000004", "bytes": 10, "t": 3.0}]
        events += [{"event": "loaded", "attempt": 1, "name": "step_00000004", "t": 3.5}] if loaded else []
        report = Report()
        _remote_tier(Run(Scenario(name="x", remote=Remote()), tmp_path, tmp_path, records, events), report)
        found = [c for c in report.checks if c.name.startswith("restored_in_place")]
        return (found[0].verdict, found[0].detail) if found else None

    assert verdict({"step_00000004": None})[0] == "pass"
    v, detail = verdict({})
    assert v == "fail" and "the checkpoint folder held no step_00000004" in detail, detail
    assert verdict({}, loaded=True) is None  # the load says what became of it


def test_uploaded_durable_fails_an_upload_reported_durable_that_the_remote_tier_does_not_hold(tmp_path):
    """The uploader logged step 4 uploaded, but its manifest's put had failed (a reset link) and was
    swallowed: the next view of the bucket shows no durable step 4 nor anything newer."""
    from ckpt_chaos.check.remote import remote_tier as _remote_tier
    from ckpt_chaos.check.verdict import Report, Run
    from ckpt_chaos.scenario import Remote, Scenario

    def verdict(held: list[str], partial: list[str], claimed_at: float = 3.0) -> tuple[str, str]:
        remote = {"checkpoints": {n: None for n in held}, "partial": partial,
                  "newest_durable": held[0] if held else None, "bytes": {n: 10 for n in held}}
        records = [Exited(t=6.0, launch=0, rc=0, snapshot=SNAPSHOT, remote=remote)]
        events = [{"event": "fresh_start", "attempt": 0, "t": 1.0},
                  {"event": "uploaded", "attempt": 0, "name": "step_00000004", "t": claimed_at, "seconds": 0.1}]
        report = Report()
        _remote_tier(Run(Scenario(name="x", remote=Remote()), tmp_path, tmp_path, records, events), report)
        (c,) = [c for c in report.checks if c.name == "uploaded_durable"]
        return c.verdict, c.detail

    assert verdict(["step_00000004", "step_00000002"], [])[0] == "pass"
    # remote retention took it once a newer one was durable
    assert verdict(["step_00000008", "step_00000006"], [])[0] == "pass"
    v, detail = verdict(["step_00000002"], ["step_00000004"])
    assert v == "fail" and "reported step_00000004 durable" in detail and "at the end of launch 0" in detail, detail
    # no view of the bucket after the report: nothing to judge it by
    assert verdict(["step_00000002"], ["step_00000004"], claimed_at=7.0)[0] == "unknown"


def test_loaded_equals_saved_is_unknown_for_a_mid_step_checkpoint_without_a_gradient_digest(tmp_path):
    from ckpt_chaos.check.resume import loaded_equals_saved as _loaded_equals_saved
    from ckpt_chaos.check.verdict import Report, Run

    parts = {"model": "m", "optimizer": "o", "scheduler": "s", "counters": "c", "dataloader": "d", "rng": "r"}

    def verdict(micro: int, saved: dict) -> tuple[str, str]:
        load = {"event": "loaded", "name": "step_00000003.001", "step": 3, "micro": micro, "world_size": 2,
                "saved_world_size": 2, "digests": dict(saved), "saved_digests": saved}
        report = Report()
        _loaded_equals_saved(Run(None, tmp_path, tmp_path, [], [load]), report)
        (c,) = report.checks
        return c.verdict, c.detail

    assert verdict(1, {**parts, "grads": "g"})[0] == "pass"
    assert verdict(0, parts)[0] == "pass"  # a step boundary holds no gradients
    v, detail = verdict(1, parts)
    assert v == "unknown" and "after micro-batch 1 of step 3" in detail and "record a gradient digest" in detail


def test_a_trigger_on_an_upload_the_uploader_skipped_is_unknown_not_unfired(tmp_path):
    """On a loaded machine the uploader falls two checkpoints behind and skips step 8 for step 10:
    no upload.durable of step 8 ever comes. That is the machine's timing, not the scenario's
    mistake nor the trainer's: unknown, naming the skip. Without the skip it is unknown too (a fault
    that never fired), naming the trigger to check instead."""
    from ckpt_chaos.check.outcome import faults_fired as _faults_fired
    from ckpt_chaos.check.verdict import Run
    from ckpt_chaos.config import builtin_scenarios
    from ckpt_chaos.scenario import load

    s = load(builtin_scenarios() / "remote" / "remote-bit-rot-then-disk-lost.toml")  # 1, 2 on upload.durable of 8
    skipped = {"event": "upload_skipped", "role": "uploader", "attempt": 0, "name": "step_00000008",
               "newer": "step_00000010", "t": 5.0}
    for events, said in (([skipped], "the uploader skipped"), ([{**skipped, "name": "step_00000004"}], "check faults[")):
        report = Report()
        _faults_fired(Run(s, tmp_path, tmp_path, [Exited(launch=0, rc=0, snapshot={})], events), report)
        assert [c.verdict for c in report.checks] == ["unknown"] * 3, report.checks
        assert "check faults[0]" in report.checks[0].detail, report.checks  # the stop at step 9's end
        assert said in report.checks[1].detail and said in report.checks[2].detail, report.checks
    report = Report()
    _faults_fired(Run(s, tmp_path, tmp_path, [Exited(launch=0, rc=0, snapshot={})], [skipped]), report)
    assert "the uploader skipped step_00000008 for the newer step_00000010" in report.checks[1].detail


def test_a_promised_resume_is_unknown_where_the_fault_that_ends_the_launch_never_fired(tmp_path):
    """expect.resume_from promises a relaunch after the scenario's crash; where that crash never came
    (the uploader skipped the checkpoint its trigger names), a job ending in one launch broke nothing.
    Where it came and no relaunch followed, the promise is broken."""
    from ckpt_chaos.check.resume import resume_from
    from ckpt_chaos.check.verdict import Run
    from ckpt_chaos.config import builtin_scenarios
    from ckpt_chaos.scenario import load

    s = load(builtin_scenarios() / "remote" / "local-rot-then-durable-copy-restored.toml")
    report = Report()
    resume_from(Run(s, tmp_path, tmp_path, [Exited(launch=0, rc=0, snapshot={})], []), report)
    [c] = report.checks
    assert (c.name, c.verdict) == ("resume_from", "unknown") and "fault 0 (stop)" in c.detail, c
    report = Report()
    stop = FaultFired(t=1.0, launch=0, index=0, fault="stop", target="all", at={"point": "step.end", "rank": 0})
    resume_from(Run(s, tmp_path, tmp_path, [stop, Exited(launch=0, rc=0, snapshot={})], []), report)
    [c] = report.checks
    assert c.verdict == "fail" and "but no relaunch came" in c.detail, c


def test_manifest_facts_fail_a_manifest_that_leaves_out_or_misstates_the_training_it_holds(tmp_path):
    """The manifest's tokens_seen must be the trajectory's at its step, its world_size that of the
    launch that committed it; one left out fails as a wrong one does. Read from each launch's end."""
    from ckpt_chaos.check.commits import manifest_facts as _manifest_facts
    from ckpt_chaos.check.verdict import Run
    from ckpt_chaos.config import builtin_scenarios
    from ckpt_chaos.scenario import load

    s = load(builtin_scenarios() / "storage" / "corrupt-bitflip-in-shard.toml")
    (tmp_path / "trajectory.jsonl").write_text("".join(
        json.dumps({"step": k, "tokens_seen": 1024 * k, "attempt": 0}) + "\n" for k in range(1, 9)))
    events = [{"event": "committed", "name": f"step_0000000{k}", "attempt": 0, "world_size": 2} for k in (4, 8)]

    def checks(**manifests) -> dict[str, tuple[str, str]]:
        report = Report()
        snapshot = {"manifests": {f"step_0000000{k[1]}": facts for k, facts in manifests.items()}}
        _manifest_facts(Run(s, tmp_path, tmp_path / "golden", [Exited(launch=0, rc=0, snapshot=snapshot)], events),
                        report)
        return {c.name: (c.verdict, c.detail) for c in report.checks}

    right = {"step": 8, "micro": 0, "tokens_seen": 8192, "world_size": 2}
    assert checks(s8=right, s4={**right, "step": 4, "tokens_seen": 4096}) == {
        "manifest_facts": ("pass", "the manifests of 2 checkpoint(s) give the tokens seen and the world size the "
                                   "run had")}
    got = checks(s8=right, s4={"step": 4, "micro": 0, "world_size": 2})
    assert list(got) == ["manifest_facts@step_00000004"], got
    assert got["manifest_facts@step_00000004"] == ("fail", "step_00000004's manifest (at launch 0's end) lacks "
                                                           "tokens_seen")
    got = checks(s8={**right, "tokens_seen": 8000, "world_size": 4})
    assert got["manifest_facts@step_00000008"][1].endswith(
        "says tokens_seen = 8000, but step 8 of the trajectory had seen 8192; says world_size = 4, but the launch "
        "that committed it ran 2 rank(s)"), got
    assert checks() == {}  # nothing committed was seen valid: nothing to say


def test_upload_retries_fails_an_upload_given_up_before_its_configured_attempts(tmp_path):
    from ckpt_chaos.check.remote import upload_retries as _upload_retries
    from ckpt_chaos.check.verdict import Report, Run
    from ckpt_chaos.config import builtin_scenarios
    from ckpt_chaos.scenario import load

    s = load(builtin_scenarios() / "remote" / "upload-reset-mid-manifest.toml")  # retries 2

    def verdict(waits: list[float | None], end: str = "upload_failed", process: str = "p") -> tuple[str, str]:
        events = [{"event": "upload_retry", "role": "uploader", "process": "p", "attempt": 0, "name": "step_00000004",
                   "upload_attempt": k, "retry_in_s": wait, "t": 100.0 + k} for k, wait in enumerate(waits, 1)]
        events.append({"event": end, "role": "uploader", "process": process, "attempt": 0, "name": "step_00000004",
                       "attempts": 2, "t": 200.0})
        report = Report()
        _upload_retries(Run(s, tmp_path, tmp_path, [], events), report)
        return (report.checks[0].verdict, report.checks[0].detail) if report.checks else ("none", "")

    assert verdict([0.2, None])[0] == "pass"
    v, detail = verdict([0.2])
    assert v == "fail" and "given up after 1 failed attempt(s) (numbered [1]), but upload_retries=2" in detail
    v, detail = verdict([0.2, 0.4])  # it says it will retry, then gives up: one attempt fewer than promised
    assert v == "fail" and "after attempt 2 it said it would retry in 0.4s, then gave up" in detail
    v, detail = verdict([0.2, None, 0.2])  # a third attempt beyond the promise is no less a broken count
    assert v == "fail" and "numbered [1, 2, 3]" in detail
    # attempts of another uploader process are not this upload's
    v, detail = verdict([0.2, None], process="q")
    assert v == "fail" and "given up after 0 failed attempt(s)" in detail
    assert verdict([0.2], end="uploaded")[0] == "none"  # nothing given up: nothing to decide


def test_upload_backoff_fails_a_wait_other_than_configured_or_shorter_than_reported(tmp_path):
    from ckpt_chaos.check.remote import upload_backoff as _upload_backoff
    from ckpt_chaos.check.verdict import Report, Run
    from ckpt_chaos.config import builtin_scenarios
    from ckpt_chaos.scenario import load

    s = load(builtin_scenarios() / "remote" / "upload-reset-mid-manifest.toml")  # backoff_s 0.2

    def verdict(waits: list[float], gaps: list[float]) -> tuple[str, str]:
        events, t = [], 100.0
        for k, (wait, gap) in enumerate(zip(waits, gaps), 1):
            events.append({"event": "upload_retry", "role": "uploader", "process": "p", "attempt": 0,
                           "name": "step_00000004", "upload_attempt": k, "retry_in_s": wait, "t": t})
            t += gap
        events.append({"event": "uploaded", "role": "uploader", "process": "p", "attempt": 0,
                       "name": "step_00000004", "t": t})
        report = Report()
        _upload_backoff(Run(s, tmp_path, tmp_path, [], events), report)
        (c,) = report.checks
        return c.verdict, c.detail

    assert verdict([0.2, 0.4], [0.25, 0.45])[0] == "pass"
    v, detail = verdict([0.2, 0.2], [0.25, 0.25])  # a fixed interval, not an exponential one
    assert v == "fail" and "after attempt 2 the uploader waits 0.2s, not upload_backoff_s * 2^1 = 0.4s" in detail
    v, detail = verdict([0.2, 0.4], [0.03, 0.45])  # said it would wait, and did not
    assert v == "fail" and "it said it would wait 0.2s, but its next event (upload_retry) came 0.030s later" in detail


def test_a_kill_mid_write_of_a_save_mid_accumulation_is_measured_by_the_plan_the_boundary_saves_vouch_for(tmp_path):
    """A save mid-accumulation also holds the partial gradients (about 1.3 times a step boundary's
    file here), so the golden run's files do not measure it; the trainer's planned size does, where
    its plans for the run's step-boundary saves of the file matched the golden run's."""
    from ckpt_chaos.check.outcome import faults_landed as _faults_landed
    from ckpt_chaos.check.verdict import Run
    from ckpt_chaos.scenario_model import Fault, Scenario, Trigger

    golden = tmp_path / "golden"
    (golden / "checkpoints" / "step_00000008").mkdir(parents=True)
    (golden / "checkpoints" / "step_00000008" / "manifest.json").write_text(
        json.dumps({"files": {"__1_0.distcp": {"size": 932791}}}))
    s = Scenario(name="x", faults=[Fault(kind="kill", target="rank:1",
                                         when=Trigger(point="ckpt.shard.write", rank=1, min_fraction=0.5))])

    def landed(boundary_plan: int, planned: int = 1211120, done: int = 622814) -> tuple[str, str]:
        def stage(name, pid=7):
            return ProbeEvent(t=1.0, point="ckpt.stage", rank=1, pid=pid, launch=0, info={"name": name})

        def write(plan, pid=7):
            return ProbeEvent(t=1.0, point="ckpt.shard.write", rank=1, pid=pid, launch=0,
                              info={"file": "__1_0.distcp", "bytes": 1, "fraction": 0.1, "planned": plan})
        at = {"point": "ckpt.shard.write", "rank": 1,
              "info": {"file": "__1_0.distcp", "bytes": done, "fraction": 0.5, "planned": planned}}
        history = [stage("step_00000004"), write(boundary_plan), stage("step_00000007.001"), write(planned),
                   FaultFired(t=2.0, index=0, fault="kill", target="rank:1", launch=0, at=at,
                              snapshot_before={"writing": {".tmp-step_00000007.001/__1_0.distcp": done}})]
        report = Report()
        _faults_landed(Run(s, tmp_path, golden, history, []), report)
        (c,) = report.checks
        return c.verdict, c.detail

    v, detail = landed(929259)
    assert v == "pass" and "held 51% of its 1211120 bytes" in detail and "step_00000004" in detail, detail
    v, detail = landed(929259, done=300000)  # a quarter of the file, reported as half
    assert v == "fail" and "progress its file did not have" in detail, detail
    v, detail = landed(929259, done=1000000)
    assert v == "fail" and "later than the file made it" in detail, detail
    # a planner that counts twice for the boundary saves vouches for nothing: no measure, no verdict
    v, detail = landed(2 * 929259, planned=2 * 1211120)
    assert v == "unknown" and "not vouched for" in detail and "step_00000004 planned 1858518" in detail, detail
