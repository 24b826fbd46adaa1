"""The benchmarks' report: one self-contained HTML page from the figures in benchmarks/results.

Reads whatever benchmark results exist (a benchmark not run yet is listed as such), adds the
cadence recommendation for the costs measured here, and writes ``reports/bench/index.html`` with
every plot inline (it opens from the file system, no network).

    python benchmarks/report.py   # the last step of `make bench`
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
from jinja2 import Environment

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ckpt_chaos.report.goodput import Costs, plot, recommend  # noqa: E402

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent
# Job MTBFs to show the measured costs against: a flaky preemptible pool to a stable cluster.
MTBF_H = (0.25, 1.0, 8.0, 24.0)


def _load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _svg(path: Path) -> str:
    """An SVG file's markup, to inline (its XML prolog and doctype dropped)."""
    text = path.read_text()
    return text[text.index("<svg"):] if "<svg" in text else ""


def _table(df: pd.DataFrame) -> str:
    return df.to_html(index=False, border=0, classes="t", float_format=lambda v: f"{v:.3g}", na_rep="")


def overhead_section(d: dict) -> dict:
    rows = []
    for name, s in d["sizes"].items():
        rows.append({"model": name, "checkpoint MB": s["checkpoint_mb"], "step s": s["step_s_no_ckpt"],
                     "stall sync s": s["stall_sync_s"], "stall async s": s["stall_async_s"],
                     "save total s": s["save_total_s"], "save MB/s": s["save_mb_s"],
                     "fsynced write MB/s": s["fsync_write_mb_s"],
                     "save / fsync rate": s["save_fraction_of_fsync_bw"], "load s": s["load_s"],
                     "restart s": s["restart_s"], "loop time × (ckpt every 2 steps)": s["loop_overhead_sync"]})
    return {"table": _table(pd.DataFrame(rows)), "rounds": d["rounds"]}


def cadence_section(costs: Costs, out: Path) -> dict:
    rows, plots = [], []
    for mtbf_h in MTBF_H:
        c = Costs(save=costs.save, restart=costs.restart, mtbf=mtbf_h * 3600)
        rec = recommend(c, current=600.0)
        rows.append({"job MTBF h": mtbf_h, "Young s": rec.young_s, "Daly s": rec.daly_s, "best s": rec.best_s,
                     "goodput at best": f"{rec.best_goodput:.3%}", "every 10 min": f"{rec.current_goodput:.3%}",
                     **{name: f"{g:.3%}" for name, g in rec.rules.items()}})
        if mtbf_h == 1.0:
            plot(rec, out / "cadence.svg")
            plots.append(_svg(out / "cadence.svg"))
    return {"table": _table(pd.DataFrame(rows)), "plots": plots, "save": costs.save, "restart": costs.restart}


def soak_section(d: dict) -> dict:
    rows = []
    for c in d["cadences"]:
        p = c["predicted"]
        rows.append({"ckpt every (steps)": c["every_steps"], "interval s": c["interval_s"],
                     "runs": len(c["goodput_runs"]), "failures (median)": c["failures"],
                     "steps redone (median)": c["steps_redone"],
                     "measured goodput (median)": f"{c['goodput']:.1%}",
                     "measured, each run": ", ".join(f"{g:.1%}" for g in c["goodput_runs"]),
                     "model (Daly)": f"{p['model']:.1%}", "Monte Carlo mean": f"{p['sim_mean']:.1%}",
                     "Monte Carlo 5-95 %": f"{p['sim_p5']:.1%} - {p['sim_p95']:.1%}",
                     "measured / model (median of runs)": c["measured_vs_model"],
                     "runs inside the MC 5-95 %": f"{c['runs_within_mc_5_95']} of {len(c['goodput_runs'])}"})
    svg = RESULTS / "soak_goodput.svg"
    return {"table": _table(pd.DataFrame(rows)), "plot": _svg(svg) if svg.exists() else "", "d": d}


def explore_section(d: dict) -> dict:
    """Per trainer (and families): how many searches found something, the median time to find,
    the largest shrunk schedule, and the schedules per minute."""
    rows = []
    for trainer, s in d["summary"].items():
        rows.append({"trainer [families]": trainer, "budget s (find + shrink)": ", ".join(s.get("budgets_s", [])),
                     "found / searches": f"{s['found']} / {s['searches']}",
                     "first failed check": ", ".join(s["identities"]) or "nothing",
                     "median time to find s": s["median_time_to_find_s"],
                     "shrunk to (max faults)": s["max_shrunk_faults"],
                     "schedules": s["schedules"], "schedules / min": s["schedules_per_minute"]})
    return {"table": _table(pd.DataFrame(rows)), "d": d, "seeds": sorted({r["seed"] for r in d["searches"]})}


def generic_section(d: dict) -> str:
    """Other benchmarks: their result blocks, flattened."""
    blocks = {k: v for k, v in d.items() if isinstance(v, dict) and k not in ("machine", "trainer", "slow")}
    rows = [{"figure": f"{k}.{name}", **(v if isinstance(v, dict) else {"value": v})}
            for k, block in blocks.items() for name, v in block.items()]
    return _table(pd.DataFrame(rows)) if rows else ""


def build(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    overhead, soak = _load("checkpoint_overhead"), _load("soak_goodput")
    sections = {"overhead": overhead_section(overhead) if overhead else None,
                "soak": soak_section(soak) if soak else None}
    # The cadence advice takes the costs the soak measured on the loop (else the overhead benchmark's).
    if soak:
        costs = Costs(save=soak["costs_median"]["save_stall_s"], restart=soak["costs_median"]["restart_s"], mtbf=1)
    elif overhead:
        m = overhead["sizes"].get("medium") or next(iter(overhead["sizes"].values()))
        costs = Costs(save=m["stall_sync_s"], restart=m["restart_s"], mtbf=1)
    else:
        costs = None
    sections["cadence"] = cadence_section(costs, out) if costs else None
    explore = _load("explore_planted")
    sections["explore"] = explore_section(explore) if explore else None
    loaded = {name: _load(name) for name in ("storage_stall", "remote_upload", "backend_startup")}
    others = {name: generic_section(d) for name, d in loaded.items() if d}
    missing = [n for n, d in (("checkpoint_overhead", overhead), ("soak_goodput", soak), ("explore_planted", explore))
               if d is None]
    html = _TEMPLATE.render(s=sections, others=others, missing=missing)
    (out / "index.html").write_text(html)
    return out / "index.html"


_TEMPLATE = Environment(autoescape=False).from_string("""<!doctype html>
<html><head><meta charset="utf-8"><title>ckpt-chaos benchmarks</title>
<style>
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table.t{border-collapse:collapse;margin:.5em 0 1.5em}table.t th,table.t td{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}
table.t th{background:#f3f3f3}svg{max-width:100%;height:auto}.note{color:#555;max-width:60em}
</style></head><body>
<h1>ckpt-chaos benchmarks</h1>
<p class="note">Figures from <code>benchmarks/results/*.json</code> (<code>make bench</code>): medians over rounds,
configurations alternating within each round. No timing here is asserted by a test.</p>
{% if missing %}<p><b>Not run yet:</b> {{ missing|join(", ") }}.</p>{% endif %}

{% if s.overhead %}<h2 id="overhead">Checkpoint overhead</h2>
<p class="note">2 ranks, synchronous and asynchronous DCP saves every 2 steps, medians of {{ s.overhead.rounds }} rounds.
The stall is what the training loop waits for (state digests, staging, and for a synchronous save the write and
commit); save throughput is set against a file of the same size written and fsynced on the same file system,
in the same round. Restart: launch of torchrun to the first new step after a load.</p>
{{ s.overhead.table }}{% endif %}

{% if s.soak %}{% set d = s.soak.d %}<h2 id="soak">Goodput under failures: measured against the model</h2>
<p class="note">The real trainer (2 ranks, {{ d.steps }} steps of {{ "%.3f"|format(d.step_s) }} s) killed as a whole job at the
times of a Poisson process (MTBF {{ d.mtbf_s }} s of wall time, the clock running through restarts) and relaunched
at once, {{ d.rounds }} runs per cadence. Measured goodput: useful work (steps &times; the step time of a run without
checkpoints or failures) over the wall time from the first step to the last. Each run is predicted from its own
measured costs (the machine's load drifts); medians over all runs: save stall
{{ "%.3f"|format(d.costs_median.save_stall_s) }} s (the loop's own cost per save, step intervals across a save less
those without: {{ "%.3f"|format(d.costs_median.save_loop_cost_s) }} s), restart
{{ "%.2f"|format(d.costs_median.restart_s) }} s. The table gives medians of the per-run predictions.</p>
{{ s.soak.table }}
{{ s.soak.plot }}
<p class="note"><b>Why measured and predicted differ.</b> Daly's closed form is an expectation over an infinite job;
each soak run is {{ "%.0f"|format(d.horizon_s) }} s of useful work with a handful of failures, so one run's goodput is
one draw from a wide distribution: the Monte Carlo over the same horizon gives its 5-95 % range, and the measured
runs are to be judged against that range, not against the mean. The model also takes every restart and every save
to cost the same (they vary with the machine's load: here two ranks, the harness and the kernel's writeback share
two cores), and work to proceed at one rate: in the real job the steps between frequent saves run slower than in the
fault-free run that useful work is counted in (writing and hashing the checkpoint competes for the same two
cores; README, "Measured here"), which shows at the shortest interval as measured below predicted in every run.</p>{% endif %}

{% if s.cadence %}<h2 id="cadence">Cadence for these costs</h2>
<p class="note">What <code>ckpt-chaos cadence --save-s {{ "%.3f"|format(s.cadence.save) }} --restart-s
{{ "%.2f"|format(s.cadence.restart) }}</code> recommends for the costs measured here, at several job MTBFs (the
plot: 1 h), with a 10-minute interval and the seed articles' rules of thumb for comparison.</p>
{{ s.cadence.table }}{% for p in s.cadence.plots %}{{ p }}{% endfor %}{% endif %}

{% if s.explore %}{% set d = s.explore.d %}<h2 id="explore">Fault-schedule search against planted bugs</h2>
<p class="note">One <code>ckpt-chaos explore</code> search per trainer and seed (seeds {{ s.explore.seeds|join(", ") }};
with the budget in its row to find and to shrink, stopped at the first finding, no example database): each planted bug with the fault families that reach it, and the correct trainer
with each of those family sets, where the figure that matters is that nothing is found. Time to find: from the
start of the search (golden runs included) to the end of the first failing run. The commands, in the order they
ran: {{ d.commands|join("; ") }}.</p>
{{ s.explore.table }}{% endif %}

{% for name, table in others.items() %}<h2>{{ name.replace("_", " ") }}</h2>{{ table }}{% endfor %}
</body></html>
""")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "reports" / "bench"))
    args = ap.parse_args()
    print(f"bench report: {build(Path(args.out))}")


if __name__ == "__main__":
    main()
