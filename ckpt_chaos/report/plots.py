"""Plots of one scenario run, for the suite's HTML report: the loss against the golden run, and a
Jepsen-style timeline of what every rank and the harness did.

Each plot is an SVG file in the scenario's own directory, next to the history it is drawn from,
so the report opens from the file system with no network and stays small however many
scenarios it holds. ``plot_scenario`` never raises for a run it cannot draw (a scenario skipped
before it launched has nothing to plot): it returns the plots it made, and writes what failed to
``plot-error.txt``, one line per plot; ``wanted`` says which plots a run should have, so that
``ckpt-chaos report --browser`` fails on one that is missing.

Both plots read any trainer's run: the reference trainer's (``loss`` per step; saves from
``ckpt.stage`` to ``ckpt.latest``) and a ``[command]`` trainer's, as the automatic probe layer
records it (``loss_hex`` per step; a save from ``ckpt.stage`` to its last file point, the layer's
``file.*`` and faultfs's points, and, when the run has one, the opens and closes of checkpoint files
in ``files.jsonl``, the file-event log).
"""

from __future__ import annotations

import os
import textwrap
import tomllib
from pathlib import Path

from ckpt_chaos.check.history import (Exited, FaultFired, LaunchStarted, ProbeEvent, RankExited, Record, read_history,
                                     read_jsonl, step_loss)
from ckpt_chaos.faults import KINDS
from ckpt_chaos.probe.run_files import FILES, HISTORY, SCENARIO, TRAJECTORY

# One colour per kind of thing on a timeline; each fault in its kind's colour (ckpt_chaos/faults/), as
# Jepsen gives each fault package its colour.
COLOURS = {"step": "#9ecae1", "save": "#31a354", "load": "#756bb1", "upload": "#fd8d3c", "fault": "#de2d26",
           "launch": "#636363", "file": "#00441b"}
PLOTS = {"loss": "loss.svg", "timeline": "timeline.svg"}
PLOT_ERROR = "plot-error.txt"


def fault_colour(kind: str) -> str:
    return KINDS[kind].colour if kind in KINDS else COLOURS["fault"]
SAVE_START, SAVE_END = "ckpt.stage", ("ckpt.latest", "ckpt.async.done", "ckpt.failed")
# A file written, from its first write to its close (the probe layer's, DCP's shards', faultfs's), and
# the other file points a save goes through; a [command] trainer's save ends at the last of them.
WRITES = {"file.write": "file.done", "ckpt.shard.write": "ckpt.shard.done", "faultfs.write": "faultfs.done"}
FILE_MARKS = {"file.rename": ">", "faultfs.rename": ">", "ckpt.commit": ">", "file.fsync": ".", "faultfs.fsync": ".",
              "ckpt.fsync": ".", "file.remove": "x", "faultfs.remove": "x", "file.rmtree": "x", "file.copy": "+",
              "ckpt.metadata": "|", "ckpt.manifest": "|"}
SAVE_POINTS = {*WRITES, *WRITES.values(), *FILE_MARKS}
FILE_OPS = ("open", "close", "create", "delete", "rename")  # of files.jsonl's; watch and unavailable say no file's


def has_loss(rec: dict) -> bool:
    return rec.get("loss") is not None or bool(rec.get("loss_hex"))


def wanted(run_dir: Path) -> dict[str, str]:
    """The plots ``plot_scenario`` draws for this run, with what each is drawn from: a loss plot for a
    run with a trajectory (its own or its golden run's), a timeline for a run with a history."""
    run_dir = Path(run_dir)
    out = {}
    for f in (run_dir / TRAJECTORY, run_dir / "golden" / TRAJECTORY):
        if any(has_loss(r) for r in read_jsonl(f)):
            out["loss"] = f"a trajectory ({f.relative_to(run_dir)})"
            break
    if read_jsonl(run_dir / HISTORY):
        out["timeline"] = f"a history ({HISTORY})"
    return out


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_scenario(run_dir: Path) -> dict[str, str]:
    """Draw ``loss.svg`` and ``timeline.svg`` into ``run_dir``; returns {plot: file name}."""
    run_dir = Path(run_dir)
    made, errors = {}, []
    (run_dir / PLOT_ERROR).unlink(missing_ok=True)  # an earlier build's: this one says for itself
    try:
        history = read_history(run_dir)
    except Exception as e:  # the loss is drawn without its faults marked; the timeline not at all
        history, errors = [], [f"timeline: {type(e).__name__}: {e}"]
    for plot, draw in (("loss", _loss), ("timeline", _timeline)):
        if plot == "timeline" and not history:
            continue
        try:
            if draw(run_dir, history):
                made[plot] = PLOTS[plot]
        except Exception as e:  # a plot is evidence, not a verdict: say what failed, keep the report
            errors.append(f"{plot}: {type(e).__name__}: {e}")
    if errors:
        (run_dir / PLOT_ERROR).write_text("".join(f"{line}\n" for line in errors))
    return made


def _loss(run_dir: Path, history: list[Record]) -> bool:
    chaos = [r for r in read_jsonl(run_dir / TRAJECTORY) if has_loss(r)]
    golden = sorted({r["step"]: r for r in read_jsonl(run_dir / "golden" / TRAJECTORY)
                     if has_loss(r)}.values(), key=lambda r: r["step"])
    if not chaos and not golden:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 2.6))
    if golden:
        ax.plot([r["step"] for r in golden], [step_loss(r) for r in golden], color="#bbbbbb", lw=4,
                label="golden run", gid="loss-golden")
    launches = sorted({r.get("attempt", 0) for r in chaos})
    for n in launches:
        rows = [r for r in chaos if r.get("attempt", 0) == n]
        ax.plot([r["step"] for r in rows], [step_loss(r) for r in rows], marker=".", lw=1.2, label=f"launch {n}",
                gid=f"loss-launch-{n}")
    # A fault is drawn after the last step its launch had finished when it fired; a restart at its first step.
    for h in history:
        if isinstance(h, FaultFired):
            x = _fault_step(h, chaos, history)
            colour = fault_colour(h.fault)
            ax.axvline(x, color=colour, ls="--", lw=1, gid=f"loss-fault-{h.index}-{h.launch}")
            ax.annotate(h.fault, (x, 1), xycoords=("data", "axes fraction"),
                        rotation=90, va="top", ha="right", fontsize=7, color=colour)
    for n in launches[1:]:
        first = min(r["step"] for r in chaos if r.get("attempt", 0) == n)
        ax.axvline(first - 0.5, color=COLOURS["launch"], ls=":", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(run_dir / "loss.svg")
    plt.close(fig)
    return True


def _fault_step(h: FaultFired, chaos: list[dict], history: list[Record]) -> float:
    """Where a fault goes on the loss plot: after the last step its launch had finished when it fired.
    That step is the one of the step point it fired at, else the last step recorded before it (the
    reference trainer's records carry their time; else the step points of its launch), else (a
    [command] trainer's records carry no time) the last step its launch trained."""
    at = h.at or {}
    step = (at.get("info") or {}).get("step")
    if isinstance(step, int) and at.get("point") in ("step.begin", "microstep.end", "step.end"):
        return step + (0.5 if at["point"] == "step.end" else -0.5)
    rows = [r for r in chaos if r.get("attempt", 0) == h.launch]
    if any("t" in r for r in rows):
        return max((r["step"] for r in rows if r.get("t", 0) <= h.t), default=0) + 0.5
    ends = [e.info["step"] for e in history if isinstance(e, ProbeEvent) and e.point == "step.end"
            and e.launch == h.launch and e.t <= h.t and isinstance(e.info.get("step"), int)]
    return max(ends or [r["step"] for r in rows] or [0]) + 0.5


def _relative(path: str, run_dir: Path) -> str:
    """A logged path relative to the run directory (where it is in it, also after the run was moved)."""
    if not os.path.isabs(path):
        return os.path.normpath(path)
    for base in (run_dir.absolute(), run_dir.resolve()):
        try:
            return Path(path).relative_to(base).as_posix()
        except ValueError:
            pass
    marker = f"/{run_dir.name}/"
    return path.rsplit(marker, 1)[1] if marker in path else path


def _checkpoint_folders(run_dir: Path) -> list[str]:
    """A [command] run's checkpoint folders, from its scenario.toml (``command.ckpt_dir``, ``command.watch``);
    empty where it names none."""
    try:
        command = tomllib.loads((run_dir / SCENARIO).read_text()).get("command")
    except (OSError, ValueError):
        return []
    if not isinstance(command, dict):
        return []
    folders = [command.get("ckpt_dir", "checkpoints"), *command.get("watch", [])]
    return [_relative(str(f), run_dir).rstrip("/") for f in folders if isinstance(f, str) and f]


def _file_events(run_dir: Path, history: list[Record]) -> list[dict]:
    """The opens, closes, creations, deletions and renames of checkpoint files in the run's file-event
    log (``files.jsonl``), where it has one: paths relative to the run directory, only those in the
    scenario's checkpoint folders, each with the lane it is drawn on (its rank's, else "others")."""
    rows = read_jsonl(run_dir / FILES)
    if not rows:
        return []
    folders = _checkpoint_folders(run_dir)
    starts = sorted((h.t, h.launch) for h in history if isinstance(h, LaunchStarted))
    out = []
    for r in rows:
        t, path, rank, launch = r.get("t"), r.get("path"), r.get("rank"), r.get("launch")
        if r.get("op") not in FILE_OPS or not isinstance(t, (int, float)) or not isinstance(path, str):
            continue
        path = _relative(path, run_dir)
        if folders and not any(path == d or path.startswith(d + "/") for d in folders):
            continue
        if not isinstance(launch, int):
            launch = max((n for s, n in starts if s <= t), default=0)
        ranked = isinstance(rank, int) and not isinstance(rank, bool)
        out.append({**r, "path": path, "launch": launch, "lane": ("rank", rank) if ranked else ("others", 0)})
    return sorted(out, key=lambda r: r["t"])


def _timeline(run_dir: Path, history: list[Record]) -> bool:
    probes = [h for h in history if isinstance(h, ProbeEvent)]
    harness = [h for h in history if not isinstance(h, ProbeEvent)]
    if not probes and not harness:
        return False
    plt = _pyplot()
    timeline = _Timeline(plt, history, probes, harness, _file_events(run_dir, history))
    for lane, y in timeline.lane_of.items():
        timeline.draw_lane(lane, y)
    timeline.draw_harness()
    timeline.finish()
    timeline.fig.savefig(run_dir / "timeline.svg")
    plt.close(timeline.fig)
    return True


class _Timeline:
    """One timeline being drawn: a lane for the harness (0) and one for each rank or other role, what
    the history says of each launch, and the SVG ids given so far (``gid``)."""

    def __init__(self, plt, history: list[Record], probes: list[ProbeEvent], harness: list[Record],
                 files: list[dict]):
        self.probes, self.harness, self.files = probes, harness, files
        self.t0 = min(h.t for h in history)
        span = max([h.t for h in history] + [f["t"] for f in files]) - self.t0
        self.least = max(span, 1e-3) / 400  # a save of milliseconds in a run of seconds still shows
        # The reference trainer says where a save ends (ckpt.latest, on rank 0; a save may go on while
        # training does); a [command] trainer's save, as the probe layer sees it, ends at its last file
        # point, and at the latest when training goes on. A save no point ends: at its last file point,
        # or, where its launch failed, cut short where the launch ended.
        self.explicit = any(h.point in SAVE_END for h in probes)
        self.died = {(h.launch, h.rank): h.t for h in harness if isinstance(h, RankExited)}
        self.exited = {h.launch: h.t for h in harness if isinstance(h, Exited)}
        self.rcs = {h.launch: h.rc for h in harness if isinstance(h, Exited)}
        self.started = {h.launch: h for h in harness if isinstance(h, LaunchStarted)}
        self.lanes = sorted({(h.role, h.rank) for h in probes} | {f["lane"] for f in files},
                            key=lambda x: (x[0] != "rank", x[0], x[1]))
        self.lane_of = {lane: i + 1 for i, lane in enumerate(self.lanes)}  # lane 0: the harness
        self.fig, self.ax = plt.subplots(figsize=(9, 0.7 + 0.45 * (len(self.lanes) + 1)))
        self.drawn: dict[str, int] = {}

    def gid(self, kind: str, lane: tuple) -> str:
        key = f"{kind}-{lane[0] if lane[0] != 'rank' else 'rank'}{lane[1] if lane[0] == 'rank' else ''}"
        self.drawn[key] = self.drawn.get(key, 0) + 1
        return f"{key}-{self.drawn[key]}"

    def bar(self, kind: str, lane: tuple, start: float, end: float, y0: float, height: float, cut: bool = False,
            colour: str | None = None, torn: bool = False) -> None:
        # cut: the process ended first (pale); torn: a file left written but not closed (red edge)
        self.ax.broken_barh([(start, max(end - start, self.least))], (y0, height), facecolor=colour or COLOURS[kind],
                            alpha=0.5 if cut else 1.0, edgecolor=COLOURS["fault"] if torn else "none",
                            linewidth=1 if torn else 0, gid=self.gid(kind + ("-cut" if cut else ""), lane),
                            zorder=2.5 if kind in ("write", "file") else 1)  # a file's strip over its save

    def draw_lane(self, lane: tuple, y: int) -> None:
        """A rank's (or role's) lane: each launch's process, its probe events and its logged files."""
        t0, started = self.t0, self.started
        events = sorted((h for h in self.probes if (h.role, h.rank) == lane), key=lambda h: h.t)
        mine = [f for f in self.files if f["lane"] == lane]
        ran = {n for n, h in started.items() if lane[0] == "rank" and lane[1] < h.world_size}
        for launch in sorted({h.launch for h in events} | {f["launch"] for f in mine} | ran):
            seg = [h for h in events if h.launch == launch]
            logged = [f for f in mine if f["launch"] == launch]
            # where this launch ended for the lane: its rank's exit, the launch's, or its last event
            end_t = (self.died.get((launch, lane[1])) if lane[0] == "rank" else None) or self.exited.get(launch) \
                or max([h.t for h in seg] + [f["t"] for f in logged], default=t0)
            end = end_t - t0
            if launch in ran:  # the rank's process, from its launch to its exit
                self.ax.hlines(y, started[launch].t - t0, end, color=COLOURS["launch"], lw=0.8, alpha=0.6, zorder=0,
                               gid=self.gid(f"life{launch}", lane))
            self._probe_events(lane, y, launch, seg, end)
            self._logged_files(lane, y, logged, end)

    def _probe_events(self, lane: tuple, y: int, launch: int, seg: list[ProbeEvent], end: float) -> None:
        """One launch's steps, saves, uploads, loads and file points on a lane, and what of them was
        still under way when the launch ended for it (at ``end``)."""
        ax, t0, bar, gid = self.ax, self.t0, self.bar, self.gid
        step = save = save_last = upload = None
        writing: dict[str, float] = {}
        for h in seg:
            x, p, path = h.t - t0, h.point, h.info.get("path") or h.info.get("file")  # file: a DCP shard's
            if p == "step.begin":
                step = x
            elif p == "step.end" and step is not None:
                bar("step", lane, step, x, y - 0.3, 0.6)
                step = None
            elif p == "upload.begin":
                upload = x
            elif p in ("upload.durable", "upload.failed") and upload is not None:
                bar("upload", lane, upload, x, y - 0.3, 0.6)
                upload = None
            elif p.startswith("load."):
                ax.plot([x], [y], marker="D", ms=4, color=COLOURS["load"], gid=gid("load", lane))
            if p == SAVE_START:
                if save is not None:  # the one before, on a rank that does not say where a save ends
                    bar("save", lane, save, save_last, y - 0.4, 0.8)
                save = save_last = x
            elif p in SAVE_END and save is not None:
                bar("save", lane, save, x, y - 0.4, 0.8)
                save = None
            elif save is not None and p in SAVE_POINTS:
                save_last = x
            elif save is not None and not self.explicit and p in ("step.begin", "step.end", "load.begin"):
                bar("save", lane, save, save_last, y - 0.4, 0.8)  # training went on: the save is over
                save = None
            if p in WRITES and path is not None:
                writing.setdefault(path, x)
            elif p in WRITES.values() and path in writing:
                bar("write", lane, writing.pop(path), x, y + 0.22, 0.16, colour=COLOURS["file"],
                    torn=bool(h.info.get("failed") or h.info.get("short")))
            elif p in FILE_MARKS:
                if p in ("file.rename", "faultfs.rename") and h.info.get("src") in writing:
                    writing[path] = writing.pop(h.info["src"])
                ax.plot([x], [y + 0.3], marker=FILE_MARKS[p], ms=4, color=COLOURS["file"], ls="none",
                        zorder=3, gid=gid("file-op", lane))
        # what was still under way when the launch ended for this lane
        for start, kind in ((step, "step"), (upload, "upload")):
            if start is not None:
                bar(kind, lane, start, end, y - 0.3, 0.6, cut=True)
        if save is not None:  # cut short where the launch failed; else over at its last file point
            if writing or self.rcs.get(launch) != 0:
                bar("save", lane, save, end, y - 0.3, 0.6, cut=True)
            else:
                bar("save", lane, save, save_last, y - 0.4, 0.8)
        for start in writing.values():
            bar("write", lane, start, end, y + 0.22, 0.16, colour=COLOURS["file"], cut=True, torn=True)

    def _logged_files(self, lane: tuple, y: int, logged: list[dict], end: float) -> None:
        """files.jsonl: each checkpoint file from its open to its close, dark green where written."""
        ax, t0, bar, gid = self.ax, self.t0, self.bar, self.gid
        opened: dict[tuple, list[tuple[float, dict]]] = {}
        for f in logged:
            x, key = f["t"] - t0, (f.get("pid"), f["path"])
            if f["op"] in ("open", "close") and f.get("dir"):
                continue  # a folder listed (a resume looking for its checkpoint): no file's
            if f["op"] == "open":
                opened.setdefault(key, []).append((x, f))
            elif f["op"] == "close" and opened.get(key):
                start, first = opened[key].pop()
                wrote = f.get("wrote") or first.get("wrote")
                bar("file", lane, start, x, y - 0.42, 0.16, colour=COLOURS["file" if wrote else "load"])
            elif f["op"] in ("create", "delete", "rename"):
                ax.plot([x], [y - 0.34], marker={"create": "+", "delete": "x", "rename": ">"}[f["op"]], ms=4,
                        color=COLOURS["file"], ls="none", zorder=3, gid=gid("file-op", lane))
        for key, starts in opened.items():
            for start, first in starts:
                bar("file", lane, start, end, y - 0.42, 0.16, colour=COLOURS["file"], cut=True, torn=True)

    def draw_harness(self) -> None:
        """Lane 0: the launches, their exits and the ranks' deaths; each fault, across every lane."""
        ax, lanes = self.ax, self.lanes
        faults = 0
        for h in self.harness:
            x = h.t - self.t0
            if isinstance(h, FaultFired):
                ax.axvline(x, color=fault_colour(h.fault), lw=1, gid=f"fault-{h.index}-{h.launch}")
                # staggered, so that faults fired at the same moment stay readable
                ax.annotate(f"{h.fault} {h.target}", (x, len(lanes) + 0.45 + 0.35 * (faults % 2)),
                            fontsize=7, color=fault_colour(h.fault), va="bottom")
                faults += 1
            elif isinstance(h, (LaunchStarted, Exited)):
                started = isinstance(h, LaunchStarted)
                ax.plot([x], [0], marker="|" if started else "x", ms=10, color=COLOURS["launch"],
                        gid=f"{'launch' if started else 'exit'}-{h.launch}")
                label = f"launch {h.launch}" if started else f"exit {h.rc}"
                ax.annotate(label, (x, 0.2 if started else -0.55), fontsize=7, color=COLOURS["launch"])
            elif isinstance(h, RankExited):
                ax.plot([x], [0], marker="v", ms=5, color=COLOURS["fault"])

    def finish(self) -> None:
        """The lanes' names, the limits and the key."""
        ax, lanes = self.ax, self.lanes
        ax.set_yticks(range(len(lanes) + 1), ["harness"] + [f"{r if role == 'rank' else role}" if role != "rank"
                                                            else f"rank {r}" for role, r in lanes])
        ax.set_ylim(-0.7, len(lanes) + 1.4)
        key = ["blue: steps", "green: saves", "pale: cut short", "orange: uploads", "purple: loads",
               "grey line: a rank's process", "dark green: checkpoint files written (above)",
               *(["open (below, files.jsonl; purple: only read)"] if self.files else []), "red edge: left torn",
               "faults in their kind's colour"]
        ax.set_xlabel("\n".join(textwrap.wrap(f"seconds since the first launch  ({', '.join(key)})", 120)), fontsize=8)
        ax.grid(axis="x", alpha=0.3)
        self.fig.tight_layout()
