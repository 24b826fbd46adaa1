"""Resume checks: where each relaunch resumed from (the one answer, ``Run.resumed_from``) against what
the launch before it left (``resumed_newest_valid``/``resumed_newest``, never a torn checkpoint:
``never_loaded_torn``/``no_torn_read``), the promised resume point (``resume_from``), the state loaded
against the state saved, the work trained again (``lost_work``), the save cadence, and relaunches
given changed options (``config_refused``/``config_accepted``).
"""

from __future__ import annotations

from ckpt_chaos.check.commits import blame, kind_of, power_loss, torn_in
from ckpt_chaos.check.evidence import Evidence
from ckpt_chaos.check.names import within
from ckpt_chaos.check.history import launch_logs
from ckpt_chaos.check.promises import refusal_problems, refused_keys
from ckpt_chaos.check.trajectory import component_diff, exempt
from ckpt_chaos.check.verdict import Report, Run, first_few
from ckpt_chaos.probe.layout import parse_name
from ckpt_chaos.scenario import Scenario


def resumes(run: Run, report: Report) -> None:
    """Each relaunch resumed from the newest checkpoint whole when the launch before it ended, and read
    nothing that launch left torn."""
    if run.s.command is None:
        _reference_resumes(run, report)
        return
    for launch in run.launches()[1:]:
        _command_resume(run, run.evidence, report, launch)


def resume_from(run: Run, report: Report) -> None:
    """``expect.resume_from``: the first relaunch whose resume is known resumed from that checkpoint (named
    with or without the checkpoint folder); a job that ended in one launch broke the promise of a
    relaunch."""
    want = run.s.expect.resume_from
    relaunches = run.launches()[1:]
    if want is None:
        return
    if not relaunches:
        _no_relaunch(run, report)
        return
    resumed = [run.resumed_from(n) for n in relaunches]
    r = next((r for r in resumed if r.decided), None)
    if r is None:
        report.add("resume_from", "unknown", resumed[0].missing)
        return
    folder = run.s.command.ckpt_dir if run.s.command is not None else None
    # the name as the scenario gives it: the checkpoint's entry, with or without the folder
    name = r.checkpoint.split("/", 1)[-1] if r.checkpoint and folder and r.checkpoint.startswith(folder + "/") \
        else r.checkpoint
    ok = name == want or r.checkpoint == want
    report.add("resume_from", ok, f"launch {r.launch} resumed from {r.checkpoint or 'scratch'}"
               + ("" if ok else f", expected {want}"))


def lost_work(run: Run, report: Report) -> None:
    """At most the promised steps trained again after each relaunch (``expect.max_lost_steps``, else the
    save interval)."""
    if run.s.command is None:
        _reference_lost_work(run, report)
        return
    for launch in run.launches()[1:]:
        _command_lost_work(run, run.evidence, report, launch, power_loss(run, launch - 1))


def config_changes(run: Run, report: Report) -> None:
    """A relaunch given an option ``expect.refused`` names (or one the trainer's profile says shapes the
    trajectory) is refused; one given only other options resumes."""
    if run.s.command is None:
        _reference_config_changes(run, report)
    else:
        _command_config_changes(run, run.evidence, report)


def _reference_resumes(run: Run, report: Report) -> None:
    """Each relaunch resumed from the newest checkpoint that validates after the crash, never a torn
    one."""
    for launch in run.launches()[1:]:
        r = run.resumed_from(launch)
        if not r.decided:
            continue
        name = r.checkpoint
        report.resumed_from.append(name or "scratch")
        before = run.exit_of(launch - 1)
        if before is None or run.s.recovery.relaunch == "torchrun":  # no snapshot between torchrun restarts
            continue
        snap = before.snapshot
        # a durable checkpoint whose download a fault of this launch cut was out of the restore's reach
        cut = {h.at["info"].get("name") for h in run.faults()
               if h.launch == launch and h.at["point"] == "remote.download" and not kind_of(run, h).heals}
        remote = [n for n, r in (before.remote or {}).get("checkpoints", {}).items() if r is None and n not in cut]
        # a checkpoint a fault of this launch damaged after it validated, as its load began, is not valid
        damaged = {h.detail.get("checkpoint") for h in run.faults()
                   if h.launch == launch and h.at["point"] == "load.begin" and kind_of(run, h).damages}
        local = ([n for n, r in snap["checkpoints"].items() if r is None and n not in damaged]
                 if damaged else [snap["newest_valid"]])
        newest = _newest(*local, *remote)
        ok = name == newest
        report.add("resumed_newest_valid", ok, at=launch, detail=
                   f"launch {launch} resumed from {name or 'scratch'}, the newest valid checkpoint after the crash"
                   + (f" whose download no fault cut ({', '.join(sorted(cut))} cut)" if cut else "")
                   + (f" and no fault damaged as its load began ({', '.join(sorted(damaged))} damaged)"
                      if damaged else "")
                   if ok else f"launch {launch} resumed from {name or 'scratch'} but the newest valid checkpoint "
                   f"after the crash was {newest or 'none'}{blame(run, before.t)}")
        if name is not None:
            restored = [e for e in run.trainer("restored_from_remote", launch) if e["name"] == name]
            where = (before.remote or {}).get("checkpoints", {}) if restored else snap["checkpoints"]
            reason = where.get(name, "it did not exist" + (" as a durable remote checkpoint" if restored else ""))
            report.add("never_loaded_torn", reason is None, at=launch, detail=
                       f"{name} validated after the crash" if reason is None else
                       f"launch {launch} loaded {name} although it was not a valid checkpoint: {reason}"
                       f"{blame(run, before.t, name)}")


def _command_resume(run: Run, ev: Evidence, report: Report, launch: int) -> None:
    before = run.exit_of(launch - 1)
    torn = ev.torn(launch - 1)
    # a checkpoint with a torn or missing file is not complete, whatever its name says
    complete = {p: v for p, v in ((before.complete or {}) if before else {}).items() if not torn_in(ev, torn, p)}
    r = ev.resumed_from(launch)
    newest = max(complete, key=lambda p: (complete[p]["mtime_ns"], p)) if complete else None
    newest_ckpt = (ev.checkpoint_of(newest) or newest) if newest else None
    lost = power_loss(run, launch - 1)
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
                   f"checkpoint ({r.how})" if ok else f"it {'took' if r.died else 'loaded'} "
                   f"{r.checkpoint} ({r.how}), but the newest complete "
                   f"checkpoint was {newest} (complete: {', '.join(sorted(complete))})")
    read = set(r.files) | ({r.checkpoint} if r.checkpoint else set())
    # a checkpoint it tried and went on from (a load that raised: a fall back on an error) is not
    # what it resumed with, torn or not
    tried = sorted(p for p in torn if any(within(p, q) for q in r.tried))
    hit = sorted(p for p in torn if any(within(p, q) for q in read) and p not in tried)
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
                   f"what launch {launch - 1} left torn ({', '.join(sorted(torn)[:4])})"
                   + (f"; it tried {', '.join(tried)} first and went on from it" if tried else ""))
    else:
        report.add("no_torn_read", "unknown", at=launch, detail=f"launch {launch - 1} left "
                   f"{', '.join(sorted(torn)[:4])} torn or incomplete, and which files launch {launch} read is not "
                   f"known: {r.missing}")
    report.resumed_from.append(r.label())


def _no_relaunch(run: Run, report: Report) -> None:
    """``expect.resume_from`` promises a relaunch; a job that ended in one launch broke the promise
    (``_resume`` judges the relaunches that came)."""
    want = run.s.expect.resume_from
    if want is None or len(run.launches()) > 1:
        return
    ex = run.exit_of(run.launches()[-1]) if run.launches() else None
    fired = {h.index for h in run.faults()}
    unfired = [i for i, f in enumerate(run.s.faults) if f.ends_launch and i not in fired]
    if unfired and not any(run.s.faults[i].ends_launch for i in fired):
        # no fault that ends a launch acted: the run never asked for the relaunch the promise is about
        report.add("resume_from", "unknown", f"the scenario expects a relaunch to resume from {want}, but "
                   f"fault {unfired[0]} ({run.s.faults[unfired[0]].kind}), which would have ended the launch, "
                   f"never fired (see fault_{unfired[0]}_fired): nothing called for a relaunch")
        return
    how = "was not recorded" if ex is None else f"was exit status {ex.rc}"
    report.add("resume_from", False, f"the scenario expects a relaunch to resume from {want}, but no relaunch came: "
               f"the job ended in one launch, whose end {how}" + (
                   "; the fault did not stop it (see expect.job_fails and the trainer's own log)"
                   if ex is not None and ex.rc == 0 and run.faults() else ""))


def loaded_equals_saved(run: Run, report: Report) -> None:
    for load in run.trainer("loaded"):
        diff, same = component_diff(load, exempt=exempt(load))
        if not (load.get("digests") and load.get("saved_digests")):
            continue
        if load.get("micro") and "grads" not in load["saved_digests"]:
            # a mid-step checkpoint holds the step's accumulated gradients: without their digest, the
            # comparison leaves out the one component a mid-step resume most often drops
            report.add("loaded_equals_saved", "unknown", at=load["name"], detail=
                       f"{load['name']} was saved after micro-batch {load['micro']} of step {load.get('step')}, so it "
                       "holds accumulated gradients, but its digests have none ('grads'): whether they were "
                       f"restored is unknown ({', '.join(same)} compared); record a gradient digest in mid-step saves")
            continue
        report.add("loaded_equals_saved", not diff, at=load["name"], detail=
                   f"state loaded from {load['name']} differs from the state saved in: {', '.join(diff)} "
                   f"({', '.join(same)} identical)" if diff else
                   f"{', '.join(same)} identical to the state saved" + (
                       " (the world size changed: resize_rng judges the RNG)" if exempt(load) else ""))


def _newest(*names: str | None) -> str | None:
    from ckpt_chaos.probe.layout import parse_name

    found = [n for n in names if n]
    return max(found, key=parse_name) if found else None


def _reference_lost_work(run: Run, report: Report) -> None:
    s = run.s
    interval = int(s.trainer.get("ckpt_every_steps", 0) or 0)
    preempted = any(f.spec.notice for f in s.faults)
    limit = s.expect.max_lost_steps
    if limit is None and preempted:
        limit = 0
    elif limit is None and interval:
        # Training goes on while an asynchronous save writes, up to the next save, which waits for it:
        # a kill just before then loses that interval too, less the step that had not begun.
        limit = 2 * interval - 1 if s.trainer.get("async_save") else interval
    total = 0
    for launch in run.launches()[1:]:
        r = run.resumed_from(launch)
        if not r.decided:
            continue
        point = (r.checkpoint, (r.first_step or 1) - 1)
        # the launch before that trained (a relaunch refused for its configuration trains nothing)
        prior = next((p for p in range(launch - 1, -1, -1) if run.last_step(p) or p == 0), launch - 1)
        reached = run.last_step(prior)
        lost = max(0, reached - point[1])
        total += lost
        if limit is not None:
            report.add("lost_work", lost <= limit, at=launch, detail=
                       f"launch {prior} reached step {reached}, launch {launch} resumed at "
                       f"step {point[1]}: {lost} step(s) lost, at most {limit} allowed")
    report.steps_lost = total if report.launches > 1 else 0


def _command_lost_work(run: Run, ev: Evidence, report: Report, launch: int, lost: str | None) -> None:
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


CADENCE_SLACK_S = 0.05  # the trainer times its cadence with monotonic(), events carry time.time()


def cadence(run: Run, report: Report) -> None:
    """The trainer saves on its cadence no more often than configured: each cadence save at a multiple
    of ckpt_every_steps or, with ckpt_every_seconds, at least that long after the loop got back from
    the save before (a launch's first may come at any time). Each extra save stalls training for
    nothing. Launches whose scenario leaves ckpt_every_steps to the trainer's default are skipped."""
    problems, saves = [], 0
    for launch in run.launches():
        cfg = run.config(launch)
        if cfg.get("ckpt_every_steps") is None:
            continue
        every_steps, every_s = int(cfg["ckpt_every_steps"]), float(cfg.get("ckpt_every_seconds") or 0)
        returned = None  # when the loop got back from the save before
        for e in run.events:
            if e.get("attempt") != launch or e["event"] not in ("saved", "save_started"):
                continue
            if e.get("reason") not in ("cadence", "final"):
                continue
            began = e["t"] - ((e.get("stall_s") if e["event"] == "save_started" else e.get("total_s")) or 0.0)
            step = (parse_name(e["name"]) or (0, 0))[0]
            if e["reason"] == "cadence":
                saves += 1
                on_step = every_steps > 0 and step % every_steps == 0
                on_time = every_s > 0 and (returned is None or began - returned >= every_s - CADENCE_SLACK_S)
                if not (on_step or on_time):
                    since = "" if returned is None else f", {began - returned:.2f}s after the save before"
                    problems.append(f"launch {launch} saved {e['name']} on its cadence{since}, with "
                                    f"ckpt_every_steps={every_steps} and ckpt_every_seconds={every_s:g}")
            returned = e["t"]
    if saves:
        report.add("cadence", not problems,
                   f"{saves} cadence save(s), none more often than configured" if not problems else
                   first_few(problems))


def _reference_config_changes(run: Run, report: Report) -> None:
    """A relaunch whose configuration changed a key the resume must refuse (``expect.refused``) exits
    non-zero before loading anything, says which key, and leaves the checkpoints as they were; a
    relaunch that changed only other keys resumes."""
    logs = launch_logs(run.dir) or {}
    must_refuse = refused_keys(run.s)  # the scenario's expect.refused, and what the trainer declares
    for n, change in enumerate(run.s.recovery.changes, 1):
        ex, before = run.exit_of(n), run.exit_of(n - 1)
        if ex is None:
            continue
        refused = sorted(k for k in change if k in must_refuse)
        what = ", ".join(f"{k} = {v!r}" for k, v in change.items())
        loads = run.trainer("loaded", n)
        if not refused:
            ok = bool(loads)
            report.add("config_accepted", ok, at=n, detail=
                       f"launch {n} changed {what} and resumed from {loads[0]['name']}" if ok else
                       f"launch {n} changed only {what}, which a resume may change, but it loaded no checkpoint "
                       f"(exit status {ex.rc}); see its part of torchrun.log")
            continue
        problems = refusal_problems(ex.rc, [f"it resumed from {loads[0]['name']} at step {loads[0]['step']}"]
                                    if loads else [], logs.get(n), refused)
        if before is not None and ex.snapshot["checkpoints"] != before.snapshot["checkpoints"]:
            problems.append(f"the checkpoints changed: {sorted(before.snapshot['checkpoints'])} before it, "
                            f"{sorted(ex.snapshot['checkpoints'])} after it")
        report.add("config_refused", not problems, at=n, detail=
                   f"launch {n} changed {what} and was refused: it exited {ex.rc} naming {', '.join(refused)}, "
                   "the checkpoints untouched" if not problems else
                   f"launch {n} changed {what}, which a resume must refuse, but " + "; ".join(problems))


def _command_config_changes(run: Run, ev: Evidence, report: Report) -> None:
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


def resize_refused(run: Run, report: Report) -> None:
    """``resize_refused@1``: a first relaunch on another number of ranks that the trainer declares it
    refuses (``expect.refused`` names ``world_size``) exits non-zero, trains no step and leaves its
    complete checkpoints as they were; the relaunch after it, at the old size, is held to
    ``resumed_newest`` as any other. Its output need not name a key: ranks are not an option of its
    command line."""
    ex, before = run.exit_of(1), run.exit_of(0)
    if ex is None or "world_size" not in run.s.expect.refused:
        return
    old, new = run.s.world_size, run.s.launch_world_size(1)
    trained = run.evidence.trained(1)
    problems = [f"it exited with status {ex.rc}"] if ex.rc == 0 or ex.rc is None else []
    if trained:
        problems.append(f"it trained steps {trained[0]} to {trained[-1]}")
    untouched = None if before is None or before.complete is None or ex.complete is None else \
        before.complete == ex.complete
    if untouched is False:
        problems.append(f"its complete checkpoints changed: {sorted(before.complete)} before it, "
                        f"{sorted(ex.complete)} after it")
    head = f"launch 1 ran on {new} rank(s), saved by {old}, which the trainer declares it refuses"
    if problems:
        report.add("resize_refused", False, at=1, detail=f"{head}, but " + "; ".join(problems))
    elif untouched is None:
        report.add("resize_refused", "unknown", at=1, detail=f"{head}: it exited {ex.rc} without training, but what "
                   "was complete around it was not recorded, so whether it left the checkpoints as they were is not "
                   "known")
    else:
        report.add("resize_refused", True, at=1, detail=f"{head}: it exited {ex.rc} without training a step, its "
                   "complete checkpoints as they were")
