"""What a power cut lost for lack of fsync, in words that name the files: for the diagnoses of the
checks that a power cut can explain (a relaunch that went back further than one checkpoint interval,
one that did not find the checkpoint it was expected to resume from).

It reads the power_loss fault's record in the history (``FaultFired.detail["lost"]``, faultfs's
account of its crash: ``data_lost``, ``entries_undone``, ``entries_kept``, ``mode``, ``root``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckpt_chaos.check.history import FaultFired, trajectory_records
from ckpt_chaos.faults.registry import lookup

if TYPE_CHECKING:
    from ckpt_chaos.check.verdict import Run

SHOWN = 4  # files or entries named in one clause; the rest are counted

_WHAT = {"create": "the creation of {path}", "mkdir": "the creation of the folder {path}",
         "unlink": "the removal of {path}", "rmdir": "the removal of the folder {path}",
         "rename": "the rename of {src} -> {path}"}


def power_loss_summary(run: Run, launch: int) -> str | None:
    """One sentence saying what the power cut that ended launch ``launch`` lost for lack of fsync,
    naming the files; None if no power_loss fault ended that launch.

    ``run`` is the stored run (``ckpt_chaos.check.verdict.Run``); ``launch`` is the launch the power
    cut ended, so a check of relaunch N (``lost_work@N``, ``resumed_newest@N``) passes N - 1. The
    sentence gives the step the cut came at (the last step that launch trained), each file whose
    un-fsynced data was dropped with its size before and after ("checkpoints/step_8.pt lost its data
    (never fsynced: 123456 -> 0 bytes)"), and each directory entry the cut undid, or in mode
    ``entries-kept`` kept, with why it was not durable ("the rename of checkpoints/step_8.pt.tmp ->
    checkpoints/step_8.pt was undone (the folder was never fsynced)"). Paths are relative to the run
    directory. A power cut that found everything durable says so."""
    cuts = [h for h in run.records(FaultFired, launch)
            if lookup(h.fault).loses_unsynced and isinstance(h.detail.get("lost"), dict)]
    if not cuts:
        return None
    h = cuts[-1]
    lost = h.detail["lost"]
    root = lost.get("root", "checkpoints")

    def under(path: str) -> str:
        return f"{root}/{path}" if root not in ("", ".") else path

    steps = [r["step"] for r in trajectory_records(run.dir)
             if r.get("attempt", 0) == launch and r.get("t", 0) <= h.t and isinstance(r.get("step"), int)]
    out = f"power was cut at step {max(steps)}" if steps else f"power was cut in launch {launch} before its first step"
    if lost.get("mode", "undo") != "undo":
        out += f" (mode {lost['mode']})"
    clauses = []
    files = [f for f in lost.get("data_lost", []) if f["size_before"] or f["size_after"]]
    if not files and "data_lost" not in lost:  # a record from before the sizes were kept
        files = [{"path": p} for p in lost.get("truncated", []) + lost.get("restored", [])]
    if files:
        clauses.append(_listed([_file(f, under) for f in files], "file"))
    undone = lost.get("entries_undone")
    if undone is None:  # a record from before the entries were kept: its strings
        if lost.get("undone"):
            clauses.append(_listed(lost["undone"], "directory change") + " undone")
    elif undone:
        clauses.append(_entries(undone, under, "undone"))
    if lost.get("entries_kept"):
        clauses.append(_entries(lost["entries_kept"], under, "kept"))
    if not clauses:
        return f"{out}; everything in {root} had been fsynced (file data and folders), so the cut lost nothing"
    if not files:
        clauses.insert(0, "no file lost data (every one written had been fsynced)")
    return f"{out}: " + (" and ".join(clauses) if len(clauses) == 2 else "; ".join(clauses))


def _file(f: dict, under) -> str:
    if "size_before" not in f:
        return f"{under(f['path'])} lost its un-fsynced data"
    why = "written again after its last fsync" if f.get("ever_fsynced") else "never fsynced"
    return f"{under(f['path'])} lost its data ({why}: {f['size_before']} -> {f['size_after']} bytes)"


def _entries(entries: list[dict], under, done: str) -> str:
    """"the rename of A -> B was undone (the folder was never fsynced)", grouped by why."""
    groups = []
    for synced in (False, True):
        group = [e for e in entries if bool(e.get("folder_ever_fsynced")) == synced]
        if not group:
            continue
        names = [_WHAT.get(e["op"], e["op"] + " of {path}").format(
            path=under(e["path"]), src=under(e.get("src", "?"))) for e in group]
        verb = "was" if len(group) == 1 else "were"
        why = (f"the folder was not fsynced after {'it' if len(group) == 1 else 'them'}" if synced
               else "the folder was never fsynced")
        if done == "kept":
            groups.append(f"{_listed(names, 'directory change')} {verb} kept although {why}")
        else:
            groups.append(f"{_listed(names, 'directory change')} {verb} undone ({why})")
    return "; ".join(groups)


def _listed(items: list[str], noun: str) -> str:
    shown = items[:SHOWN]
    more = len(items) - len(shown)
    if more:
        shown = [*shown, f"{more} more {noun}{'s' if more > 1 else ''}"]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]
