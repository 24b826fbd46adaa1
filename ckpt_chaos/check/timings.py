"""The checks of time: how soon the job noticed its first fault (``detected_in_time``, and the
report's time to detect and to recover), and whether every duration the trainer reports is a
measurement (``reported_timings``): the report's save overhead, stall and goodput are made of them.
A ``[command]`` trainer reports no durations: its timings are measured from what the probe layer and
faultfs saw (``command_timings``), and a column left empty says why (``Report.timings_why``)."""

from __future__ import annotations

import math
import statistics

from ckpt_chaos.check.history import LaunchStarted, RankExited, trainer_events, trajectory_records
from ckpt_chaos.check.verdict import Report, Run, first_few


def detection_timings(run: Run, report: Report) -> bool:
    """Time to detect and to recover from the first fault, and ``detected_in_time``; a time left None
    says why in ``report.timings_why``. False where there was nothing to detect (no fault acted, or the
    faulted launch rode it out)."""
    why = report.timings_why
    faults = run.faults()
    if not faults:
        why["time_to_detect_s"] = why["time_to_recover_s"] = ("no fault acted, so there was nothing to detect "
                                                              "or recover from")
        return False
    f0 = faults[0]
    launch = f0.launch
    ex = run.exit_of(launch)
    limit = run.s.expect.detect_within_s
    if ex is not None and ex.rc == 0 and not run.s.recovery.in_launch:
        why["time_to_detect_s"] = why["time_to_recover_s"] = (f"launch {launch} rode the fault out (exit status "
                                                              "0): there was nothing to detect or recover")
        if limit is not None:
            report.add("detected_in_time", "n/a", f"launch {launch} rode the fault out: nothing to detect")
        return False
    victims = {pid for h in faults if run.s.faults[h.index].spec.kills_target for pid in h.pids}
    # Detection: the first rank that the nemesis did not kill exits (it noticed), or the launch ends.
    noticed = [h for h in run.records(RankExited, launch) if h.pid not in victims and h.t >= f0.t]
    if noticed:
        report.time_to_detect_s = noticed[0].t - f0.t
    elif ex is not None and not run.s.recovery.in_launch:
        report.time_to_detect_s = ex.t - f0.t
    else:
        starts = [h for h in run.probes("train.start") if h.launch > launch]
        if starts:
            report.time_to_detect_s = starts[0].t - f0.t
    if report.time_to_detect_s is None:
        why["time_to_detect_s"] = f"no rank exit, end of launch {launch} or later start was recorded after the fault"
    target = run.last_step(launch)
    back = [h for h in run.probes("step.end") if h.launch > launch and h.info.get("step", 0) >= target]
    if back:
        report.time_to_recover_s = back[0].t - f0.t
    else:
        why["time_to_recover_s"] = (f"no later launch reached step {target}, where the job was when the fault hit"
                                    if any(n > launch for n in run.launches()) else
                                    f"no launch came after launch {launch}, which the fault hit")
    if limit is not None and report.time_to_detect_s is None:
        report.add("detected_in_time", "unknown", f"no rank exit, end of launch {launch} or later start was "
                   "recorded after the fault, so the time to detect it cannot be measured")
    elif limit is not None:
        report.add("detected_in_time", report.time_to_detect_s <= limit,
                   f"the faulted launch ended {report.time_to_detect_s:.1f}s after the fault (limit {limit:.0f}s)")
    return True


# The durations a trainer reports (events.jsonl, trajectory.jsonl), by event: the report's save
# overhead, stall and goodput figures are made of them.
MEASURED = {"saved": ("stall_s", "total_s"), "save_started": ("stall_s",), "loaded": ("choose_s", "load_s"),
            "stopped": ("save_s", "since_signal_s"), "upload_queued": ("stall_s",), "uploaded": ("seconds",),
            "restored_from_remote": ("seconds",)}
CLOCK_SLACK_S = 1.0  # the harness's and the trainer's clocks are read by different processes
PHASE_SLACK_S = 1e-3  # a phase and its save's total are read from the clock one after the other


def missing_phases(run: Run) -> list[str]:
    """Saves that left out a phase every save of the same kind (asynchronous or not) reported in the
    golden run: a phase that only some saves report (a wait that happens only sometimes) is not
    required. Launches whose ``recovery.changes`` changed the configuration may save differently."""
    required: dict[bool, set[str]] = {}
    for e in trainer_events(run.golden, "saved"):
        kind = bool(e.get("asynchronous"))
        phases = set(e.get("phases") or ())
        required[kind] = required[kind] & phases if kind in required else phases
    if not any(required.values()):
        return []
    missing = []
    for e in run.trainer("saved"):
        if run.config(e.get("attempt", 0)) != run.s.trainer:
            continue
        kind = bool(e.get("asynchronous"))
        gone = sorted(required.get(kind, set()) - set(e.get("phases") or ()))
        if gone:
            missing.append(f"saved {e.get('name')}: no {', '.join(gone)} among its phases, which every "
                           f"{'asynchronous' if kind else 'synchronous'} save of the golden run reported")
    return missing


def reported_timings(run: Run, report: Report) -> None:
    """Each duration the trainer reports is a measurement: a finite number of seconds, no longer than
    the run had lasted when it was reported, a save's stall and phases within its total, and a stop's
    save within the time since its signal; and each save reports the phases that every save of its
    kind reported in the golden run."""
    starts = [h.t for h in run.records(LaunchStarted)]
    begun = min(starts, default=None)
    durations = []  # (what, field, value, when reported)
    for e in run.events:
        what = f"{e['event']} {e.get('name', '')}".strip()
        durations += [(what, k, e[k], e.get("t")) for k in MEASURED.get(e["event"], ()) if k in e]
        if e["event"] == "saved":
            durations += [(what, f"phases.{k}", v, e.get("t")) for k, v in (e.get("phases") or {}).items()]
    durations += [(f"step {r.get('step')}", "step_time_s", r["step_time_s"], r.get("t"))
                  for r in trajectory_records(run.dir) if "step_time_s" in r]
    if not durations or begun is None:
        report.add("reported_timings", "n/a", "the trainer reports no durations")
        return
    bad = []
    for what, key, v, t in durations:
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            bad.append(f"{what}: {key} = {v!r} is not a duration")
        elif isinstance(t, (int, float)) and v > t - begun + CLOCK_SLACK_S:
            bad.append(f"{what}: {key} = {v:.4g}s, but the run had lasted {t - begun:.1f}s when it said so")
    for e in run.trainer("saved"):
        total = e.get("total_s")
        parts = [("stall_s", e.get("stall_s"))] + [(f"phases.{k}", v) for k, v in (e.get("phases") or {}).items()]
        over = [f"{k} = {v:.4g}s" for k, v in parts if isinstance(total, (int, float)) and isinstance(v, (int, float))
                and v > total + PHASE_SLACK_S]
        if over:
            bad.append(f"saved {e.get('name')}: {', '.join(over)}, longer than the save's total_s = {total:.4g}s")
    for e in run.trainer("stopped"):
        # a stop begins at the signal or after it, so its save fits in the time since the signal
        save, since = e.get("save_s"), e.get("since_signal_s")
        if isinstance(save, (int, float)) and isinstance(since, (int, float)) and save > since + PHASE_SLACK_S:
            bad.append(f"stopped at step {e.get('step')}: save_s = {save:.4g}s, longer than since_signal_s = "
                       f"{since:.4g}s, though the stop began after the signal")
    bad += missing_phases(run)
    report.add("reported_timings", not bad, first_few(bad)
               if bad else f"{len(durations)} durations the trainer reported are measurements: none negative, none "
               "longer than the run or than the save they are part of; every save reports its kind's phases")


# ---- a [command] trainer's timings, from what the layers saw ---------------------------------------

# The points of a save: its start where a patch recognises one, and every write, close, rename and
# fsync in the checkpoint folder and the folders it passes through (command.watch).
SAVE_POINTS = ("ckpt.stage", "file.write", "file.done", "ckpt.shard.write", "ckpt.shard.done", "ckpt.metadata",
               "file.rename", "file.copy", "file.fsync", "faultfs.write", "faultfs.done", "faultfs.rename",
               "faultfs.fsync")
DONE_POINTS = ("file.done", "ckpt.shard.done", "ckpt.metadata", "file.rename", "file.copy", "faultfs.done",
               "faultfs.rename")


def timings(run: Run, report: Report) -> None:
    """The run's timings, for any trainer: time to detect and ``detected_in_time``; for a ``[command]``
    trainer, read from its files, time to recover and its saves' medians too (``command_timings``)."""
    if run.s.command is None:
        detection_timings(run, report)
    else:
        command_timings(run, run.evidence, report)


def command_timings(run: Run, ev, report: Report) -> None:
    """The report's timings of a ``[command]`` run: time to detect and ``detected_in_time`` as for any
    run (``detection_timings``); time to recover, from the fault to the first step record of a later
    launch at or past the step the faulted launch had reached (``ev.trained``, the job's own
    numbering: the layer sends no ``step.end`` unless a trigger names it); and ``save_s``,
    ``save_stall_s``, the medians of its whole saves (``command_saves``). A figure the evidence does not
    allow is left None, with why in ``report.timings_why``."""
    why = report.timings_why
    if detection_timings(run, report):
        report.time_to_recover_s = None
        why.pop("time_to_recover_s", None)
        _recovery(run, ev, report, run.faults()[0])
    saves, none = command_saves(run, ev)
    done = [x for x in saves if x["complete"]]
    if done:
        report.save_s = statistics.median(x["end"] - x["start"] for x in done)
    else:
        why["save_s"] = none or (f"none of the {len(saves)} save(s) seen completed: each left a file torn or "
                                 "closed none")
    stalls = [x["stall"] for x in done if x["stall"] is not None]
    if stalls:
        report.save_stall_s = statistics.median(stalls)
    else:
        why["save_stall_s"] = why["save_s"] if not done else ("the trajectory records no step times around the "
                                                              "saves (its records have no t)")


def _recovery(run: Run, ev, report: Report, f0) -> None:
    launch = f0.launch
    reached = [s for s, r in zip(ev.trained(launch), _records(ev, launch))
               if r.get("t") is None or r["t"] <= f0.t]
    target = max(reached, default=0)
    for n in run.launches():
        if n <= launch:
            continue
        back = [r["t"] for s, r in zip(ev.trained(n), _records(ev, n)) if s >= target and r.get("t") is not None]
        if back:
            report.time_to_recover_s = back[0] - f0.t
            return
    later = [n for n in run.launches() if n > launch]
    report.timings_why["time_to_recover_s"] = (
        f"no launch came after launch {launch}, which the fault hit" if not later else
        f"no later launch recorded a step at or past step {target}, where the job was when the fault hit"
        + ("" if any(ev.trained(n) for n in later) else " (none trained a step)"))


def _records(ev, launch: int) -> list[dict]:
    """Rank 0's step records of a launch, in the order of ``ev.trained(launch)``."""
    return [x for x in ev.traj if x.get("attempt", 0) == launch]


def command_saves(run: Run, ev) -> tuple[list[dict], str]:
    """Each save of a ``[command]`` run, from the points the probe layer and faultfs sent: the points of
    one checkpoint (its entry in the checkpoint folder, a temporary name joined to the name it was
    renamed to or written for, ``aliases``) in one launch, and the folder-wide ones (the folder's fsync,
    a staging folder's writes) that follow them before the next step. ``start``, ``end``: its first and
    last point; ``complete``: it closed or renamed a file and left none torn; ``stall``: how long
    training waited for it, all of it where no step ended while it wrote, else the time to the first step
    that ended after it began less the launch's median step, at least 0 and at most the save. Where no
    save was seen, the second value says why."""
    c = run.s.command
    roots = [ev.ckpt] + [w.strip("/") for w in c.watch]
    points = [h for h in run.probes() if h.point in SAVE_POINTS
              and any(str(h.info.get("path", "")) == r or str(h.info.get("path", "")).startswith(r + "/")
                      for r in roots)]
    if not points:
        return [], ("none of the layers saw a save: no point of a file written in the checkpoint folder "
                    f"{ev.ckpt} or the folders it passes through (command.watch)")
    parent: dict = {}

    def find(x):
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    def join(a, b):
        if a is not None and b is not None:
            parent[find(a)] = find(b)

    for h in points:
        info = h.info
        key = ev.checkpoint_of(info.get("path"))
        for other in (info.get("src"), *(info.get("aliases") or ())):
            join((h.launch, ev.checkpoint_of(other)) if ev.checkpoint_of(other) else None,
                 (h.launch, key) if key else None)
    steps = {n: [r["t"] for r in _records(ev, n) if r.get("t") is not None] for n in run.launches()}
    groups: dict = {}
    last: dict[int, tuple] = {}  # launch -> the group its last point went to
    for h in sorted(points, key=lambda h: h.t):
        key = ev.checkpoint_of(h.info.get("path"))
        if key is not None:
            g = find((h.launch, key))
        else:  # folder-wide: the save in progress, unless a step ended since its last point
            prev = last.get(h.launch)
            g = prev if prev is not None and not any(groups[prev]["end"] < t <= h.t for t in steps.get(h.launch, [])) \
                else (h.launch, f"{h.info.get('path')}@{h.t}")
        x = groups.setdefault(g, {"launch": h.launch, "start": h.t, "end": h.t, "paths": set(), "done": False})
        x["end"] = max(x["end"], h.t)
        x["paths"].add(h.info.get("path"))
        x["done"] = x["done"] or h.point in DONE_POINTS
        last[h.launch] = g
    out = []
    for x in sorted(groups.values(), key=lambda x: x["start"]):
        n = x["launch"]
        torn = {**ev.in_flight(n), **ev.torn(n)}
        x["complete"] = x["done"] and not any(p in torn for p in x["paths"])
        x["stall"] = _stall(x, steps.get(n, []))
        out.append(x)
    return out, ""


def _stall(save: dict, steps: list[float]) -> float | None:
    if len(steps) < 2:
        return None
    start, end = save["start"], save["end"]
    after = [t for t in steps if t > start]
    if not after or after[0] >= end:
        return end - start  # no step ended while it wrote: the loop waited for all of it
    gaps = [b - a for a, b in zip(steps, steps[1:]) if not a <= start < b]
    typical = statistics.median(gaps) if gaps else 0.0
    return min(end - start, max(0.0, after[0] - start - typical))
