"""Run and fault checks: did the harness hold, did every planned fault fire and land where it was
aimed, did the job end as it must (``job_completed``), and did each faulted launch end as its fault
and the scenario say (``job_failed``, ``sigterm_honoured``, a kind's own exit and effect checks).

Each check is written once for every trainer; where the evidence differs (the reference trainer's own
events, or what the automatic probe layer and fanotify saw of a ``[command]`` trainer), the branch is
on the evidence, not a second check of the same name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ckpt_chaos.check.evidence import Evidence
from ckpt_chaos.check.history import DeadlineHit, Exited, HarnessError, final_state, launch_logs
from ckpt_chaos.check.trajectory import steps_of
from ckpt_chaos.check.verdict import Report, Run, first_few
from ckpt_chaos.probe.layout import TMP_PREFIX, parse_name


def harness_health(run: Run, report: Report) -> None:
    deadlines = run.records(DeadlineHit)
    if deadlines:
        d = deadlines[0]
        report.add("no_hang", False, f"launch {d.launch} was still running after the scenario deadline of "
                   f"{d.deadline_s:.0f}s; the harness killed it (the job hung instead of failing)")
    else:
        report.add("no_hang", True, "every launch ended before the deadline")
    errors = run.harness_errors + [h.error for h in run.records(HarnessError)]
    report.add("harness_ok", not errors, "; ".join(dict.fromkeys(errors)) or "no harness errors")


def faults_fired(run: Run, report: Report) -> None:
    """Each planned fault fired (``fault_N_fired``), or why not: a trigger on a relaunch's load that a
    ``[command]`` trainer's code reached unseen says what the relaunch did read, and where to aim."""
    _fired(run, report)
    if run.s.command is not None:
        _unfired_loads(run, run.evidence, report)


def _fired(run: Run, report: Report) -> None:
    fired = {h.index for h in run.faults()}
    unreached = {h.index: h for h in run.unreached()}
    for i, f in enumerate(run.s.faults):
        t = {k: v for k, v in vars(f.when).items() if v is not None}
        if i in unreached:
            # the harness's failure, not the trainer's: the run holds no evidence of this fault
            report.add("fired", "unknown", fault=i, detail=f"{f.kind} {f.target} fired at {t} but reached none of "
                       f"its targets: {unreached[i].unreached}; nothing of its effect can be checked")
            continue
        if i in fired:
            report.add("fired", True, fault=i, detail=f"{f.kind} {f.target} fired at {t}")
            continue
        from ckpt_chaos.check.history import Held

        held = next((h for h in run.records(Held) if h.index == i), None)
        if held is not None:
            # the order the scenario declared did not come about: nothing of the fault's story happened
            who = "the uploader" if held.at["point"].startswith("upload.") else f"rank {held.at['rank']}"
            report.add("fired", "unknown", fault=i, detail=
                       f"{f.kind} {f.target} never fired: its trigger matched {held.at['point']} of {who} in launch "
                       f"{held.launch}, where it waited {held.held_s:.1f}s for fault {held.after} (when.after) and was let go: "
                       f"{held.why}; nothing of its effect can be checked")
            continue
        ender = next((h for h in run.faults() if h.launch == f.attempt and run.s.faults[h.index].spec.ends_launch),
                     None)
        if ender is not None:
            # two triggers racing (a power loss on one rank, a full disk on another at the same save):
            # the run does not show whether this one would have been reached had the launch gone on
            report.add("fired", "unknown", fault=i, detail=
                       f"{f.kind} {f.target} never fired: fault {ender.index} ({ender.fault}) ended launch "
                       f"{f.attempt} before a probe event matched {t}; nothing of its effect can be checked "
                       f"(if this is so on every run, faults[{i}].when comes too late in the launch)")
            continue
        skipped = next((e for e in run.trainer("upload_skipped", f.attempt)
                        if f.when.point.startswith("upload.") and e.get("name") == f.when.name), None)
        if skipped is not None:
            # uploads lag behind training by design, and how far depends on the machine's load
            report.add("fired", "unknown", fault=i, detail=
                       f"{f.kind} {f.target} never fired: the uploader skipped {skipped['name']} for the newer "
                       f"{skipped.get('newer')} (uploads lag behind training), so no {f.when.point} of it came; "
                       f"nothing of its effect can be checked (a trigger on an upload by its order, when.nth, "
                       f"or ranks held back by a stop fault until it comes, does not depend on the lag)")
            continue
        ex = run.exit_of(f.attempt)
        why = f"check faults[{i}].when against the points the trainer reports (history.jsonl)"
        if ex is not None and ex.rc != 0:
            # the launch died on its own first: its error says more than the probe points do
            error = _last_error(launch_logs(run.dir, run.history) or {}, f.attempt)
            why = (f"launch {f.attempt} ended first, with exit status {ex.rc}"
                   + (f" ({error})" if error else "") + "; see its part of torchrun.log")
        # a planned fault that never fired: the run did not exercise what the scenario states, whoever is
        # to blame, so it cannot say the trainer failed it (docs/checks.md)
        report.add("fired", "unknown", fault=i, detail=f"{f.kind} {f.target} never fired: no probe event of "
                   f"launch {f.attempt} matched {t}; {why}; the scenario did not exercise what it states")


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


# A rank's own error (``[rank1]: ValueError: ...`` under torchrun), not torchrun's ChildFailedError
# that only says a rank failed.
_ERROR_LINE = re.compile(r"^(?:\[rank\d+\]:)?\s*((?![\w.]*ChildFailedError)[\w.]*(?:Error|Exception)\b:? .*)$", re.M)


def _last_error(logs: dict[int, str], launch: int) -> str | None:
    """The last ``SomethingError: message`` line of a launch's log, cut to a line's length."""
    found = _ERROR_LINE.findall(logs.get(launch, ""))
    return found[-1].strip()[:200] if found else None


# How far below its trigger's fraction a shard may be on disk: the trainer estimates its file's size
# before writing it, and the last write may still sit in the stream's buffer.
LANDED_SLACK = 0.05


# The points whose events say how much of a file's write is done (``info.fraction``).
LANDED_POINTS = ("ckpt.shard.write", "upload.write")


# The same of a [command] trainer: the automatic probe layer's and faultfs's writes of any file.
FILE_LANDED_POINTS = ("file.write", "faultfs.write", "ckpt.shard.write")


def faults_landed(run: Run, report: Report) -> None:
    """A fault aimed at a fraction of a file's write (``when.min_fraction``) found that much of it done,
    measured against the size the golden run wrote the file at: for a shard, what was on disk (and no
    more than the next tenth, the probe reporting each tenth); for an upload, the bytes the uploader's
    reader had handed to the request (and no more reported than that). The trainer's own fraction is
    what this checks, not what it trusts. A ``[command]`` trainer's write of any file: ``_landed_in_file``."""
    for h in run.faults():
        fraction = run.s.faults[h.index].when.min_fraction
        point, info = h.at.get("point"), h.at.get("info", {})
        if run.s.command is not None:
            if point in FILE_LANDED_POINTS:
                _landed_in_file(run, h, fraction, report)
            continue
        if fraction is None or point not in LANDED_POINTS:
            continue
        name = info.get("file")
        if point == "upload.write":
            ckpt, label, done = str(info.get("name")), f"{info.get('name')}/{name}", info.get("bytes")
            if not isinstance(done, int):
                report.add("landed", "unknown", f"the upload of {label} reported no byte count", fault=h.index)
                continue
        else:
            writing = (h.snapshot_before or {}).get("writing", {})
            where = [p for p in writing if p.endswith("/" + str(name))]
            if len(where) != 1:
                report.add("landed", "unknown", f"{name} was not in exactly one save in progress when the fault "
                           f"fired ({', '.join(where) or 'none'})", fault=h.index)
                continue
            ckpt, label, done = where[0].split("/")[0].removeprefix(TMP_PREFIX), where[0], writing[where[0]]
        sizes = _golden_sizes(run.golden, name)
        if not sizes:
            report.add("landed", "unknown", f"the golden run kept no manifest listing {name} to measure it against",
                       fault=h.index)
            continue
        near = _nearest(sizes, ckpt)
        planned, measure = sizes[near], f"the golden run's {near}"
        if point == "ckpt.shard.write" and ckpt not in sizes and (parse_name(ckpt) or (0, 0))[1] > 0:
            # A save mid-accumulation also holds the partial gradients, and a fault-free run never makes
            # one: no golden file measures it. The trainer's own planned size does, once the same planner's
            # sizes for this run's step-boundary saves of the file matched the golden run's.
            planned, measure = _vouched_plan(run, name, sizes, info.get("planned"))
            if planned is None:
                report.add("landed", "unknown", f"{label} is a save mid-accumulation, which the golden run never "
                           f"makes, and {measure}", fault=h.index)
                continue
        got = done / planned
        if point == "ckpt.shard.write":
            # the probe reports each tenth of the file, so the first report at the trigger is at most a
            # tenth past it
            early, late = got < fraction - LANDED_SLACK, got > min(1.0, fraction + 0.1 + LANDED_SLACK)
            said = f"{label} held {got:.0%} of its {planned} bytes ({measure})"
        else:
            # the HTTP client reads the body in blocks as large as it likes (a small file at once), so
            # only progress claimed beyond the bytes read is wrong
            reported = info.get("fraction")
            early = got < fraction - LANDED_SLACK or not isinstance(reported, (int, float)) \
                or reported > got + LANDED_SLACK
            late = False
            said = (f"the uploader had read {got:.0%} of {label}'s {planned} bytes (the golden run's {near}) "
                    f"into its request, and reported {reported!r} of it,")
        report.add("landed", not (early or late), fault=h.index, detail=
                   f"{said} when the fault fired, for a trigger at {fraction:.0%}" + (
                       ": the trainer's probe reported progress its file did not have" if early else
                       ": the trainer's probe reported progress later than the file made it" if late else ""))


def _landed_in_file(run: Run, h, fraction: float | None, report: Report) -> None:
    """Where a fault on a ``[command]`` trainer's file write (``file.write``, ``faultfs.write``,
    ``ckpt.shard.write``) landed: the bytes of the file when it fired, against the size of the same
    file in the golden run (under its final name, where it is written under a temporary one). The bytes
    are the file's on disk as the launch ended where the fault killed its writer, else those the point
    reported written; fewer on disk than reported is the layer's report found wrong. With
    ``when.min_fraction``, they must be at least that share of the golden file and at most a tenth more
    (the points come at each tenth)."""
    from ckpt_chaos.check.evidence import Evidence

    info = h.at.get("info", {})
    path, reported = info.get("path"), info.get("bytes")
    if not path or not isinstance(reported, int):
        report.add("landed", "unknown", f"the {h.at.get('point')} it fired on names no file and byte count",
                   fault=h.index)
        return
    aliases = info.get("aliases") or []
    name, whole = Evidence(run)._golden_size(path, aliases)
    if name is None:
        report.add("landed", "unknown", f"the golden run left no file {' or '.join(dict.fromkeys([path, *aliases]))} "
                   "to measure it against", fault=h.index)
        return
    ex = run.exit_of(h.launch)
    killed = run.s.faults[h.index].spec.kills_target and h.at.get("rank") in h.detail.get("ranks", ())
    on_disk = (ex.files or {}).get(path) if killed and ex is not None else None
    label = path if name == path else f"{path} ({name} in the golden run)"
    if on_disk is not None and on_disk < reported:
        report.add("landed", False, fault=h.index, detail=f"{label} held {on_disk} bytes as launch {h.launch} ended, "
                   f"which the fault ended, but the {h.at.get('point')} it fired on reported {reported} written: the "
                   "layer reported progress the file did not have")
        return
    got = reported / whole if whole else 1.0
    where = (f"{label} held {reported} of the golden run's {whole} bytes ({got:.0%}) when the fault fired"
             + (" (on disk as its launch ended)" if on_disk == reported else ""))
    if fraction is None:
        report.add("landed", True, fault=h.index, detail=where + ", for a trigger at no fraction")
        return
    early = got < fraction - LANDED_SLACK
    late = got > min(1.0, fraction + 0.1 + LANDED_SLACK)
    report.add("landed", not (early or late), fault=h.index, detail=where + f", for a trigger at {fraction:.0%}" + (
        ": the point reported a share of the file it did not have (its plan was not the golden file's size)"
        if early else ": the point came later in the file than its trigger" if late else ""))


def _nearest(sizes: dict[str, int], ckpt: str) -> str:
    """The same checkpoint, or the nearest one the golden run's retention kept: a shard's size moves by a
    few bytes from step to step (the pickled counters), not by a fraction."""
    step = (parse_name(ckpt) or (0, 0))[0]
    return min(sizes, key=lambda c: (c != ckpt, abs((parse_name(c) or (0, 0))[0] - step)))


def _vouched_plan(run: Run, name: str, sizes: dict[str, int], planned) -> tuple[int | None, str]:
    """The size the trainer planned for a write of ``name`` that no golden file measures, and how it was
    vouched for: by the sizes the trainer planned for this run's step-boundary saves of the same file,
    each within ``LANDED_SLACK`` of the golden run's. Otherwise None, and what is missing."""
    if not isinstance(planned, int) or planned <= 0:
        return None, "the trainer's probe reported no planned size for it"
    saving, plans = {}, {}
    for e in run.probes():
        if e.point == "ckpt.stage":
            saving[(e.launch, e.pid)] = str(e.info.get("name"))
        elif e.point == "ckpt.shard.write" and e.info.get("file") == name and (e.launch, e.pid) in saving:
            plans[saving[(e.launch, e.pid)]] = e.info.get("planned")
    boundary = {c: p for c, p in plans.items() if (parse_name(c) or (0, 1))[1] == 0}
    if not boundary:
        return None, (f"this run made no step-boundary save of {name} to vouch for the {planned} bytes its "
                      "trainer planned")
    golden_of = {c: sizes[_nearest(sizes, c)] for c in boundary}
    off = [f"{c} planned {p} against {golden_of[c]}" for c, p in sorted(boundary.items())
           if not isinstance(p, int) or abs(p - golden_of[c]) > LANDED_SLACK * golden_of[c]]
    if off:
        return None, (f"the sizes its trainer planned are not vouched for ({first_few(off)}, more than "
                      f"{LANDED_SLACK:.0%} from the golden run's)")
    return planned, (f"as its trainer planned: a save mid-accumulation, which the golden run never makes; the "
                     f"trainer's plans for {', '.join(sorted(boundary))} were within {LANDED_SLACK:.0%} of the golden run's")


def _golden_sizes(golden: Path, name: str) -> dict[str, int]:
    """The size of file ``name`` in each checkpoint whose manifest the golden run kept."""
    sizes = {}
    for manifest in sorted((golden / "checkpoints").glob("*/manifest.json")):
        try:
            sizes[manifest.parent.name] = json.loads(manifest.read_text())["files"][name]["size"]
        except (OSError, ValueError, KeyError):
            continue
    return sizes


def job_completed(run: Run, report: Report) -> None:
    """The last launch exited 0 having trained to the end: the reference trainer says it finished and
    left its final state; a ``[command]`` trainer trained the golden run's last step."""
    if run.s.command is None:
        _reference_completion(run, report)
    else:
        _command_completion(run, report, steps_of(run.golden), run.evidence.steps())


def _reference_completion(run: Run, report: Report) -> None:
    final = final_state(run.dir)
    exits = run.records(Exited)
    last_rc = exits[-1].rc if exits else None
    ok = final is not None and bool(run.trainer("finished")) and last_rc == 0
    report.add("job_completed", ok, f"training finished after {report.launches} launch(es)" if ok else
               f"training did not finish (last launch exit status {last_rc}); see torchrun.log")


def _command_completion(run: Run, report: Report, gold: dict, got: dict) -> None:
    exits = run.records(Exited)
    rc = exits[-1].rc if exits else None
    last = max(gold, default=0)
    ok = rc == 0 and last in got
    report.add("job_completed", ok, f"the trainer exited 0 after {report.launches} launch(es), step {last} trained"
               if ok else f"the job did not finish: last launch exit status {rc}, last step recorded "
               f"{max(got, default=0)} of {last}; see torchrun.log")


def expected_failure(run: Run, fault) -> bool | None:
    """Whether the launch ``fault`` hit must fail: as ``expect.job_fails`` says, else yes for a fault
    that ends its launch; None where the scenario leaves it to the trainer's own policy."""
    want = run.s.expect.job_fails
    if want is None and not fault.ends_launch:
        return None
    return True if want is None else want


def fault_effects(run: Run, report: Report) -> None:
    """How each faulted launch ended (``job_failed``; ``sigterm_honoured`` for a preemption of a
    ``[command]`` trainer, a kind's own exit check for the reference trainer), then what the reference
    trainer must show of each fault, as its kind says (ckpt_chaos/faults/): a storage fault that made
    calls fail was reported, a corrupted checkpoint was rejected before a load."""
    for h in run.faults():
        fault = run.s.faults[h.index]
        if run.s.command is not None and fault.spec.sigterm_grace:
            _sigterm_honoured(run, report, h)
        elif run.s.command is None and fault.spec.exit_check is not None:
            fault.spec.exit_check(run, h, report)
        else:
            _job_failed(run, report, h, fault)
    if run.s.command is None:
        for h in run.faults():
            spec = run.s.faults[h.index].spec
            if spec.effect_check is not None:
                spec.effect_check(run, h, report)


def _sigterm_honoured(run: Run, report: Report, h) -> None:
    ex = run.exit_of(h.launch)
    late = bool(ex and ex.grace_expired)
    if run.s.recovery.relaunch == "self" and run.s.faults[h.index].target not in ("all", "node:0"):
        report.add("sigterm_honoured", not late, fault=h.index, detail=
                   "the SIGTERMed worker(s) exited within the grace period" if not late else
                   "the grace period ran out with SIGTERMed worker(s) still running: they were SIGKILLed")
        return
    report.add("sigterm_honoured", not late, fault=h.index, detail=
               "the launch ended within the preemption's grace period" if not late else
               "the grace period ran out before the launch ended: the trainer ignored its SIGTERM or took "
               "too long to stop; it was SIGKILLed")


def _job_failed(run: Run, report: Report, h, fault) -> None:
    want = expected_failure(run, fault)
    if want is None:
        return  # whether the job stops is the trainer's policy; the kind's effect check sees it said so
    ex = run.exit_of(h.launch)
    if run.s.recovery.relaunch == "self" or (run.s.command is None and (ex is None or run.s.recovery.relaunch == "torchrun")):
        later = [x for x in run.launches() if x > h.launch]
        who = "the trainer" if run.s.recovery.relaunch == "self" else "torchrun"
        report.add("job_failed", bool(later) == want, fault=h.index,
                   detail=f"{who} restarted the workers" if later else "no restart followed the fault")
        return
    if ex is None:
        report.add("job_failed", "unknown", fault=h.index, detail=f"how launch {h.launch} ended was not recorded")
        return
    ok = (ex.rc != 0) == want
    report.add("job_failed", ok, fault=h.index, detail=f"launch {h.launch} exited with status {ex.rc}"
               + ("" if ok else f", where the scenario expects it to {'fail' if want else 'succeed'}"
                  " (expect.job_fails)"))
