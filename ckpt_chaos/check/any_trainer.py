"""Checks that hold for any trainer (a scenario's ``[command]``), from what the automatic probe
layer saw (its points in ``history.jsonl``, its ``trajectory.jsonl``) and what the trainer itself
counts as a complete checkpoint (``command.complete``, listed at the end of every launch).

* ``fault_N_landed`` (per fault on a file write: ``file.write``, ``faultfs.write``, ``ckpt.shard.write``):
  the bytes of the file when it fired, against the same file's size in the golden run, within a tenth
  past ``when.min_fraction`` where given (``checks._landed_in_file``);
* ``job_completed``: the last launch exited 0 having trained every step of the golden run;
* ``job_failed`` (per fault that ends a launch, or of any kind where ``expect.job_fails`` says how
  the launch ends): the faulted launch failed (or, ``job_fails = false``, did not); a SIGTERM was
  honoured within its grace period;
* ``resumed_newest@N``: launch N loaded the newest checkpoint that was complete when launch N-1
  ended, or started fresh when there was none;
* ``resume_from`` (where ``expect.resume_from`` names it): the first relaunch resumed from it; a job
  that ended without a relaunch fails it, since the promise was a relaunch;
* ``no_torn_read@N``: launch N did not load a file that was still being written when launch N-1 died;
* ``lost_work@N``: at most ``expect.max_lost_steps`` steps trained again, or where not given
  ``command.save_every`` for each save that may be lost (``1 + command.saves_in_flight``);
* ``trajectory``: every step of the golden run, bit for bit (or within ``expect.rel_tol``), with a
  diagnosis of the first divergent step: which recorded part differs (samples, learning rate, loss)
  and, for the first step after a resume, which part of the state the step started from differs
  from the golden run's at the same step (model, optimizer, RNG);
* ``committed_valid``: every checkpoint the job counts complete as it ends is whole: none of its
  files was left mid-write, closed after a failed write, or empty or missing where the golden run's
  was not. What a relaunch would find is judged even when no relaunch came;
* ``retention`` (where ``command.keep_last`` declares it): the newest K checkpoints it wrote are kept
  at the end, no more and no fewer (``promises.command_retention``);
* ``config_refused@N`` / ``config_accepted@N`` (where ``recovery.changes`` changes its options): a
  relaunch given an option ``expect.refused`` names exits non-zero without training a step, names
  the option in its output and leaves its complete checkpoints as they were; one given only other
  options resumes from a checkpoint and trains.
"""

from __future__ import annotations

import json
from pathlib import Path

from ckpt_chaos.check.checks import _faults_fired, _faults_landed, _harness_health, sample_shift
from ckpt_chaos.check.verdict import Report, Run
from ckpt_chaos.check.evidence import Evidence, Resume
from ckpt_chaos.check.history import Exited, launch_logs, read_jsonl, step_loss
from ckpt_chaos.check.promises import command_retention, refusal_problems
from ckpt_chaos.check.timings import command_timings
from ckpt_chaos.scenario import Scenario

EXACT = ("loss_hex", "lr_hex", "samples", "model_digest", "optimizer_digest")
STATE = {"pre_model_digest": "model", "pre_optimizer_digest": "optimizer", "pre_rng": "torch RNG",
         "pre_python_rng": "Python RNG", "pre_numpy_rng": "NumPy RNG"}


def check_run(s: Scenario, run_dir: Path, golden: Path, harness_errors: list[str] | None = None) -> Report:
    run = Run.load(s, run_dir, golden, harness_errors)
    report = Report(launches=len(run.launches()))
    _harness_health(run, report)
    _faults_fired(run, report)
    _faults_landed(run, report)
    ev = Evidence(run)
    _unfired_loads(run, ev, report)
    gold, got = _steps(golden), ev.steps()
    _completion(run, report, gold, got)
    _fault_effects(run, report)
    for launch in run.launches()[1:]:
        _resume(run, ev, report, launch)
    _no_relaunch(run, report)
    _trajectory(run, ev, report, gold, got)
    _left_whole(run, ev, report)
    command_retention(run, ev, report)
    _config_changes(run, ev, report)
    command_timings(run, ev, report)
    return report


def _config_changes(run: Run, ev: Evidence, report: Report) -> None:
    """What each relaunch given changed options (``recovery.changes``) did with them: those named in
    ``expect.refused`` refused, the others taken."""
    logs = launch_logs(run.dir) or {}
    for n, change in enumerate(run.s.recovery.changes, 1):
        ex, before = run.exit_of(n), run.exit_of(n - 1)
        if ex is None or not change:
            continue
        what = ", ".join(f"{k} = {v!r}" for k, v in change.items())
        refused = sorted(k for k in change if k in run.s.expect.refused)
        trained = ev.trained(n)
        if not refused:
            r = ev.resumed_from(n)
            if not trained:
                report.add("config_accepted", False, at=n, detail=f"launch {n} changed only {what}, which a resume may "
                           f"change, but it trained no step (exit status {ex.rc}); see its part of torchrun.log")
            elif not r.decided:
                report.add("config_accepted", "unknown", at=n, detail=f"launch {n} changed {what} and trained from "
                           f"step {trained[0]}, but where it resumed from is not known: {r.missing}")
            else:
                report.add("config_accepted", r.checkpoint is not None, at=n, detail=
                           f"launch {n} changed {what} and resumed from {r.checkpoint} ({r.how})" if r.checkpoint else
                           f"launch {n} changed {what}, which a resume may change, but it started over ({r.how})")
            continue
        problems = refusal_problems(ex.rc, [f"it trained steps {trained[0]} to {trained[-1]}"] if trained else [],
                                    logs.get(n), refused)
        untouched = None if before is None or before.complete is None or ex.complete is None else \
            before.complete == ex.complete
        if untouched is False:
            problems.append(f"its complete checkpoints changed: {sorted(before.complete)} before it, "
                            f"{sorted(ex.complete)} after it")
        if problems:
            report.add("config_refused", False, at=n, detail=f"launch {n} changed {what}, which a resume must "
                       "refuse, but " + "; ".join(problems))
        elif untouched is None:
            report.add("config_refused", "unknown", at=n, detail=f"launch {n} changed {what} and exited {ex.rc} "
                       f"naming {', '.join(refused)} without training, but what was complete around it was not "
                       "recorded, so whether it left the checkpoints as they were is not known")
        else:
            report.add("config_refused", True, at=n, detail=f"launch {n} changed {what} and was refused: it exited "
                       f"{ex.rc} naming {', '.join(refused)} without training a step, its complete checkpoints "
                       "as they were")


def _unfired_loads(run: Run, ev: Evidence, report: Report) -> None:
    """A trigger on a relaunch's load that never fired, where the files show the relaunch did read its
    checkpoint: it read it with code no patch sees, which the failure says, with where to aim."""
    for c in report.checks:
        f = run.s.faults[c.fault] if c.fault is not None and c.check == "fault_fired" else None
        if c.verdict != "fail" or f is None or not f.when.point.startswith("load."):
            continue
        files = [r.path for r in ev.reads(f.attempt)]
        if files:
            c.detail += (f"; launch {f.attempt} did read {', '.join(sorted(set(files))[:4])} (seen by "
                         f"{' and '.join(sorted({r.source for r in ev.reads(f.attempt)}))}), through code no patch of "
                         "the layer sees, so no load point fired: aim at faultfs.open with that path, or at the "
                         "relaunch's first step.begin")


def _steps(run_dir: Path) -> dict[int, dict]:
    """Step -> record of rank 0; where a relaunch trained a step again, its record wins."""
    return {r["step"]: r for r in read_jsonl(Path(run_dir) / "trajectory.jsonl")}


def _completion(run: Run, report: Report, gold: dict, got: dict) -> None:
    exits = run.records(Exited)
    rc = exits[-1].rc if exits else None
    last = max(gold, default=0)
    ok = rc == 0 and last in got
    report.add("job_completed", ok, f"the trainer exited 0 after {report.launches} launch(es), step {last} trained"
               if ok else f"the job did not finish: last launch exit status {rc}, last step recorded "
               f"{max(got, default=0)} of {last}; see torchrun.log")


def _fault_effects(run: Run, report: Report) -> None:
    for h in run.faults():
        fault = run.s.faults[h.index]
        ex = run.exit_of(h.launch)
        if fault.spec.sigterm_grace:
            late = bool(ex and ex.grace_expired)
            report.add("sigterm_honoured", not late, fault=h.index, detail=
                       "the launch ended within the preemption's grace period" if not late else
                       "the grace period ran out before the launch ended: the trainer ignored its SIGTERM or took "
                       "too long to stop; it was SIGKILLed")
            continue
        want = run.s.expect.job_fails
        if want is None and not fault.ends_launch:
            continue  # whether the job stops is the trainer's policy, unless the scenario says
        want = True if want is None else want
        if ex is None:
            report.add("job_failed", "unknown", fault=h.index, detail=f"how launch {h.launch} ended was not recorded")
            continue
        ok = (ex.rc != 0) == want
        report.add("job_failed", ok, fault=h.index, detail=f"launch {h.launch} exited with status {ex.rc}"
                   + ("" if ok else f", where the scenario expects it to {'fail' if want else 'succeed'}"
                      " (expect.job_fails)"))


def _resume(run: Run, ev: Evidence, report: Report, launch: int) -> None:
    before = run.exit_of(launch - 1)
    torn = ev.torn(launch - 1)
    # a checkpoint with a torn or missing file is not complete, whatever its name says
    complete = {p: v for p, v in ((before.complete or {}) if before else {}).items() if not _torn_in(ev, torn, p)}
    r = ev.resumed_from(launch)
    newest = max(complete, key=lambda p: (complete[p]["mtime_ns"], p)) if complete else None
    newest_ckpt = (ev.checkpoint_of(newest) or newest) if newest else None
    lost = _power_loss(run, launch - 1)
    if not r.decided:
        report.add("resumed_newest", "unknown", at=launch, detail=r.missing)
    elif before is None or before.complete is None:
        report.add("resumed_newest", "unknown", at=launch, detail=f"it resumed from {r.checkpoint or 'nothing'} "
                   f"({r.how}), but what launch {launch - 1} left complete was not recorded")
    elif newest is None:
        report.add("resumed_newest", r.checkpoint is None, at=launch, detail=
                   f"nothing was complete, and the launch started fresh ({r.how})" if r.checkpoint is None else
                   f"it resumed from {r.checkpoint} ({r.how}), although nothing matching command.complete was "
                   "complete there" + (f"; {lost}" if lost else ""))
    elif r.checkpoint is None:
        report.add("resumed_newest", False, at=launch, detail=f"it started fresh ({r.how}) although {newest} "
                   "was complete")
    else:
        ok = r.checkpoint == newest_ckpt
        report.add("resumed_newest", ok, at=launch, detail=f"it loaded {r.checkpoint}, the newest complete "
                   f"checkpoint ({r.how})" if ok else f"it loaded {r.checkpoint} ({r.how}), but the newest complete "
                   f"checkpoint was {newest} (complete: {', '.join(sorted(complete))})")
    read = set(r.files) | ({r.checkpoint} if r.checkpoint else set())
    hit = sorted(p for p in torn if any(_within(p, q) for q in read))
    # a stray temporary file is no file of its checkpoint: it counts where the launch was seen to read it
    strays = ev.strays(launch - 1)
    hit += sorted(p for p in strays if p in r.files)
    torn = {**torn, **strays}
    if hit:
        report.add("no_torn_read", False, at=launch, detail=f"it resumed from {r.checkpoint or 'files'} ({r.how}), "
                   f"which launch {launch - 1} left torn or incomplete: "
                   + "; ".join(f"{p}: {torn[p]}" for p in hit) + (f"; {lost}" if lost else ""))
    elif not torn:
        report.add("no_torn_read", True, at=launch, detail=f"launch {launch - 1} left no checkpoint file torn or "
                   "incomplete")
    elif r.decided:
        report.add("no_torn_read", True, at=launch, detail=f"it resumed from {r.checkpoint or 'nothing'}, not from "
                   f"what launch {launch - 1} left torn ({', '.join(sorted(torn)[:4])})")
    else:
        report.add("no_torn_read", "unknown", at=launch, detail=f"launch {launch - 1} left "
                   f"{', '.join(sorted(torn)[:4])} torn or incomplete, and which files launch {launch} read is not "
                   f"known: {r.missing}")
    report.resumed_from.append(r.label())
    want = run.s.expect.resume_from
    if want is not None and len(report.resumed_from) == 1:
        # the name as the scenario gives it: the checkpoint's entry, with or without the folder
        name = r.checkpoint.split("/", 1)[-1] if r.checkpoint and r.checkpoint.startswith(ev.ckpt + "/") else r.checkpoint
        report.add("resume_from", "unknown" if not r.decided else name == want or r.checkpoint == want,
                   r.missing if not r.decided else f"launch {launch} resumed from {r.checkpoint or 'scratch'}"
                   + ("" if name == want or r.checkpoint == want else f", expected {want}"))
    _lost_work(run, ev, report, launch, lost)


def _no_relaunch(run: Run, report: Report) -> None:
    """``expect.resume_from`` promises a relaunch; a job that ended in one launch broke the promise
    (``_resume`` judges the relaunches that came)."""
    want = run.s.expect.resume_from
    if want is None or len(run.launches()) > 1:
        return
    ex = run.exit_of(run.launches()[-1]) if run.launches() else None
    how = "was not recorded" if ex is None else f"was exit status {ex.rc}"
    report.add("resume_from", False, f"the scenario expects a relaunch to resume from {want}, but no relaunch came: "
               f"the job ended in one launch, whose end {how}" + (
                   "; the fault did not stop it (see expect.job_fails and the trainer's own log)"
                   if ex is not None and ex.rc == 0 and run.faults() else ""))


def _left_whole(run: Run, ev: Evidence, report: Report) -> None:
    """The checkpoints the job counts complete as it ends (``command.complete`` in its folder, after its
    last launch) are whole: what a relaunch would resume from, judged even when none came. A launch a
    fault ended, with no relaunch after it, leaves ``unknown``: whether the trainer's own load would
    take such a file is not shown."""
    launches = run.launches()
    if not launches:
        return
    last = launches[-1]
    ex = run.exit_of(last)
    if ex is None or ex.complete is None:
        report.add("committed_valid", "unknown", f"what launch {last} left complete was not recorded")
        return
    torn = ev.torn(last)
    # half-written temporary files: no file of their checkpoint, so they decide no verdict, but they take
    # space, and a load that globs its folder would find them
    stray = ev.strays(last)
    counted = {p for c in ex.complete for p in _torn_in(ev, stray, c)}
    strays = "" if not stray else (
        f"; {len(stray)} stray temporary file(s) left half written in checkpoint folders, never renamed into "
        "place (no file of their checkpoint: a load that opens its files by name skips them): "
        + "; ".join(f"{p}: {how}" + (" (in a checkpoint counted complete)" if p in counted else "")
                    for p, how in sorted(stray.items())[:4]) + (" ..." if len(stray) > 4 else ""))
    if run.s.resumed_world_size() != run.s.world_size:
        # a resume at another world size writes other files per checkpoint than the golden run
        torn = {p: how for p, how in torn.items() if not how.startswith("missing")}
    hit = {p: [f"{t}: {torn[t]}" for t in _torn_in(ev, torn, p)] for p in sorted(ex.complete)}
    hit = {p: why for p, why in hit.items() if why}
    if not hit:
        report.add("committed_valid", True, f"the {len(ex.complete)} checkpoint(s) counted complete as the job "
                   f"ended hold no file left mid-write, closed after a failed write, or empty or missing where the "
                   f"golden run's was not" + strays)
        return
    ended_by = [h for h in run.faults() if h.launch == last and run.s.faults[h.index].ends_launch]
    names = ", ".join(hit)
    why = "; ".join(w for ws in hit.values() for w in ws[:3])
    if ended_by:
        report.add("committed_valid", "unknown", f"launch {last}, which a fault ended, left {names} counted complete "
                   f"(command.complete) but torn ({why}); no relaunch came to show whether the trainer's load "
                   "would take it")
        return
    report.add("committed_valid", False, f"the job ended (launch {last}, exit status {ex.rc}) counting {names} "
               f"complete (command.complete), but {why}: a relaunch would resume from a torn checkpoint"
               + ("" if len(hit) < len(ex.complete) else "; no whole checkpoint is left") + strays)



def _lost_work(run: Run, ev: Evidence, report: Report, launch: int, lost: str | None) -> None:
    """Steps trained again by the launch: the furthest step any launch before it reached against the
    step it began at. A launch that trained no step (killed during its load) is measured by the next
    launch that trained, against the same furthest step. The bound: ``expect.max_lost_steps`` where
    given, else ``command.save_every`` steps for each save that may be lost (``1 +
    command.saves_in_flight``: an asynchronous save may still be writing when the next one begins)."""
    limit, source = lost_work_limit(run.s)
    reached = [s for n in run.launches() if n < launch for s in ev.trained(n)]
    started = ev.trained(launch)
    if limit is None:
        report.add("lost_work", "n/a", at=launch, detail=source)
    elif not started and any(ev.trained(n) for n in run.launches() if n > launch):
        return
    elif not started:
        report.add("lost_work", "unknown", at=launch, detail=f"launch {launch} began no step, nor did any after it, "
                   "so how much it would have trained again is not known")
    elif not reached:
        report.add("lost_work", True, at=launch, detail=f"no launch before it trained a step, so it lost none; it "
                   f"began at step {started[0]}")
    else:
        lost_steps = max(reached) - (started[0] - 1)
        report.steps_lost = (report.steps_lost or 0) + max(0, lost_steps)
        report.add("lost_work", lost_steps <= limit, at=launch, detail=f"{lost_steps} step(s) trained again, at "
                   f"most {limit} allowed" + (f" ({source})" if source else "")
                   + ("" if lost_steps <= limit else f": it went back to step {started[0] - 1} from {max(reached)}"
                      + (f"; {lost}" if lost else "")))


def lost_work_limit(s: Scenario) -> tuple[int | None, str]:
    """The steps a relaunch of a ``[command]`` trainer may train again, and where the bound comes from
    (empty for the plain ``command.save_every``); None and why where the scenario states none."""
    c = s.command
    if s.expect.max_lost_steps is not None:
        return s.expect.max_lost_steps, "expect.max_lost_steps"
    if c is None or c.save_every is None:
        return None, "neither command.save_every nor expect.max_lost_steps is given"
    if c.saves_in_flight:
        return (c.save_every * (1 + c.saves_in_flight), f"{1 + c.saves_in_flight} × command.save_every: "
                f"command.saves_in_flight = {c.saves_in_flight}")
    return c.save_every, ""


def _within(path: str, entry: str) -> bool:
    return path == entry or path.startswith(entry.rstrip("/") + "/")


def _torn_in(ev: Evidence, torn: dict[str, str], entry: str) -> list[str]:
    """The torn files of the checkpoint a complete entry belongs to (the entry itself, or its folder)."""
    return [t for t in sorted(torn) if _within(t, entry) or _within(t, ev.checkpoint_of(entry) or entry)]


def _power_loss(run: Run, launch: int) -> str | None:
    """What a power cut that ended ``launch`` lost for want of an fsync, in a sentence, or None."""
    try:
        from ckpt_chaos.check.durability import power_loss_summary
    except ImportError:
        return None
    return power_loss_summary(run, launch)


def _trajectory(run: Run, ev: Evidence, report: Report, gold: dict, got: dict) -> None:
    missing = sorted(set(gold) - set(got))
    if missing:
        report.add("trajectory", False, f"steps {missing[0]}..{missing[-1]} of the golden run were never trained")
        return
    meta = json.loads((run.golden / "golden.json").read_text())
    if run.s.expect.trajectory == "bit-exact" and not meta.get("deterministic", True):
        d = meta["differs"]
        report.add("trajectory", False, f"the trainer is not deterministic: two fault-free runs differ at step "
                   f"{d['step']} ({', '.join(d['fields'])}), so no bit-exact comparison can hold; use "
                   "expect.trajectory = \"tolerance\" with a stated rel_tol")
        return
    if run.s.expect.trajectory == "bit-exact":
        for step in sorted(gold):
            fields = [k for k in EXACT if k in gold[step] and gold[step].get(k) != got[step].get(k)]
            if fields:
                report.add("trajectory", False, _diagnose(run, ev, gold, got, step, fields))
                return
        if _past_the_end(run, ev, report, gold, got):
            return
        final = _final_state(run, ev, max(gold))
        if final is not None and final:
            report.add("trajectory", False, f"every loss of the golden run's {max(gold)} steps is identical, but the "
                       f"{' and '.join(final)} state the job ended with differs from the golden run's")
            return
        report.add("trajectory", True, f"{len(gold)} steps identical to the golden run, bit for bit"
                   + (", and the state the job ended with" if final is not None else ""))
        return
    tol, worst, at = run.s.expect.rel_tol, 0.0, None
    for step in sorted(gold):
        if gold[step].get("samples") != got[step].get("samples"):
            report.add("trajectory", False, _diagnose(run, ev, gold, got, step, ["samples"]))
            return
        a, b = _loss(gold[step]), _loss(got[step])
        rel = abs(a - b) / max(abs(a), 1e-12)
        if rel > worst:
            worst, at = rel, step
    if worst <= tol and _past_the_end(run, ev, report, gold, got):
        return
    report.add("trajectory", worst <= tol, f"same samples at every step; largest relative loss difference "
               f"{worst:.3%} (step {at}), tolerance {tol:.1%}" if worst <= tol else
               _diagnose(run, ev, gold, got, at, [f"loss off by {worst:.2%} > {tol:.1%}"]))


def _past_the_end(run: Run, ev: Evidence, report: Report, gold: dict, got: dict) -> bool:
    """Steps the golden run never reached were trained: the job went on past its end, as a trainer
    does whose own step counter a resume did not restore (the optimizer's count, recorded here, went
    on from the checkpoint). Reported as the trajectory's failure; True if so."""
    extra = sorted(set(got) - set(gold))
    if not extra:
        return False
    last = max(gold)
    resume = _resume_before(run, ev, extra[0])
    where = (f"; the optimizer's own count went on from the checkpoint launch {resume[0]} loaded "
             f"({resume[2].checkpoint}) while the trainer counted to its end again: its step counter was not restored"
             if resume is not None and resume[2].checkpoint is not None else "")
    report.add("trajectory", False, f"steps {extra[0]}..{extra[-1]} were trained, past the golden run's last "
               f"step {last} ({len(extra)} step(s) too many; the {last} steps of the golden run are identical)"
               + where)
    return True


def _exit_digests(run_dir: Path) -> dict:
    """The model and optimizer digests rank 0 took as its last process exited."""
    exits = [e for e in read_jsonl(run_dir / "events.jsonl") if e.get("event") == "exit"]
    return exits[-1] if exits else {}


def _final_state(run: Run, ev: Evidence, last: int) -> list[str] | None:
    """The last update shows in no loss, so the state the job ended with (rank 0's digests at its
    exit) is compared with the golden run's: the parts that differ, or None where either run has
    no such digests (or the job did not end at the golden run's last step, as the last launch's
    steps are numbered: ``Evidence.numbering``)."""
    gold, got = _exit_digests(run.golden), _exit_digests(run.dir)
    keys = [k for k in ("model_digest", "optimizer_digest") if k in gold and k in got]
    launches = run.launches()
    if not keys or got.get("step", 0) + (ev.offset(launches[-1]) if launches else 0) != last:
        return None
    return [k.split("_")[0] for k in keys if gold[k] != got[k]]


_loss = step_loss  # the step's loss as the report's loss plot reads it


def _diagnose(run: Run, ev: Evidence, gold: dict, got: dict, step: int, fields: list[str]) -> str:
    head = f"trajectory diverges at step {step} ({', '.join(fields)})"
    if "samples" in fields:
        head += ": the job trained on different samples than the golden run" + sample_shift(gold, got, step, "samples")
    if "lr_hex" in fields:
        head += (f": the learning rate is {float.fromhex(got[step]['lr_hex']):.6g} where the golden run's was "
                 f"{float.fromhex(gold[step]['lr_hex']):.6g} (the LR schedule's state)")
    resume = _resume_before(run, ev, step)
    if resume is None:
        return head + ", before any resume: the fault changed training itself, or the trainer is not deterministic"
    launch, first, r = resume
    source = (r.checkpoint if r.checkpoint else "nothing (a fresh start)") if r.decided else "a checkpoint not known"
    where = f"; it is {'the first step' if first == step else f'{step - first + 1} steps'} after resuming " \
            f"from {source} (launch {launch})"
    num = ev.numbering(launch)
    if num.offset and num.recorded == 1:
        where += (f", where the optimizer's own step count began again at 1 (its steps are compared as steps "
                  f"{first}..): the optimizer's state was not restored")
    elif num.offset:
        where += (f", where the optimizer's own step count went on from {num.recorded - 1} while {num.basis} say "
                  f"it resumed after step {num.first - 1} (its steps are compared as steps {first}..): the optimizer "
                  f"state it loaded is that of {'a later' if num.offset < 0 else 'an earlier'} step than the "
                  "checkpoint's")
    g, r = gold.get(first, {}), got.get(first, {})
    unstable = json.loads((run.golden / "golden.json").read_text()).get("unstable", [])
    keys = [k for k in STATE if k in g and k in r and k not in unstable]
    if not keys:
        return head + where + "; the state it started from was not recorded, so the cause cannot be narrowed down"
    diff = [STATE[k] for k in keys if g[k] != r[k]]
    same = [STATE[k] for k in keys if g[k] == r[k]]
    if diff:
        return (head + where + f"; the {', '.join(diff)} state it resumed with differs from the golden run's at step "
                f"{first}" + (f" ({', '.join(same)} identical)" if same else ""))
    return (head + where + f"; the {', '.join(same)} state it resumed with equals the golden run's, so the cause is "
            "something none of them captures")


def _resume_before(run: Run, ev: Evidence, step: int) -> tuple[int, int, Resume] | None:
    """(launch, its first step, where it resumed from) of the last relaunch that began at or before ``step``."""
    best = None
    for launch in run.launches()[1:]:
        begins = ev.trained(launch)
        if begins and begins[0] <= step:
            best = (launch, begins[0], ev.resumed_from(launch))
    return best
