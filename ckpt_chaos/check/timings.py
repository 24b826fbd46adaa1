"""The checks of time: how soon the job noticed its first fault (``detected_in_time``, and the
report's time to detect and to recover), and whether every duration the trainer reports is a
measurement (``reported_timings``): the report's save overhead, stall and goodput are made of them."""

from __future__ import annotations

import math

from ckpt_chaos.check.history import LaunchStarted, RankExited, trainer_events, trajectory_records
from ckpt_chaos.check.verdict import Report, Run, first_few


def detection_timings(run: Run, report: Report) -> None:
    faults = run.faults()
    if not faults:
        return
    f0 = faults[0]
    launch = f0.launch
    ex = run.exit_of(launch)
    limit = run.s.expect.detect_within_s
    if ex is not None and ex.rc == 0 and run.s.recovery.relaunch != "torchrun":
        if limit is not None:
            report.add("detected_in_time", "n/a", f"launch {launch} rode the fault out: nothing to detect")
        return
    victims = {pid for h in faults if run.s.faults[h.index].spec.kills_target for pid in h.pids}
    # Detection: the first rank that the nemesis did not kill exits (it noticed), or the launch ends.
    noticed = [h for h in run.records(RankExited, launch) if h.pid not in victims and h.t >= f0.t]
    if noticed:
        report.time_to_detect_s = noticed[0].t - f0.t
    elif ex is not None and run.s.recovery.relaunch != "torchrun":
        report.time_to_detect_s = ex.t - f0.t
    else:
        starts = [h for h in run.probes("train.start") if h.launch > launch]
        if starts:
            report.time_to_detect_s = starts[0].t - f0.t
    target = run.last_step(launch)
    back = [h for h in run.probes("step.end") if h.launch > launch and h.info.get("step", 0) >= target]
    if back:
        report.time_to_recover_s = back[0].t - f0.t
    if limit is not None and report.time_to_detect_s is None:
        report.add("detected_in_time", "unknown", f"no rank exit, end of launch {launch} or later start was "
                   "recorded after the fault, so the time to detect it cannot be measured")
    elif limit is not None:
        report.add("detected_in_time", report.time_to_detect_s <= limit,
                   f"the faulted launch ended {report.time_to_detect_s:.1f}s after the fault (limit {limit:.0f}s)")


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
