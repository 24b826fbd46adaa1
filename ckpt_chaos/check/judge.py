"""The judge: which checks a run gets, declared as two tables over one set of check functions, and
``check_run``, which makes them in the order declared.

``REFERENCE`` is for a trainer that reports through ``ckpt_chaos.probe`` (the reference trainer and
its planted copies: its own events say what it saved, loaded and committed); ``COMMAND`` for a
``[command]`` trainer, judged from what the automatic probe layer, fanotify and faultfs saw. A check
name means one thing and is made by one function in both (``tests/test_suites.py`` holds the tables
to the names their functions make); each function reads the evidence its trainer's run holds. A
declaration says when a run of a scenario that goes as the scenario expects gets a real verdict from
the check (not n/a): suite coverage goes by it (``check/coverage.py``). The checks live by theme in
``outcome.py`` (the run and its faults), ``trajectory.py``, ``resume.py``, ``commits.py``,
``remote.py`` and ``promises.py``.
"""

from __future__ import annotations

from pathlib import Path

from ckpt_chaos.check.commits import committed_valid, crash_states, manifest_facts
from ckpt_chaos.check.expected import harness_relaunch, relaunched, resumed
from ckpt_chaos.check.outcome import FILE_LANDED_POINTS, LANDED_POINTS, fault_effects, faults_fired, faults_landed, harness_health, \
    job_completed
from ckpt_chaos.check.promises import (committed_kept, final_directory, carries_manifest,
                                     refused_keys, save_failure_policy)
from ckpt_chaos.check.remote import remote_tier
from ckpt_chaos.check.resume import (cadence, config_changes, loaded_equals_saved, lost_work, resize_refused,
                                     resume_from, resumes)
from ckpt_chaos.check.timings import reported_timings, timings
from ckpt_chaos.check.trajectory import resize_rng, trajectory_check
from ckpt_chaos.check.verdict import CheckSpec, Report, Run
from ckpt_chaos.scenario import Scenario


def check_run(s: Scenario, run_dir: Path, golden: Path, harness_errors: list[str] | None = None) -> Report:
    """Every check of the scenario's table over a stored run, each function once, in the order declared."""
    run = Run.load(s, run_dir, golden, harness_errors)
    report = Report(launches=len(run.launches()))
    for make in dict.fromkeys(c.run for c in table(s)):
        make(run, report)
    return report


def table(s: Scenario) -> tuple[CheckSpec, ...]:
    """The checks a scenario's trainer gets."""
    return COMMAND if s.command is not None else REFERENCE


# ---- when a check applies ---------------------------------------------------------------------------

def _always(s: Scenario) -> bool:
    return True


def _remote(s: Scenario) -> bool:
    return s.remote is not None


def _restores(s: Scenario) -> bool:
    """A relaunch may restore from the remote tier: a fault took the local disk."""
    return _remote(s) and relaunched(s) and any(f.spec.loses_disk for f in s.faults)


def _lost_work_limit(s: Scenario) -> bool:
    return (s.expect.max_lost_steps is not None or bool(s.trainer.get("ckpt_every_steps"))
            or any(f.spec.notice for f in s.faults))


def _landed(s: Scenario) -> bool:
    return any(f.when.min_fraction is not None and f.when.point in LANDED_POINTS for f in s.faults)


def _job_failed(s: Scenario) -> bool:
    """The faulted launch fails as the kind says (kinds with an exit check of their own answer instead;
    a ``[command]`` trainer's preemption answers ``sigterm_honoured``)."""
    return any((f.spec.exit_check is None if s.command is None else not f.spec.sigterm_grace)
               and (s.expect.job_fails is not None or f.ends_launch) for f in s.faults)


def _changes(refused: bool):
    def applies(s: Scenario) -> bool:
        return relaunched(s) and any(bool(set(c) & refused_keys(s)) == refused for c in s.recovery.changes if c)
    return applies


# Every check the reference trainer's runs get, in the order they are made (the checks of a fault kind
# are its own: ``FaultKind.coverage``). Every run gets the harness's, the job's end, the trajectory and
# the checkpoints left at the end (the reference trainer commits checkpoints in every catalogue scenario).
REFERENCE: tuple[CheckSpec, ...] = (
    CheckSpec("no_hang", _always, harness_health),
    CheckSpec("harness_ok", _always, harness_health),
    CheckSpec("fault_fired", lambda s: bool(s.faults), faults_fired),
    CheckSpec("fault_landed", _landed, faults_landed),
    CheckSpec("job_completed", _always, job_completed),
    CheckSpec("fault_job_failed", _job_failed, fault_effects),
    CheckSpec("trajectory", _always, trajectory_check),
    CheckSpec("final_state", lambda s: s.expect.trajectory == "bit-exact", trajectory_check),
    CheckSpec("loaded_equals_saved", resumed, loaded_equals_saved),
    CheckSpec("resize_rng", lambda s: resumed(s) and s.resumed_world_size() != s.world_size, resize_rng),
    CheckSpec("resumed_newest_valid", harness_relaunch, resumes),
    CheckSpec("never_loaded_torn", lambda s: harness_relaunch(s) and s.expect.resume_from is not None, resumes),
    CheckSpec("resume_from", lambda s: resumed(s) and s.expect.resume_from is not None, resume_from),
    CheckSpec("config_accepted", _changes(False), config_changes),
    CheckSpec("config_refused", _changes(True), config_changes),
    CheckSpec("cadence", lambda s: s.trainer.get("ckpt_every_steps") is not None, cadence),
    # n/a where a fault damaged the checkpoint `latest` names; none where the disk is gone with it
    CheckSpec("latest_valid", lambda s: resumed(s) and not any(f.spec.damages or f.spec.loses_disk
                                                               for f in s.faults), crash_states),
    CheckSpec("committed_survives", resumed, crash_states),
    CheckSpec("committed_valid", _always, committed_valid),
    CheckSpec("manifest_facts", carries_manifest, manifest_facts),
    CheckSpec("remote_durable_complete", _remote, remote_tier),
    CheckSpec("restored_durable", _restores, remote_tier),
    CheckSpec("restored_in_place", _restores, remote_tier),
    CheckSpec("uploaded_durable", _remote, remote_tier),
    CheckSpec("final_durable", _remote, remote_tier),
    CheckSpec("remote_retention", _remote, remote_tier),
    # an upload attempt fails when a fault cuts or stalls its link (other faults may fail one too)
    CheckSpec("upload_backoff", lambda s: _remote(s) and any(f.spec.on_link for f in s.faults), remote_tier),
    # decided where an upload was given up, which a fault on its link can make happen
    CheckSpec("upload_retries", lambda s: _remote(s) and any(f.spec.on_link for f in s.faults), remote_tier),
    CheckSpec("upload_stall", _remote, remote_tier),
    CheckSpec("lost_work", lambda s: relaunched(s) and _lost_work_limit(s), lost_work),
    CheckSpec("no_strays", _always, final_directory),
    CheckSpec("retention", _always, final_directory),  # promises.py: exactly what the declared policy keeps
    CheckSpec("retention_kept", lambda s: bool(s.trainer.get("keep_every") or s.trainer.get("keep_best")),
              final_directory),
    CheckSpec("committed_kept", _always, committed_kept),
    CheckSpec("save_failure_policy", lambda s: s.trainer.get("on_save_failure") == "stop", save_failure_policy),
    CheckSpec("detected_in_time", lambda s: s.expect.detect_within_s is not None and relaunched(s),
              timings),
    CheckSpec("reported_timings", _always, reported_timings),  # every catalogue run trains a step and times it
)

# Every check a [command] trainer's runs get, in the order they are made: fault kinds' own exit and
# effect checks read the reference trainer's events, so they are not made here.
COMMAND: tuple[CheckSpec, ...] = (
    CheckSpec("no_hang", _always, harness_health),
    CheckSpec("harness_ok", _always, harness_health),
    CheckSpec("fault_fired", lambda s: bool(s.faults), faults_fired),
    CheckSpec("fault_landed", lambda s: any(f.when.point in FILE_LANDED_POINTS for f in s.faults), faults_landed),
    CheckSpec("job_completed", _always, job_completed),
    CheckSpec("fault_job_failed", _job_failed, fault_effects),
    CheckSpec("fault_sigterm_honoured", lambda s: any(f.spec.sigterm_grace for f in s.faults), fault_effects),
    CheckSpec("resumed_newest", relaunched, resumes),
    CheckSpec("no_torn_read", relaunched, resumes),
    CheckSpec("resume_from", lambda s: s.expect.resume_from is not None, resume_from),
    CheckSpec("lost_work", relaunched, lost_work),
    CheckSpec("trajectory", _always, trajectory_check),
    CheckSpec("committed_valid", _always, committed_valid),
    CheckSpec("retention", lambda s: s.command.keep_last is not None, final_directory),
    CheckSpec("config_accepted", _changes(False), config_changes),
    CheckSpec("config_refused", _changes(True), config_changes),
    CheckSpec("resize_refused", lambda s: relaunched(s) and "world_size" in s.expect.refused, resize_refused),
    CheckSpec("resize_rng", lambda s: relaunched(s) and s.resumed_world_size() != s.world_size
              and "world_size" not in s.expect.refused, resize_rng),
    CheckSpec("detected_in_time", lambda s: s.expect.detect_within_s is not None and relaunched(s), timings),
)
