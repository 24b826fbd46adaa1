"""When faults fire: count probe events against each fault's trigger. No clocks, no randomness.

The generator sees the probe events in the order the controller receives them and answers,
for each event, which faults fire on it. Each fault fires at most once. Counting per rank (a
trigger with ``rank``) is deterministic because one rank's events arrive in program order;
counting over all ranks is deterministic in *where* it fires, not in which rank gets there first.

A fault with ``when.after = N`` whose trigger matches before fault N has fired is *held*: the event
is counted as usual, and the runner keeps its sender waiting at the point until fault N fires, then
fires it on that event (``ready``, ``release``). The hold ends without firing where fault N can no
longer fire (``hopeless``), or where the runner gives up on it (``give_up``): nothing waits forever.
"""

from __future__ import annotations

import fnmatch
import threading
import time
from collections import defaultdict
from typing import Callable

from ckpt_chaos.check.history import Held, History
from ckpt_chaos.probe import follow
from ckpt_chaos.probe.auto_state import TENTHS
from ckpt_chaos.scenario import Fault, Trigger

# How long every process of a run may stay silent while a trigger is held before the hold is let go.
# Only an order the run cannot follow gets there (the held process is the one the earlier fault's
# trigger needs, through a collective or a queue): the run it ends says so, and is never a pass.
HOLD_IDLE_S = 30.0


def launch_of(event: dict) -> int:
    """The launch an event belongs to: harness relaunches and torchrun restarts both count."""
    return int(event.get("attempt", 0)) + int(event.get("restart", 0))


class Generator:
    def __init__(self, faults: list[Fault]):
        self.faults = list(faults)
        self.fired: dict[int, dict] = {}  # fault index -> the event it fired on
        self.held: dict[int, dict] = {}  # fault index -> the event it matched, waiting for its ``after``
        self.given_up: dict[int, str] = {}  # fault index -> why its hold ended without it firing
        self._matches: dict[int, int] = defaultdict(int)
        self._saves: dict[tuple[int, int], int] = defaultdict(int)  # (launch, rank) -> saves begun
        self._saving: dict[tuple[int, int], str] = {}  # (launch, rank) -> name of the save in progress

    def observe(self, event: dict) -> list[tuple[int, Fault]]:
        """The faults that fire on this event (usually none); those whose ``after`` has not fired are
        left held on it (``waiting``)."""
        launch, rank = launch_of(event), event["rank"]
        if event["point"] == "ckpt.stage":
            self._saves[(launch, rank)] += 1
            self._saving[(launch, rank)] = event.get("info", {}).get("name")
        due = []
        for i, fault in enumerate(self.faults):
            if i in self.fired or i in self.held or i in self.given_up or fault.attempt != launch:
                continue
            if not self._matches_trigger(fault.when, event, self._saves[(launch, rank)],
                                         self._saving.get((launch, rank))):
                continue
            self._matches[i] += 1
            if self._matches[i] == fault.when.nth:
                self.held[i] = event
        # in index order, and again for one waiting for a fault that fired on this same event after it
        while ready := [i for i in self.waiting(event) if self.ready(i)]:
            due += [(i, self.release(i)) for i in ready]
        return due

    def waiting(self, event: dict) -> list[int]:
        """The faults held on ``event``, in index order."""
        return sorted(i for i, e in self.held.items() if e is event)

    def ready(self, i: int) -> bool:
        """Fault ``i`` may fire: it waits for no fault, or for one that has fired."""
        after = self.faults[i].when.after
        return after is None or after in self.fired

    def hopeless(self, i: int, launch: int) -> str | None:
        """Why fault ``i``, held in ``launch``, can no longer fire: the fault it waits for belongs to a
        launch that is over, or its own hold ended without it firing; None while it still may."""
        after = self.faults[i].when.after
        if after is None or after in self.fired:
            return None
        if after in self.given_up:
            return f"fault {after} never fired either ({self.given_up[after]})"
        if self.faults[after].attempt < launch:
            return f"fault {after} belongs to launch {self.faults[after].attempt}, which ended without it firing"
        return None

    def release(self, i: int) -> Fault:
        """Fault ``i`` fires on the event it was held at."""
        self.fired[i] = self.held.pop(i)
        return self.faults[i]

    def give_up(self, i: int, why: str) -> dict:
        """Fault ``i``'s hold ends without it firing; the event it was held at."""
        self.given_up[i] = why
        return self.held.pop(i)

    @staticmethod
    def _matches_trigger(t: Trigger, event: dict, saves_begun: int, saving: str | None) -> bool:
        info = event.get("info", {})
        name = info.get("name", saving)  # shard events belong to the save in progress
        return (event["point"] == t.point
                and (t.rank is None or event["rank"] == t.rank)
                and (t.step is None or info.get("step") == t.step)
                and (t.name is None or name == t.name)
                and (t.save is None or saves_begun == t.save)
                and (t.min_fraction is None or info.get("fraction", 0.0) >= t.min_fraction)
                and (t.path is None or follow.matches(info, t.path)))  # a temporary file by its final name too

    def unfired(self) -> list[tuple[int, Fault]]:
        """Faults that never fired, held ones and those given up included."""
        return [(i, f) for i, f in enumerate(self.faults) if i not in self.fired]


class Holds:
    """Where the runner keeps a held event's sender waiting (its connection's thread, outside the
    runner's lock, so that every other process goes on): until the fault its held faults wait for
    fires, or they can no longer fire (``Generator.hopeless``, their launch is over, or no process
    has said anything for ``idle_s``). A hold that ends without firing is written to the history."""

    def __init__(self, generator: Generator, history: History, idle_s: float = HOLD_IDLE_S):
        self.g = generator
        self.history = history
        self.idle_s = idle_s
        self._changed = threading.Condition()
        self._generation = 0
        self._heard = time.monotonic()
        self._latest = 0  # the newest launch a process reported from
        self._ended: set[int] = set()

    def heard(self, event: dict) -> None:
        """A process reported: the run is making progress (a torchrun restart's events end the launch before)."""
        with self._changed:
            self._heard = time.monotonic()
            self._latest = max(self._latest, launch_of(event))
            self._generation += 1
            self._changed.notify_all()

    def changed(self) -> None:
        """A fault fired: a held one may be ready."""
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def launch_over(self, launch: int) -> None:
        with self._changed:
            self._ended.add(launch)
            self._generation += 1
            self._changed.notify_all()

    def _why_not(self, i: int, launch: int) -> str | None:
        after = self.g.faults[i].when.after
        if (why := self.g.hopeless(i, launch)) is not None:
            return why
        if launch in self._ended or self._latest > launch:
            return f"launch {launch} ended before fault {after} fired"
        if time.monotonic() - self._heard > self.idle_s:
            return (f"no process reported anything for {self.idle_s:.0f} s while it was held: fault {after}'s "
                    "trigger needed the held process to go on (a collective, a queue), so the order declared runs "
                    "against the trainer's own")
        return None

    def wait(self, event: dict, lock: threading.Lock, fire: Callable[[int, Fault, float], "dict | None"]) -> "dict | None":
        """Hold ``event``'s sender while faults are held on it; each fires, by ``fire(index, fault,
        held_s)`` under ``lock``, once the fault it waits for has. The answers of those that fired."""
        launch, start, answer = launch_of(event), time.monotonic(), None
        while True:
            with self._changed:
                seen = self._generation
            with lock:
                mine = self.g.waiting(event)
                for i in mine:
                    if self.g.ready(i):
                        answer = fire(i, self.g.release(i), time.monotonic() - start) or answer
                    elif (why := self._why_not(i, launch)) is not None:
                        self.g.give_up(i, why)
                        self.history.add(Held(index=i, launch=launch, after=self.g.faults[i].when.after,
                                              at={"point": event["point"], "rank": event["rank"],
                                                  "info": event.get("info", {})},
                                              held_s=round(time.monotonic() - start, 3), why=why))
                if not self.g.waiting(event):
                    return answer
            with self._changed:
                self._changed.wait_for(lambda: self._generation != seen, timeout=1.0)


# ---- what the fault-free run says a trigger can reach ---------------------------------------------

def _reported(point: str, events: list[dict], found: list[dict]) -> list[tuple[int, list[str]]]:
    """(rank, names) of each thing a ``point`` of a run like the fault-free one would name: for the
    points of a written file, each file of the layer that reports it, under every name it had (a run
    reports its writes with them, ``follow.py``); for the others, each such event's path."""
    source = follow.WRITE.get(point) or follow.DONE.get(point)
    if source is None:
        return [(e.get("rank", 0), follow.names(e["info"])) for e in events
                if e.get("point") == point and (e.get("info") or {}).get("path")]
    shard = point.startswith("ckpt.shard.")
    return [(f["rank"], f["names"]) for f in found if f["source"] == source
            and (source == "faultfs" or f["names"][0].endswith(".distcp") == shard)
            and (_python_reported(f) or point in follow.DONE)]


def _python_reported(f: dict) -> bool:
    """Whether the probe layer reports a write point of the golden run's file ``f``: its points come
    from Python's writes, at each tenth of the file's size, so an empty file has none, nor one whose
    bytes a native writer wrote but for less than a tenth in Python (``python_bytes``: numpy's np.save
    writes its header through the Python file and the array through its descriptor)."""
    python = f.get("python_bytes", f["size"])
    return python > 0 and python >= -(-f["size"] // TENTHS)


def _native(f: dict) -> str:
    return (f" (Python wrote {f['python_bytes']} of its {f['size']} bytes, less than the tenth a write point "
            "reports first)" if f.get("python_bytes") else "")


def near_misses(t: Trigger, events: list[dict], listing: dict[str, int] | None = None) -> list[str]:
    """Why the files of the fault-free run that ``t.path`` names are not reported by ``t.point`` under
    that name: each reason names the file and the fix. ``listing``: the checkpoint folder as the run
    ended (path -> size), which shows the files no layer saw written."""
    found = follow.files(events)
    layer = "faultfs" if t.point.startswith("faultfs.") else "file"
    # faultfs's point for the same call, which sees every writer
    native = "faultfs." + {"done": "done", "fsync": "fsync", "rename": "rename", "remove": "remove"}.get(
        t.point.rsplit(".", 1)[-1], "write")
    vocab = set(follow.plan(events)["vocab"])
    by_name: dict[str, list[dict]] = defaultdict(list)
    for f in found:
        for n in f["names"]:
            by_name[n].append(f)
    renamed = {}  # destination -> source of the renames of the run
    for e in events:
        info = e.get("info") or {}
        if e.get("point") in follow.RENAMES and info.get("src") and info.get("path"):
            renamed.setdefault(info["path"], info["src"])
    reasons = []
    for y in dict.fromkeys([*by_name, *renamed, *(listing or {})]):
        if not fnmatch.fnmatch(y, t.path):
            continue
        mine = [f for f in by_name.get(y, []) if f["source"] == layer]
        if mine and t.point in follow.WRITE and not any(_python_reported(f) for f in mine):
            # opened by Python, written by native code through its descriptor (numpy's tofile, np.save)
            reasons.append(f"{y} is written by a native writer the layer does not see: aim at {native}"
                           + _native(mine[0]))
            continue
        if mine:
            x = mine[0]["names"][0]
            if x != y:
                reasons.append(f"{y} is written under a temporary name, {x}, and renamed to {y}: {t.point} "
                               f"reports it as {x} (aim at {follow.masked(x, vocab)!r}, or at a write point, "
                               "which follows the renames)")
            elif t.point not in follow.WRITE and t.point not in follow.DONE:
                reasons.append(f"{y} is written, but the fault-free run reached no {t.point} on it")
            continue
        if by_name.get(y):
            reasons.append(f"{y} is written by a native writer the layer does not see: aim at {native}"
                           if layer == "file" else
                           f"{y} is outside the checkpoint folder faultfs is mounted on (command.ckpt_dir): "
                           f"aim at {t.point.replace('faultfs.', 'file.')}")
            continue
        src = next((s + y[len(d.rstrip("/")):] for d, s in renamed.items() if follow.moved(y, d, d) is not None),
                   None)
        if src is not None and src.startswith("/"):
            reasons.append(f"{y} is staged outside the watched folders, as {src}, and renamed into place (set "
                           'TMPDIR = "{run_dir}/tmp" in command.env and add "tmp" to command.watch)')
        elif layer == "file":
            reasons.append(f"{y} is written by a native writer the layer does not see: aim at {native}")
    return list(dict.fromkeys(reasons))[:4]


def unreached(t: Trigger, events: list[dict], listing: dict[str, int] | None = None) -> str | None:
    """Why no ``t.point`` of the fault-free run ``events``, of ``t.rank``, names a file ``t.path``
    matches, as the same point of a run would name it; None when one does."""
    found = follow.files(events)
    reported = _reported(t.point, events, found)
    hit = [(r, n) for r, ns in reported for n in ns if fnmatch.fnmatch(n, t.path)]
    if any(t.rank is None or r == t.rank for r, _ in hit):
        return None
    if hit:
        ranks = ", ".join(str(r) for r in sorted({r for r, _ in hit}))
        reasons = [f"{hit[0][1]} is reported by rank {ranks} only (set when.rank to it)"]
    else:
        reasons = near_misses(t, events, listing)
    paths = sorted({ns[0] + (f" (renamed to {ns[-1]})" if len(ns) > 1 else "") for _, ns in reported})
    more = f" and {len(paths) - 12} more" if len(paths) > 12 else ""
    rank = f" of rank {t.rank}" if t.rank is not None else ""
    return (f"no {t.point}{rank} of the fault-free run matches {t.path!r}"
            + (f": {'; '.join(reasons)}" if reasons else "")
            + (f"; the paths it reported: {', '.join(paths[:12])}{more}" if paths else
               f"; it reported no {t.point} with a path")
            + ("" if reasons else "; aim at one of them"))
