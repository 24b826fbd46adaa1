"""Commit checks: what the job counts complete is whole (``committed_valid``), at every crash the
pointer names a valid checkpoint and no committed one was lost (``latest_valid``,
``committed_survives``), and each manifest tells the truth (``manifest_facts``); and the words that
blame a finding on the fault that explains it.
"""

from __future__ import annotations

from ckpt_chaos.check.evidence import Evidence
from ckpt_chaos.check.names import within
from ckpt_chaos.check.history import Exited, FaultFired, trajectory, trajectory_records
from ckpt_chaos.check.verdict import Report, Run
from ckpt_chaos.faults.kind import FaultKind


def committed_valid(run: Run, report: Report) -> None:
    """Every checkpoint the trainer counts committed is whole: for the reference trainer each it reported
    committed, when its launch ended; for a ``[command]`` trainer what ``command.complete`` matches as
    the job ends."""
    if run.s.command is None:
        _reference_committed_valid(run, report)
    else:
        _left_whole(run, run.evidence, report)


def _reference_committed_valid(run: Run, report: Report) -> None:
    """Every checkpoint the trainer reported committed was complete when its launch ended, unless
    retention deleted it or a fault (corruption, power loss) damaged it afterwards."""
    deleted = {n for r in run.trainer("retention") for n in r.get("deleted", [])}
    damaged = {h.detail.get("checkpoint") for h in run.faults() if kind_of(run, h).damages}
    power_cut = {h.launch for h in run.faults() if kind_of(run, h).loses_unsynced}
    checked = 0
    for ex in run.records(Exited):
        if ex.launch in power_cut:
            continue  # what must survive a power cut is committed_survives's business
        snap = ex.snapshot["checkpoints"]
        for c in run.trainer("committed", ex.launch):
            name = c["name"]
            checked += 1
            if name in deleted or name in damaged or name not in snap or snap[name] is None:
                continue
            checked = -1_000_000
            report.add("committed_valid", False, at=name, detail=
                       f"the trainer reported {name} committed, but it is not a valid checkpoint: {snap[name]}"
                       f"{blame(run, c.get('t', 0))}")
    if checked > 0:
        report.add("committed_valid", True, f"{checked} committed checkpoint(s) complete when their launch ended")


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
    counted = {p for c in ex.complete for p in torn_in(ev, stray, c)}
    strays = "" if not stray else (
        f"; {len(stray)} stray temporary file(s) left half written in checkpoint folders, never renamed into "
        "place (no file of their checkpoint: a load that opens its files by name skips them): "
        + "; ".join(f"{p}: {how}" + (" (in a checkpoint counted complete)" if p in counted else "")
                    for p, how in sorted(stray.items())[:4]) + (" ..." if len(stray) > 4 else ""))
    if run.s.resumed_world_size() != run.s.world_size:
        # a resume at another world size writes other files per checkpoint than the golden run
        torn = {p: how for p, how in torn.items() if not how.startswith("missing")}
    hit = {p: [f"{t}: {torn[t]}" for t in torn_in(ev, torn, p)] for p in sorted(ex.complete)}
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


def torn_in(ev: Evidence, torn: dict[str, str], entry: str) -> list[str]:
    """The torn files of the checkpoint a complete entry belongs to (the entry itself, or its folder)."""
    return [t for t in sorted(torn) if within(t, entry) or within(t, ev.checkpoint_of(entry) or entry)]


def power_loss(run: Run, launch: int) -> str | None:
    """What a power cut that ended ``launch`` lost for want of an fsync, in a sentence, or None."""
    try:
        from ckpt_chaos.check.durability import power_loss_summary
    except ImportError:
        return None
    return power_loss_summary(run, launch)


def crash_states(run: Run, report: Report) -> None:
    """At every crash: `latest` names a valid checkpoint, and no committed checkpoint was lost."""
    # Committed: the trainer said so, or (a probed trainer) its commit rename happened.
    committed = sorted([{"name": e["name"], "t": e.get("t", 0), "attempt": e.get("attempt")}
                        for e in run.trainer("committed")]
                       + [{"name": h.info["name"], "t": h.t, "attempt": h.launch} for h in run.probes("ckpt.commit")],
                       key=lambda c: c["t"])
    retention = run.trainer("retention")
    for ex in run.records(Exited):
        if ex.rc == 0 and run.trainer("finished", ex.launch):
            continue
        snap = ex.snapshot
        latest = snap.get("latest")
        # A checkpoint a corrupt fault damaged on purpose is not the trainer's to keep valid.
        damaged = {h.detail.get("checkpoint") for h in run.faults() if kind_of(run, h).damages and h.t <= ex.t}
        committed = [c for c in committed if c["name"] not in damaged]
        if latest in damaged:
            report.add("latest_valid", "n/a", at=ex.launch,
                       detail=f"`latest` names {latest}, which a fault damaged on purpose")
        elif latest is not None:
            reason = snap["checkpoints"].get(latest, "it does not exist")
            report.add("latest_valid", reason is None, at=ex.launch, detail=
                       f"`latest` names {latest}, a valid checkpoint" if reason is None else
                       f"after launch {ex.launch} died, `latest` named {latest}, which was not a valid "
                       f"checkpoint ({reason}): the pointer moved before the checkpoint was durable"
                       f"{blame(run, ex.t)}")
        pool = committed
        if any(kind_of(run, h).loses_disk and h.launch == ex.launch for h in run.faults()):
            # The local disk is gone with everything on it: what must survive is what was durable.
            pool = [{"name": e["name"], "t": e["t"], "attempt": e.get("attempt")} for e in run.trainer("uploaded")]
        before = [c for c in pool if c.get("t", 0) <= ex.t and c.get("attempt") == ex.launch]
        before = before or [c for c in pool if c.get("t", 0) <= ex.t]
        if not before:
            continue
        last = before[-1]["name"]
        valid = [n for n, r in snap["checkpoints"].items() if r is None]
        valid += [n for n, r in (ex.remote or {}).get("checkpoints", {}).items() if r is None]
        ok = last in valid or any(n > last for n in valid)
        if ok:
            report.add("committed_survives", True, at=ex.launch, detail=
                       f"{last}, the newest checkpoint committed before the crash, or a newer one is valid")
        else:
            deleted = [r for r in retention if last in r.get("deleted", [])]
            why = ("; retention deleted it while the next save had not committed" if deleted else "")
            report.add("committed_survives", False, at=ex.launch, detail=
                       f"{last} was committed before the crash but is not valid after it, and nothing newer is"
                       f" ({snap['checkpoints'].get(last, 'gone')}){why}{blame(run, ex.t, last)}")


def kind_of(run: Run, h: FaultFired) -> FaultKind:
    """The kind of the fault a history record says fired."""
    return run.s.faults[h.index].spec


def blame(run: Run, t: float, ckpt: str | None = None) -> str:
    """"; after FAULT at POINT": the fault that explains a finding at time ``t``, for the diagnosis:
    the corruption of ``ckpt`` if one was done, otherwise the last fault before ``t``."""
    before = [h for h in run.faults() if h.t <= t]
    aimed = [h for h in before if ckpt is not None and h.detail.get("checkpoint") == ckpt]
    if not before:
        return ""
    h = (aimed or before)[-1]
    fault = run.s.faults[h.index]
    at = h.at
    what = fault.spec.describe(fault, h) if fault.spec.describe else fault.kind
    out = f"; after {what} at {at['point']} (rank {at['rank']})"
    lost = h.detail.get("lost")
    if lost:
        out += (f", which lost the un-fsynced data of {len(lost['truncated']) + len(lost['restored'])} file(s) "
                f"and undid {len(lost['undone'])} un-persisted directory operation(s)")
        if lost["truncated"]:
            out += f" (emptied: {', '.join(lost['truncated'][:4])})"
    return out


def manifest_facts(run: Run, report: Report) -> None:
    """What each valid checkpoint's manifest says of the training it holds, as seen at every launch's
    end, agrees with the run: the tokens seen by its step (the trajectory's) and the world size of the
    launch that committed it. A field left out is as wrong as a wrong one: readers of the manifest
    (`ckpt-chaos ckpts`, a tool picking a checkpoint) take it from there, not from the shards."""
    records, golden = trajectory_records(run.dir), trajectory(run.golden)
    problems: dict[str, str] = {}
    checked: set[str] = set()
    for ex in run.records(Exited):
        # as of this launch's end: a later launch may train a step again under another config
        ours = {r["step"]: r for r in records if r.get("attempt", 0) <= ex.launch}
        sizes = {c["name"]: c.get("world_size") for c in run.events
                 if c["event"] == "committed" and c.get("attempt", 0) <= ex.launch}
        for name, facts in (ex.snapshot.get("manifests") or {}).items():
            if name in problems:
                continue
            checked.add(name)
            missing = [k for k in ("tokens_seen", "world_size") if k not in facts]
            step = facts.get("step")
            record = ours.get(step) or golden.get(step)
            tokens = 0 if step == 0 else record.get("tokens_seen") if record else None
            said = []
            if missing:
                said.append(f"lacks {' and '.join(missing)}")
            if "tokens_seen" in facts and tokens is not None and facts["tokens_seen"] != tokens:
                said.append(f"says tokens_seen = {facts['tokens_seen']}, but step {step} of the trajectory had seen "
                            f"{tokens}")
            if "world_size" in facts and sizes.get(name) is not None and facts["world_size"] != sizes[name]:
                said.append(f"says world_size = {facts['world_size']}, but the launch that committed it ran "
                            f"{sizes[name]} rank(s)")
            if said:
                problems[name] = f"{name}'s manifest (at launch {ex.launch}'s end) " + "; ".join(said)
    for name, detail in problems.items():
        report.add("manifest_facts", False, at=name, detail=detail)
    if checked and not problems:
        report.add("manifest_facts", True, f"the manifests of {len(checked)} checkpoint(s) give the tokens seen "
                   f"and the world size the run had")
