"""Plots of one scenario run, for the suite's HTML report: the loss against the golden run, and a
Jepsen-style timeline of what every rank and the harness did.

Each plot is an SVG file in the scenario's own directory, next to the history it is drawn from,
so the report opens from the file system with no network and stays small however many
scenarios it holds. ``plot_scenario`` never raises for a run it cannot draw (a scenario skipped
before it launched has nothing to plot): it returns the plots it made.
"""

from __future__ import annotations

from pathlib import Path

from ckpt_chaos.check.history import (Exited, FaultFired, LaunchStarted, ProbeEvent, RankExited, Record, read_history,
                                     read_jsonl)
from ckpt_chaos.faults import KINDS

# One colour per kind of thing on a timeline; each fault in its kind's colour (ckpt_chaos/faults/), as
# Jepsen gives each fault package its colour.
COLOURS = {"step": "#9ecae1", "save": "#31a354", "load": "#756bb1", "upload": "#fd8d3c", "fault": "#de2d26",
           "launch": "#636363"}


def fault_colour(kind: str) -> str:
    return KINDS[kind].colour if kind in KINDS else COLOURS["fault"]
SAVE_START, SAVE_END = "ckpt.stage", ("ckpt.latest", "ckpt.async.done", "ckpt.failed")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_scenario(run_dir: Path) -> dict[str, str]:
    """Draw ``loss.svg`` and ``timeline.svg`` into ``run_dir``; returns {plot: file name}."""
    run_dir = Path(run_dir)
    made = {}
    try:
        history = read_history(run_dir)
        if _loss(run_dir, history):
            made["loss"] = "loss.svg"
        if history and _timeline(run_dir, history):
            made["timeline"] = "timeline.svg"
    except Exception as e:  # a plot is evidence, not a verdict: say what failed, keep the report
        (run_dir / "plot-error.txt").write_text(f"{type(e).__name__}: {e}\n")
    return made


def _loss(run_dir: Path, history: list[Record]) -> bool:
    chaos = read_jsonl(run_dir / "trajectory.jsonl") if (run_dir / "trajectory.jsonl").exists() else []
    golden_file = run_dir / "golden" / "trajectory.jsonl"
    golden = read_jsonl(golden_file) if golden_file.exists() else []
    if not chaos and not golden:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 2.6))
    if golden:
        ax.plot([r["step"] for r in golden], [r["loss"] for r in golden], color="#bbbbbb", lw=4, label="golden run")
    launches = sorted({r.get("attempt", 0) for r in chaos})
    for n in launches:
        rows = [r for r in chaos if r.get("attempt", 0) == n]
        ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], marker=".", lw=1.2, label=f"launch {n}")
    # A fault is drawn at the last step its launch had finished when it fired; a restart at its first step.
    for h in history:
        if isinstance(h, FaultFired):
            done = [r["step"] for r in chaos if r.get("attempt", 0) == h.launch and r.get("t", 0) <= h.t]
            colour = fault_colour(h.fault)
            ax.axvline(max(done, default=0) + 0.5, color=colour, ls="--", lw=1)
            ax.annotate(h.fault, (max(done, default=0) + 0.5, 1), xycoords=("data", "axes fraction"),
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


def _timeline(run_dir: Path, history: list[Record]) -> bool:
    probes = [h for h in history if isinstance(h, ProbeEvent)]
    harness = [h for h in history if not isinstance(h, ProbeEvent)]
    if not probes and not harness:
        return False
    t0 = min(h.t for h in history)
    lanes = sorted({(h.role, h.rank) for h in probes}, key=lambda x: (x[0] != "rank", x[1]))
    lane_of = {lane: i + 1 for i, lane in enumerate(lanes)}  # lane 0: the harness
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * (len(lanes) + 1)))
    for lane, y in lane_of.items():
        events = sorted((h for h in probes if (h.role, h.rank) == lane), key=lambda h: h.t)
        open_save = open_step = open_upload = None
        for h in events:
            x = h.t - t0
            kind = h.point
            if kind == "step.begin":
                open_step = x
            elif kind == "step.end" and open_step is not None:
                ax.broken_barh([(open_step, x - open_step)], (y - 0.3, 0.6), color=COLOURS["step"])
                open_step = None
            elif kind == SAVE_START:
                open_save = x
            elif kind in SAVE_END and open_save is not None:
                ax.broken_barh([(open_save, x - open_save)], (y - 0.4, 0.8), color=COLOURS["save"])
                open_save = None
            elif kind == "upload.begin":
                open_upload = x
            elif kind in ("upload.durable", "upload.failed") and open_upload is not None:
                ax.broken_barh([(open_upload, x - open_upload)], (y - 0.3, 0.6), color=COLOURS["upload"])
                open_upload = None
            elif kind.startswith("load."):
                ax.plot([x], [y], marker="D", ms=4, color=COLOURS["load"])
        if events:  # a rank that died mid-save or mid-step: its bar ends at its last event
            last = events[-1].t - t0
            for start, colour in ((open_save, "save"), (open_step, "step"), (open_upload, "upload")):
                if start is not None:
                    ax.broken_barh([(start, last - start)], (y - 0.3, 0.6), color=COLOURS[colour], alpha=0.5)
    faults = 0
    for h in harness:
        x = h.t - t0
        if isinstance(h, FaultFired):
            ax.axvline(x, color=fault_colour(h.fault), lw=1)
            # staggered, so that faults fired at the same moment stay readable
            ax.annotate(f"{h.fault} {h.target}", (x, len(lanes) + 0.45 + 0.35 * (faults % 2)),
                        fontsize=7, color=fault_colour(h.fault), va="bottom")
            faults += 1
        elif isinstance(h, (LaunchStarted, Exited)):
            started = isinstance(h, LaunchStarted)
            ax.plot([x], [0], marker="|" if started else "x", ms=10, color=COLOURS["launch"])
            label = f"launch {h.launch}" if started else f"exit {h.rc}"
            ax.annotate(label, (x, 0.2 if started else -0.55), fontsize=7, color=COLOURS["launch"])
        elif isinstance(h, RankExited):
            ax.plot([x], [0], marker="v", ms=5, color=COLOURS["fault"])
    ax.set_yticks(range(len(lanes) + 1), ["harness"] + [f"{r if role == 'rank' else role}" if role != "rank"
                                                        else f"rank {r}" for role, r in lanes])
    ax.set_ylim(-0.7, len(lanes) + 1.4)
    ax.set_xlabel("seconds since the first launch  (blue: steps, green: saves, orange: uploads, "
                  "purple: loads, faults in their kind's colour)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(run_dir / "timeline.svg")
    plt.close(fig)
    return True
