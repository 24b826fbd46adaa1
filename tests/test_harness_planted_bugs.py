"""The harness catches real checkpointing bugs: planted-bug trainers fail scenarios that the
reference trainer passes, with a diagnosis that names the broken part."""

from __future__ import annotations

import dataclasses
import re

import pytest

from ckpt_chaos.check.history import FaultFired, RankExited, Reaped, of, read_history, trainer_events
from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.run.runner import run_scenario
from ckpt_chaos.scenario import load
from tests.helpers import golden_of_the_reference

pytestmark = pytest.mark.slow

SCENARIOS = builtin_scenarios() / "process"


def run(tmp_path, golden_root, scenario_file: str, module: str = "reference_trainer"):
    """Run a catalogue scenario (``FILE`` of the process family, or ``FAMILY/FILE``) with ``module``."""
    path = builtin_scenarios() / scenario_file if "/" in scenario_file else SCENARIOS / scenario_file
    s = dataclasses.replace(load(path), trainer_module=module)
    golden_of_the_reference(s, golden_root)
    return run_scenario(s, tmp_path, golden_root)


def failed(result) -> dict[str, str]:
    return {c["name"]: c["detail"] for c in result.checks if c["verdict"] == "fail"}


def test_reference_trainer_passes_a_mid_write_kill(reference_mid_write):
    r = reference_mid_write.result  # the session's run of the scenario (tests/conftest.py), test_report.py's too
    assert r.verdict == "pass", r.reason
    assert r.steps_lost == 4 and r.launches == 2
    assert r.time_to_detect_s is not None and r.time_to_recover_s > r.time_to_detect_s


def test_shard_progress_reported_ahead_of_the_file_is_caught_where_the_kill_landed(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "kill-rank1-mid-shard-write.toml", "tests.planted.progress_of_tensors_only")
    detail = failed(r)["fault_0_landed"]
    assert "__1_0.distcp held 3" in detail or "__1_0.distcp held 4" in detail, detail  # 30-something %
    assert "for a trigger at 50%" in detail and "reported progress its file did not have" in detail


def test_shard_progress_reported_late_is_caught_where_the_kill_landed(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "kill-rank1-mid-shard-write.toml", "tests.planted.progress_planned_too_large")
    detail = failed(r)["fault_0_landed"]
    assert "for a trigger at 50%" in detail and "reported progress later than the file made it" in detail, detail


def test_a_hung_rank_is_noticed_by_its_peer_then_killed_as_torchrun_closes_it(tmp_path, golden_root):
    """The SIGSTOPped rank is SIGKILLed when torchrun starts closing it (not 30 s later): after its
    peer gave up at the collective timeout, so the hang is still the job's to notice."""
    r = run(tmp_path, golden_root, "hang-rank1-sigstop.toml")
    assert r.verdict == "pass", r.reason
    history = read_history(r.run_dir)
    stopped = next(pid for h in of(history, FaultFired) if h.fault == "stop" for pid in h.pids)
    reaped = of(history, Reaped)
    assert [h.pids for h in reaped] == [[stopped]]
    exits = of(history, RankExited, launch=0)
    assert exits[0].pid != stopped  # the peer noticed first
    assert next(h.t for h in exits if h.pid == stopped) >= reaped[0].t


def test_rng_not_saved_is_caught_and_named(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "kill-rank1-mid-shard-write.toml", "tests.planted.rng_not_saved")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "trajectory diverges at step 5" in bad["trajectory"]
    assert "first step after resuming from step_00000004" in bad["trajectory"]
    assert "the rng state differs from the state saved" in bad["trajectory"]
    assert "model, optimizer, scheduler, counters, dataloader identical" in bad["trajectory"]


def test_loader_position_not_restored_is_caught_and_named(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "kill-node-mid-training.toml", "tests.planted.loader_not_restored")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "trained on different samples" in bad["trajectory"]
    assert "the dataloader state differs from the state saved" in bad["trajectory"]


def test_latest_moved_before_durable_is_caught_and_named(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "kill-after-manifest-before-rename.toml", "tests.planted.latest_before_durable")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "`latest` named step_00000008, which was not a valid checkpoint" in bad["latest_valid@0"]
    assert "pointer moved before the checkpoint was durable" in bad["latest_valid@0"]


def test_previous_deleted_before_commit_is_caught_and_named(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "kill-rank1-mid-shard-write.toml", "tests.planted.deletes_previous_before_commit")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "step_00000004 was committed before the crash but is not valid after it" in bad["committed_survives@0"]
    assert "8 step(s) lost, at most 4 allowed" in bad["lost_work@1"]


def test_loader_state_of_dropped_ranks_discarded_is_caught_and_named(tmp_path, golden_root):
    # 4 ranks lose their node at step 6 and resume on 2 from step 4: the planted loader rebuilds the
    # global position from the 2 remaining ranks' shares, half of it, and replays steps 3 and 4.
    r = run(tmp_path, golden_root, "kill-node-resume-on-two-of-four.toml", "tests.planted.loader_drops_ranks")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "trajectory diverges at step 5" in bad["trajectory"]
    assert "trained on different samples" in bad["trajectory"]
    assert "its batch is the golden run's step 3" in bad["trajectory"]
    assert "the data loader resumed 2 step(s) too early and 2 step(s) of samples are seen twice" in bad["trajectory"]


@pytest.mark.parametrize("crashes,attempt,sig", [(1, 0, "SIGSEGV"), (2, 0, "SIGSEGV"),
                                                 pytest.param(1, 1, "SIGSEGV", marks=pytest.mark.nightly),
                                                 pytest.param(1, 1, "SIGABRT", marks=pytest.mark.nightly)])
def test_a_native_crash_where_no_fault_fired_or_a_segfault_is_run_again_once_and_said(
        tmp_path, golden_root, monkeypatch, crashes, attempt, sig):
    # Rank 0 crashes at its first save: before the scenario's kill (at the second save) can fire, or
    # (attempt 1) in the relaunch, a launch in which no fault fired (as gloo's SIGABRT at exit did in CI).
    monkeypatch.setenv("CKPT_CHAOS_TEST_CRASH_COUNTER", str(tmp_path / "crashes"))
    monkeypatch.setenv("CKPT_CHAOS_TEST_CRASHES", str(crashes))
    monkeypatch.setenv("CKPT_CHAOS_TEST_CRASH_ATTEMPT", str(attempt))
    monkeypatch.setenv("CKPT_CHAOS_TEST_CRASH_SIGNAL", sig)
    r = run(tmp_path, golden_root, "kill-rank1-mid-shard-write.toml", "tests.planted.crashes_natively")
    assert (tmp_path / "kill-rank1-mid-shard-write.crashed" / "torchrun.log").is_file()
    assert (tmp_path / "crashes").read_text() == str(crashes)
    if crashes == 1:  # the second run is clean: it passes, and says it is a second run
        assert r.verdict == "pass", r.reason
        assert r.checks[0]["name"] == "retried_after_native_crash"
        assert f"{sig} in a rank" in r.checks[0]["detail"]
    else:  # crashing again is a failure, not a third try
        assert r.verdict == "fail"
        assert r.checks[0]["name"] == "retried_after_native_crash"


def test_retention_that_forgets_the_best_checkpoint_on_a_relaunch_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "retention-milestones-and-best-across-a-crash.toml", "tests.planted.best_in_memory")
    assert r.verdict == "fail"
    bad = failed(r)
    assert list(bad) == ["retention_kept"], bad
    assert "step_00000004, the lowest loss committed (3.4134), is not kept" in bad["retention_kept"]


def test_making_room_on_a_full_disk_by_deleting_the_best_checkpoint_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "storage/retention-best-on-full-disk.toml", "tests.planted.makes_room_on_full_disk")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "step_00000004, the lowest loss committed (3.4134), is not kept" in bad["retention_kept"]
    assert "resume_from" in bad


def test_a_resume_that_accepts_a_changed_learning_rate_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "relaunch-with-changed-lr-is-refused.toml", "tests.planted.accepts_any_config")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "launch 1 changed lr = 0.0015, which a resume must refuse, but it exited with status 0" in bad[
        "config_refused@1"]
    assert "it resumed from step_00000004 at step 4" in bad["config_refused@1"]
    assert "(lr" in bad["trajectory"]  # the diagnosis names the learning rate


def test_a_resume_that_refuses_a_change_of_cadence_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "relaunch-with-changed-cadence-resumes.toml",
            "tests.planted.refuses_any_config_change")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "launch 1 changed only ckpt_every_steps = 2, keep_last = 1, async_save = True, which a resume may " \
           "change, but it loaded no checkpoint" in bad["config_accepted@1"]
    assert "job_completed" in bad


def test_retention_that_keeps_one_fewer_than_keep_last_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "kill-rank1-mid-shard-write.toml", "tests.planted.keeps_one_fewer")
    assert r.verdict == "fail"
    bad = failed(r)
    assert list(bad) == ["retention"], bad  # the newest survives every crash: nothing else notices
    assert "a retention pass of launch 1 deleted step_00000004, one of the last 2 valid checkpoints keep_last=2 " \
           "promises (step_00000008, step_00000004)" in bad["retention"]
    assert "after launch 1 kept 1 of the last 2 valid checkpoints keep_last=2 promises: missing step_00000008" \
           in bad["retention"]


def test_a_resume_that_refuses_only_a_changed_learning_rate_is_caught(tmp_path, golden_root):
    """The catalogue's relaunch for the seed, a field the trainer declares shapes the trajectory (one of the
    relaunch-change scenarios generated from its declaration: ckpt_chaos/audit/changes.py)."""
    r = run(tmp_path, golden_root, "relaunch-with-changed-seed-is-refused.toml", "tests.planted.refuses_only_lr")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "launch 1 changed seed = 2468, which a resume must refuse, but it exited with status 0" in bad[
        "config_refused@1"], bad
    assert "it resumed from step_00000004 at step 4" in bad["config_refused@1"]


def test_a_checkpoint_rejected_on_load_and_deleted_instead_of_kept_aside_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "storage/corrupt-bitflip-in-shard.toml", "tests.planted.deletes_rejected")
    assert r.verdict == "fail"
    bad = failed(r)
    assert list(bad) == ["committed_kept"], bad  # the resume itself goes on from step 4 as it should
    assert "step_00000008, committed by launch 0, was rejected on load (" in bad["committed_kept"]
    assert "and is gone: not kept aside in rejected/ with its reason" in bad["committed_kept"]


def test_a_resume_that_refuses_the_remote_copy_of_a_checkpoint_found_corrupt_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "remote/local-rot-then-durable-copy-restored.toml",
            "tests.planted.refuses_restored_copy")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "job_completed" in bad and "last launch exit status 1" in bad["job_completed"], bad
    assert "trajectory" in bad and "were never trained" in bad["trajectory"], bad
    said = [e["error"] for e in trainer_events(r.run_dir, "load_failed")]
    assert said == ["offered again after it failed its load"], said  # the restored copy, refused


def test_a_time_cadence_lost_on_resume_is_caught_by_a_second_crash(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "time-cadence-killed-twice.toml", "tests.planted.time_cadence_lost_on_resume")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "lost_work@2" in bad and "at most 6 allowed" in bad["lost_work@2"], bad


# Nightly: both scenarios are in the default suite, whose every scenario make chaos --strict requires to
# pass in each CI run; make test runs the planted trainers on them, below.
@pytest.mark.nightly
@pytest.mark.parametrize("scenario", ["process/preempt-on-the-last-micro-batch-of-a-step.toml",
                                      "storage/flip-in-the-only-checkpoint-as-its-load-begins.toml"])
def test_the_reference_trainer_passes_where_the_two_planted_bugs_below_fail(tmp_path, golden_root, scenario):
    assert run(tmp_path, golden_root, scenario).verdict == "pass"


def test_an_emergency_save_skipped_at_a_step_boundary_is_caught(tmp_path, golden_root):
    scenario = "process/preempt-on-the-last-micro-batch-of-a-step.toml"
    r = run(tmp_path / "planted", golden_root, scenario, "tests.planted.emergency_save_mid_step_only")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "lost_work@2" in bad and "2 step(s) lost" in bad["lost_work@2"], bad
    assert "fault_0_preemption_handled" not in bad  # at the cadence step the checkpoint was there


def test_a_fresh_start_on_the_tensors_of_a_failed_load_is_caught(tmp_path, golden_root):
    scenario = "storage/flip-in-the-only-checkpoint-as-its-load-begins.toml"
    r = run(tmp_path / "planted", golden_root, scenario, "tests.planted.fresh_start_keeps_failed_load")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "in launch 1, which started afresh after rejecting step_00000004" in bad["trajectory"], bad
    assert "built anew" in bad["trajectory"]


def test_a_resume_that_checks_sizes_but_not_checksums_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "storage/corrupt-four-newest-four-ways.toml", "tests.planted.validates_sizes_only")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "step_00000010 was corrupted (__0_0.distcp: 8 bits flipped" in bad["fault_0_detected"]
    assert "it resumed from step_00000010" in bad["fault_0_detected"]


def test_a_restore_that_gives_up_after_one_failed_download_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "remote/remote-download-cut-then-older-restored.toml", "tests.planted.restore_tries_newest_only")
    assert r.verdict == "fail"
    bad = failed(r)
    # step 6, or older where the lagging uploader skipped it: the remote tier's own record says which
    assert re.search(r"launch 1 resumed from scratch but the newest valid checkpoint after the crash was "
                     r"step_0000000[246]\b", bad["resumed_newest_valid@1"]), bad


def test_a_restore_that_trusts_what_it_downloaded_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "remote/remote-bit-rot-then-disk-lost.toml", "tests.planted.restore_trusts_download")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "step_00000008 was corrupted on the remote tier (__1_0.distcp: 8 bits flipped" in bad["fault_1_detected"]
    # what the unverified bytes then do depends on where the flip lands in the shard's layout: loaded
    # silently into a tensor, or a crash in torch.load's zip records; unrejected either way
    assert "but launch 1 did not reject it" in bad["fault_1_detected"]
    assert "launch 1 restored step_00000008 from the remote tier, which was" in bad["restored_durable@1"]


def test_a_load_that_takes_an_io_error_for_a_corrupt_checkpoint_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "storage/corrupt-manifests-then-eio-on-load.toml",
            "tests.planted.load_error_rejects_checkpoint")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "launch 1 resumed from step_00000002, expected step_00000004" in bad["resume_from"], bad


def test_an_async_save_committed_although_its_write_failed_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "storage/errno-in-async-save-then-shard-cut-on-load.toml",
            "tests.planted.async_write_error_ignored")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "fault_0_surfaced" in bad and "an error was swallowed" in bad["fault_0_surfaced"], bad


def test_a_resume_that_ignores_the_step_a_manifest_records_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "storage/corrupt-manifests-then-eio-on-load.toml",
            "tests.planted.ignores_manifest_step")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "step_00000010 was corrupted (manifest.json: step 10 -> 11) but launch 1 did not reject it" in bad[
        "fault_2_detected"], bad
    assert "launch 1 loaded step_00000010 although it was not a valid checkpoint: manifest says step 11.0" in bad[
        "never_loaded_torn@1"]


def test_a_drain_that_never_replaces_a_dead_uploader_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "remote/uploader-killed-during-final-drain.toml", "tests.planted.drain_without_respawn")
    assert r.verdict == "fail"
    bad = failed(r)
    # step 6, or older where the lagging uploader skipped it for step 8
    assert re.search(r"training finished with step_00000008, but the newest durable remote checkpoint is "
                     r"step_0000000[246]: the last upload never completed", bad["final_durable"]), bad


def test_a_restore_that_an_unreachable_remote_tier_stops_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "remote/remote-unreachable-across-restart.toml", "tests.planted.restore_needs_remote")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "training did not finish (last launch exit status 1)" in bad["job_completed"], bad
    assert "steps 7..10 of the golden run were never trained" in bad["trajectory"], bad


def test_an_uploader_that_trusts_its_puts_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "remote/shard-truncated-before-upload.toml", "tests.planted.uploader_trusts_its_puts")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "step_00000004 is marked durable (manifest.json uploaded) but __1_0.distcp has" in bad[
        "remote_durable_complete@0"], bad


def test_remote_retention_that_leaves_data_objects_behind_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "remote/upload-reset-mid-manifest.toml", "tests.planted.remote_delete_keeps_data")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "objects without a manifest older than the newest durable checkpoint" in bad["remote_retention"], bad


def test_async_checkpoints_never_handed_to_the_uploader_are_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "remote/async-saves-then-disk-lost.toml", "tests.planted.async_commit_not_uploaded")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "lost_work@1" in bad and "resumed at step 0" in bad["lost_work@1"], bad


def test_an_upgrade_that_reads_only_its_own_manifest_format_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "relaunch-after-a-manifest-format-upgrade.toml",
            "tests.planted.reads_only_its_own_format")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "resume_from" in bad and "scratch" in bad["resume_from"], bad
    assert "lost_work@1" in bad, bad


def test_an_upgrade_that_loads_an_older_format_unchecked_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "relaunch-after-a-manifest-format-upgrade.toml",
            "tests.planted.old_format_unchecked")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "resume_from" in bad and "step_00000008" in bad["resume_from"], bad
    assert "fault_0_detected" in bad and "step_00000008 was corrupted" in bad["fault_0_detected"], bad


def test_a_stall_reported_in_milliseconds_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "kill-rank1-mid-shard-write.toml", "tests.planted.stall_in_milliseconds")
    assert r.verdict == "fail"
    bad = failed(r)
    assert set(bad) == {"reported_timings"}, bad  # training and checkpoints are untouched
    assert "saved step_00000004: stall_s = " in bad["reported_timings"], bad
    assert "s, but the run had lasted " in bad["reported_timings"], bad


def test_a_drain_after_sigterm_that_ignores_the_grace_period_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "remote/remote-unreachable-across-preemption.toml",
            "tests.planted.drain_ignores_grace")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "fault_1_preemption_handled" in bad, bad
    assert "but the launch was still running when the 5s grace period ran out" in bad["fault_1_preemption_handled"]


def test_digests_that_leave_out_a_mid_step_checkpoints_gradients_are_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "preempt-before-first-optimizer-step.toml", "tests.planted.grads_left_out_of_digests")
    assert r.verdict == "unknown"  # the suite fails on it all the same (it allows no unknown)
    unknown = {c["name"]: c["detail"] for c in r.checks if c["verdict"] == "unknown"}
    assert set(unknown) == {"loaded_equals_saved@step_00000000.001"}, unknown
    assert "holds accumulated gradients, but its digests have none" in unknown["loaded_equals_saved@step_00000000.001"]
    assert not failed(r), failed(r)  # training itself is untouched


def test_a_commit_that_hashes_its_files_as_they_are_on_disk_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "storage/stray-bytes-in-a-shard-before-its-commit.toml",
            "tests.planted.commit_hashes_files_on_disk")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "fault_0_detected" in bad and "but it was committed" in bad["fault_0_detected"], bad
    assert "__0_0.distcp: " in bad["fault_0_detected"] and " bytes" in bad["fault_0_detected"], bad


def test_an_uploader_that_retries_without_its_backoff_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "remote/upload-reset-mid-manifest.toml", "tests.planted.retries_without_waiting")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "upload_backoff" in bad, bad
    said = re.search(r"it said it would wait ([0-9.]+)s, but its next event \(upload_attempt\) came ([0-9.]+)s later",
                     bad["upload_backoff"])
    assert said and float(said[2]) < float(said[1]), bad


def test_an_uploader_that_gives_up_an_attempt_early_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "remote/upload-reset-mid-manifest.toml", "tests.planted.gives_up_an_upload_early")
    assert r.verdict == "fail"
    bad = failed(r)
    assert set(bad) == {"upload_retries"}, bad
    assert "given up after 1 failed attempt(s) (numbered [1]), but upload_retries=2" in bad["upload_retries"], bad


def test_a_failed_emergency_save_swallowed_into_a_clean_exit_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "preempt-on-a-full-disk-stops-with-the-error.toml",
            "tests.planted.exits_0_after_a_failed_emergency_save")
    assert r.verdict == "fail"
    bad = failed(r)
    # the scenario says the disk-full launch fails (job_fails): both name the exit 0
    assert set(bad) == {"save_failure_policy", "fault_0_job_failed"}, bad
    assert "failed under on_save_failure = stop, but launch 0 exited with status 0" in bad["save_failure_policy"], bad


def test_a_time_cadence_that_saves_at_every_step_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "time-cadence-killed-twice.toml", "tests.planted.time_cadence_in_milliseconds")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "cadence" in bad, bad
    assert "on its cadence, 0." in bad["cadence"] and "ckpt_every_seconds=1" in bad["cadence"], bad


def test_an_uploader_that_reports_its_progress_in_percent_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "remote/uploader-killed-mid-object.toml", "tests.planted.upload_progress_in_percent")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "fault_0_landed" in bad, bad
    assert "and reported 10 of it" in bad["fault_0_landed"] and "progress its file did not have" in bad["fault_0_landed"]


def test_an_uploader_staging_that_nobody_sweeps_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "remote/uploader-killed-mid-object.toml",
            "tests.planted.uploader_keeps_stale_staging")
    assert r.verdict == "fail"
    bad = failed(r)
    assert list(bad) == ["no_strays"], bad
    assert bad["no_strays"] == "left behind after recovery: .upload-step_00000002"


def test_an_async_save_whose_copy_went_untimed_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "kill-async-save-mid-write.toml", "tests.planted.async_stage_time_lost")
    assert r.verdict == "fail"
    bad = failed(r)
    assert list(bad) == ["reported_timings"], bad
    assert "no stage_s among its phases, which every asynchronous save of the golden run reported" in (
        bad["reported_timings"])


def test_an_uploader_that_stages_by_hard_links_only_is_caught(tmp_path, golden_root):
    r = run(tmp_path, golden_root, "remote/upload-read-eio-on-a-staged-copy.toml",
            "tests.planted.staging_needs_hard_links")
    assert r.verdict == "fail"
    bad = failed(r)
    assert "final_durable" in bad, bad
    # its staging fails before the 2nd upload begins, so the EIO aimed at that upload never fires, and the
    # disk loss ordered after it (when.after = 0) is held, let go and never fires: both say so, unknown
    said = {c["name"]: c for c in r.checks}
    assert said["fault_0_fired"]["verdict"] == "unknown" and "never fired" in said["fault_0_fired"]["detail"]
    assert said["fault_1_fired"]["verdict"] == "unknown" and "when.after" in said["fault_1_fired"]["detail"]
