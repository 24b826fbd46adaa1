"""The benchmarks' report: one self-contained HTML page from the figures in benchmarks/results.

Reads whatever benchmark results exist (a benchmark not run yet is listed as such), adds the
cadence recommendation for the costs measured here, and writes ``reports/bench/index.html`` with
every plot inline (it opens from the file system, no network).

``--tables`` writes instead one markdown table per results file, ``benchmarks/results/NAME.md``
from ``NAME.json``, without running anything: the benchmark history that docs/benchmarks.md
links to. It needs only the standard library.

    python benchmarks/report.py            # the last step of `make bench`
    python benchmarks/report.py --tables   # benchmarks/results/*.md from benchmarks/results/*.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

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


def _frame(rows):
    import pandas as pd

    return pd.DataFrame(rows)


def _table(df) -> str:
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
    return {"table": _table(_frame(rows)), "rounds": d["rounds"]}


def cadence_section(costs, out: Path) -> dict:
    from ckpt_chaos.report.goodput import Costs, plot, recommend

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
    return {"table": _table(_frame(rows)), "plots": plots, "save": costs.save, "restart": costs.restart}


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
    return {"table": _table(_frame(rows)), "plot": _svg(svg) if svg.exists() else "", "d": d}


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
    return {"table": _table(_frame(rows)), "d": d, "seeds": sorted({r["seed"] for r in d["searches"]})}


def generic_section(d: dict) -> str:
    """Other benchmarks: their result blocks, flattened."""
    blocks = {k: v for k, v in d.items() if isinstance(v, dict) and k not in ("machine", "trainer", "slow")}
    rows = [{"figure": f"{k}.{name}", **(v if isinstance(v, dict) else {"value": v})}
            for k, block in blocks.items() for name, v in block.items()]
    return _table(_frame(rows)) if rows else ""


def build(out: Path) -> Path:
    from ckpt_chaos.report.goodput import Costs

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
    from jinja2 import Environment

    html = Environment(autoescape=False).from_string(_TEMPLATE_TEXT).render(s=sections, others=others, missing=missing)
    (out / "index.html").write_text(html)
    return out / "index.html"


_TEMPLATE_TEXT = ("""<!doctype html>
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
cores; docs/benchmarks.md), which shows at the shortest interval as measured below predicted in every run.</p>{% endif %}

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

# ---- markdown tables of the benchmark history (--tables) -----------------------------------------

_HEADER = ("<!-- generated by `python benchmarks/report.py --tables` from {src}; do not edit by hand -->\n"
           "# {title}\n\n")


def _md(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _f(v, digits: int = 3, unit: str = "") -> str:
    return "" if v is None else f"{v:.{digits}f}{unit}"


def _pct(v, digits: int = 1) -> str:
    return "" if v is None else f"{100 * v:.{digits}f} %"


_PHASES = [("state_s", "state dict"), ("plan_s", "DCP planning"), ("write_data.serialize_s", "serialization"),
           ("write_data.write_s", "writes"), ("write_data.checksum_s", "checksums"), ("write_data.fsync_s", "fsyncs"),
           ("gather_s", "waiting for the peers"), ("metadata_s", "DCP metadata"), ("commit_s", "commit")]


def overhead_md(d: dict) -> str:
    rows, speed, phases = [], [], []
    for name, s in d["sizes"].items():
        c = s.get("config", {})
        model = f"{name} (d {c.get('d_model')}, {c.get('n_layers')} layers)"
        rows.append([model, _f(s["checkpoint_mb"], 1, " MB"),
                     _f(s["step_s_no_ckpt"], 3, " s"), f"{_f(s['stall_sync_s'])} s / {_f(s['stall_async_s'])} s",
                     _f(s["save_mb_s"], 1, " MB/s"), _f(s["fsync_write_mb_s"], 0, " MB/s"),
                     _pct(s["save_fraction_of_fsync_bw"]), _f(s["load_s"], 2, " s"), _f(s["restart_s"], 1, " s"),
                     f"× {s['loop_overhead_sync']:.2f}"])
        if "cold_read_s" not in s:
            continue
        speed.append([model, f"{_f(s['save_total_s'])} s / {_f(s['fsync_write_s'])} s",
                      _pct(s["save_fraction_of_fsync_bw"]),
                      f"{_f(s['stall_async_first_s'])} s / {_f(s['stall_async_s'])} s",
                      f"{_pct(s['async_first_stall_fraction_of_sync_save'])} / "
                      f"{_pct(s['async_stall_fraction_of_sync_save'])}",
                      f"{_f(s['validate_s'])} s + {_f(s['load_s'])} s / {_f(s['cold_read_s'])} s",
                      _pct(s["load_fraction_of_cold_read_bw"]),
                      f"{_f(s.get('cold_read_files_s'))} s", _pct(s.get("load_fraction_of_cold_files_read_bw"))])
        total = s["save_total_s"]
        phases.append([model, _f(total, 3, " s")] + [f"{_f(s['save_phases_s'].get(k, 0.0))} s" for k, _ in _PHASES])
    out = (f"`python benchmarks/checkpoint_overhead.py --rounds {d['rounds']}` ({d['machine']['cpus']} CPUs, "
           f"Python {d['machine']['python']}): 2 ranks, a save every 2 steps on the host's file system, no state "
           f"digests, medians of {d['rounds']} rounds.\n\n" +
           _md(["model", "checkpoint", "step", "stall per save, sync / async", "save throughput",
                "fsynced write, same fs", "save / fsync rate", "load", "restart (launch to 1st new step)",
                "loop time per step, saves every 2 steps / none"], rows))
    if speed:
        out += ("\nAgainst the disk, each ratio taken within a round (median of rounds): a synchronous save against "
                "a file of the same size written and fsynced in the same round; the async stall (first save, median "
                "of saves) against the synchronous save; the resume's reading of the checkpoint from a cold page "
                "cache (validation: manifest, sizes and `.metadata` hashed; then `dcp.load`, each shard hashed as it "
                "is read) against a cold sequential read of a file of the same size, both evicted with "
                "`posix_fadvise(DONTNEED)` after their fsync; and against a cold read of the checkpoint's own files, "
                "a reader thread per file, as the ranks read them.\n\n" +
                _md(["model", "sync save / fsynced write", "save rate / fsync rate", "async stall, first / median",
                     "async stall / sync save, first / median", "validate + load / cold read",
                     "load rate / cold read rate", "cold read of its files, a thread each",
                     "load rate / that rate"], speed))
        out += ("\nWhere a synchronous save's time goes, on rank 0 (the `saved` event's phases, medians): writes, "
                "checksums and serialization are in DCP's `write_data`; fsyncs: from a file's last write to its "
                "close; waiting for the peers: from rank 0's last write to the end of the slowest rank's.\n\n" +
                _md(["model", "save"] + [label for _, label in _PHASES], phases))
    return out


def soak_md(d: dict) -> str:
    rows = []
    for c in d["cadences"]:
        p = c["predicted"]
        n = len(c["goodput_runs"])
        rows.append([f"{c['every_steps']} steps", _f(c["interval_s"], 2, " s"), c["failures"],
                     ", ".join(f"{100 * g:.1f}" for g in c["goodput_runs"]) + " %", _pct(p["model"]),
                     f"{_pct(p['sim_mean'])}, {100 * p['sim_p5']:.1f}-{100 * p['sim_p95']:.1f} %",
                     f"{c['measured_vs_model']:.2f}", f"{c['runs_within_mc_5_95']} of {n}"])
    m = d["costs_median"]
    return (f"`python benchmarks/soak_goodput.py --rounds {d['rounds']}` ({d['when']}): {d['steps']} steps of "
            f"{d['step_s']:.3f} s (d_model {d['model']['d_model']}, {d['model']['n_layers']} layers), whole-job "
            f"SIGKILLs at Poisson times with a {d['mtbf_s']:g} s MTBF, relaunched at once; {d['rounds']} runs per "
            f"cadence. Medians over all runs: save stall {m['save_stall_s']:.3f} s, loop cost per save "
            f"{m['save_loop_cost_s']:.3f} s, restart {m['restart_s']:.1f} s. Predictions are per run, from that "
            f"run's own costs; the table gives their median. Plot: [soak_goodput.svg](soak_goodput.svg).\n\n" +
            _md(["checkpoint every", "interval", "failures, median", f"goodput measured ({d['rounds']} runs)",
                 "Daly's model, median of runs", "Monte Carlo, same horizon: mean, 5-95 %",
                 "measured / model, median", "runs inside 5-95 %"], rows))


def backend_md(d: dict) -> str:
    names = {"local": "local (`torchrun --standalone`)", "netns": "netns (namespace nodes, c10d rendezvous)",
             "docker": "docker (containers)"}
    rows = [[names.get(k, k), _f(r["setup_s"], 2, " s"), _f(r["first_step_s"], 2, " s"), _f(r["wall_s"], 2, " s"),
             _f(r["teardown_s"], 2, " s"), "" if k == "local" else f"+{r['extra_vs_local_s']:.2f} s",
             f"{r['wall_vs_local']:.2f}"] for k, r in d["results"].items()]
    t = d["trainer"]
    return (f"`python benchmarks/backend_startup.py --rounds {d['rounds']}` ({d['when']}, {d['cpus']} CPUs): the "
            f"same fault-free job (2 ranks, {t['max_steps']} steps, one checkpoint) on each backend, round-robin, "
            f"medians of {d['rounds']} rounds.\n\n" +
            _md(["backend", "set-up", "launch to 1st step", "launch to exit", "tear-down", "extra per launch",
                 "× local wall"], rows))


def slurm_md(d: dict) -> str:
    def cell(name: str, key: str) -> str:
        xs = [r[key] for r in d["runs"][name]]
        spread = f" ({min(xs):.2f}-{max(xs):.2f})" if len(xs) > 1 else ""
        return f"{d['median'][name][key]:.2f} s{spread}"

    rows = []
    for name in d["median"]:
        c = d["configs"][name]
        label = (f"cred_expire {c['cred_expire_s']} s, sched_interval {c['sched_interval_s']} s, "
                 f"KillWait {c['kill_wait_s']} s")
        rows.append([label, d["rounds"][name]] + [cell(name, k) for k in ("start_s", "first_submit_to_start_s",
                                                                          "requeue_to_restart_s", "submit_to_start_s",
                                                                          "stop_s")])
    extra = f" --default-rounds {d['rounds']['slurm_defaults']}" if "slurm_defaults" in d["rounds"] else ""
    return (f"`python benchmarks/slurm_cluster.py --rounds {d['rounds']['tuned']}{extra}` ({d['when']}, {d['cpus']} "
            f"CPUs, {d['slurm']}, auth/{d['auth']}): a fresh cluster each round (slurmctld and {d['nodes']} slurmd "
            f"on this host); jobs of {d['nodes']} nodes with one `srun` task per node, the first submitted as soon as "
            "every node is idle, requeued, cancelled, then a second one; a task has started when it has written its "
            "first line. Medians, the range over the rounds in brackets; 120 s and 60 s are Slurm's own "
            "cred_expire and sched_interval.\n\n" +
            _md(["settings", "rounds", "start (to every node idle)", "first sbatch to both tasks started",
                 "scontrol requeue to both tasks started again", "a later sbatch to both tasks started",
                 "stop (close, a job running)"], rows) + _slurm_trainer_md(d))


def _slurm_trainer_md(d: dict) -> str:
    tr = d.get("trainer")
    if not tr or not tr["runs"]:
        return ""

    def cell(key: str) -> str:
        xs = [r[key] for r in tr["runs"]]
        spread = f" ({min(xs):.2f}-{max(xs):.2f})" if len(xs) > 1 else ""
        return f"{tr['median'][key]:.2f} s{spread}"

    c = tr["config"]
    return (f"\n\nThe reference trainer as a Slurm job (`--trainer-rounds {len(tr['runs'])}`): 2 nodes of one rank, "
            f"{c['max_steps']} steps, a checkpoint every {c['ckpt_every_steps']}, a fresh cluster each round; the "
            "local launch is `torchrun --standalone` of the same job on this host in the same round (torch "
            "imported afresh, as on each Slurm node; the harness's warm agent is faster still). A step is "
            "reached when the trainer writes its trajectory record.\n\n" +
            _md(["sbatch to the end of step 1", "local torchrun to the end of step 1", "× local",
                 "scontrol requeue (after the step-4 commit) to the end of the requeued run's first step"],
                [[cell("trainer_submit_to_first_step_s"), cell("local_launch_to_first_step_s"),
                  f"× {tr['ratio_submit_to_local']:.2f}", cell("trainer_requeue_to_first_new_step_s")]]))


def fanout_md(d: dict) -> str:
    def cell(key: str) -> str:
        xs = [r[key] for r in d["runs"]]
        spread = f" ({min(xs):.1f}-{max(xs):.1f})" if len(xs) > 1 else ""
        return f"{d['median'][key]:.1f} s{spread}"

    loads = [r["load1_before"] for r in d["runs"]]
    n = d["nodes"]
    return (f"`python benchmarks/slurm_fanout.py --rounds {d['rounds']}` ({d['when']}, {d['cpus']} CPUs, "
            f"{d['slurm']}): the default suite's {len(d['scenarios'])} process-only scenarios on the local backend "
            f"({', '.join(d['scenarios'])}), a fresh `ckpt-chaos run` each time with the golden runs cached: "
            f"serially, with `-n {n}` (worker processes, the same rank budget), and as one Slurm job each on a "
            f"throwaway cluster of {n} nodes on this host (`--executor slurm`, its start and stop included); every "
            "run gave the scenarios' own verdicts. Medians, the range over the rounds in brackets; 1-minute load "
            f"average before the rounds {min(loads):.2f}-{max(loads):.2f}.\n\n" +
            _md(["rounds", "local, serial", f"local, -n {n}", f"--executor slurm, {n} nodes", "serial / slurm",
                 f"-n {n} / slurm"],
                [[d["rounds"], cell("serial_s"), cell("parallel_s"), cell("slurm_s"), f"× {d['speedup']:.2f}",
                  f"× {d['median']['parallel_s'] / d['median']['slurm_s']:.2f}"]]))


def remote_md(d: dict) -> str:
    u, on, off, r = d["upload_mb_s"], d["training"]["on"], d["training"]["off"], d["training"]["on_over_off"]
    mb = d["checkpoint_bytes"] / 1e6
    rows = [[f"upload of a {mb:.1f} MB checkpoint to moto, direct", f"{u['direct']:.1f} MB/s"],
            ["the same through the fault proxy, no toxic", f"{u['proxy']:.1f} MB/s (× {u['proxy_over_direct']:.2f})"],
            [f"training with uploads: hand-off to the uploader, {on['uploads']} checkpoints",
             f"{1000 * on['handoff_s']:.1f} ms in all"],
            ["median upload time of one checkpoint", f"{on['upload_s']:.2f} s"],
            ["median step time, uploads off / on",
             f"{1000 * off['step_s']:.0f} ms / {1000 * on['step_s']:.0f} ms (× {r['step_s']:.2f})"],
            ["median step right after a save, off / on", f"{1000 * off['step_after_save_s']:.0f} ms / "
             f"{1000 * on['step_after_save_s']:.0f} ms (× {r['step_after_save_s']:.2f})"],
            ["wall time of the run, off / on", f"{off['wall_s']:.1f} s / {on['wall_s']:.1f} s (× {r['wall_s']:.2f})"]]
    return (f"`python benchmarks/remote_upload.py --rounds {d['rounds']}` ({d['machine']['cpus']} CPUs): medians "
            f"of {d['rounds']} rounds, configurations alternating; training is 2 ranks, 16 steps, a checkpoint "
            f"every 2 steps.\n\n" + _md(["what", "figure"], rows))


def storage_md(d: dict) -> str:
    names = {"tmpfs": "tmpfs (bind mount)", "faultfs": "faultfs over tmpfs, no rule armed",
             "slow-sync": "faultfs, `slow` {bw:g} MiB/s + {lat:g} ms per write, synchronous save",
             "slow-async": "the same slow storage, `async_save`"}
    rows = []
    for k, r in d["results"].items():
        rows.append([names.get(k, k).format(bw=d["slow"]["bandwidth_mb_s"], lat=d["slow"]["latency_ms"]),
                     _f(r["stall_s_median"], 3, " s"), f"{r['stall_vs_tmpfs']:.2f}", _f(r["total_s_median"], 3, " s"),
                     f"{r['total_vs_tmpfs']:.2f}", r["saves"]])
    t = d["trainer"]
    return (f"`python benchmarks/storage_stall.py --rounds {d['rounds']}` ({d['when']}, {d['cpus']} CPUs): 2 ranks, "
            f"d_model {t['d_model']}, {t['n_layers']} layers, a checkpoint every {t['ckpt_every_steps']} steps, the "
            f"configurations round-robin, medians over every save.\n\n" +
            _md(["checkpoint directory on", "training stalled per save", "× tmpfs", "save committed after",
                 "× tmpfs", "saves"], rows))


def order_md(d: dict) -> str:
    rows = [[f"`{bug}`", _f(s["median"], 1), s["p90"], s["max"], s["not_within"],
             ", ".join(str(x) for x in s["seeds_0_1_2"])] for bug, s in d["summary"].items()]
    seeds = sorted(d["seeds"], key=int)
    bugs = list(d["summary"])
    per_seed = [[k] + [d["seeds"][k][b] if d["seeds"][k][b] is not None else "never" for b in bugs] for k in seeds]
    return (f"`python {d['command']}`: for each seed, the index (from 1) of the first schedule the generator "
            f"draws that composes the window each bug needs; no training (every schedule passes at once). "
            f"{len(seeds)} seeds.\n\n" +
            _md(["window of", "median", "90th pct", "max", "seeds never within", "seeds 0, 1, 2"], rows) +
            "\nPer seed:\n\n" + _md(["seed"] + [f"`{b}`" for b in bugs], per_seed))


def _search_rows(rows: list[dict]) -> list[list]:
    import statistics

    out = []
    for label in dict.fromkeys(r["trainer"] for r in rows):
        rs = sorted((r for r in rows if r["trainer"] == label), key=lambda r: r["seed"])
        found = [r for r in rs if r["found"]]
        budgets = sorted({f"{r['budget_s']:.0f} + {r['shrink_s']:.0f}" for r in rs if "budget_s" in r})
        med = statistics.median(r["time_to_find_s"] for r in found) if found else None
        run_s = sum(r["run_s"] for r in rs)
        out.append([f"`{label.removeprefix('tests.planted.')}`", ", ".join(budgets),
                    f"{len(found)} of {len(rs)} (seeds {', '.join(str(r['seed']) for r in rs)})",
                    ", ".join(sorted({r["identity"] for r in rs if r["identity"]})) or "nothing",
                    ", ".join(f"{r['time_to_find_s']:.0f}" if r["found"] else "–" for r in rs),
                    "–" if med is None else f"**{med:.0f} s**",
                    ", ".join(str(r["shrunk_faults"]) for r in found) or "–",
                    sum(r["schedules"] for r in rs), f"{60 * sum(r['schedules'] for r in rs) / max(1e-9, run_s):.1f}"])
    return out


def planted_md(d: dict) -> str:
    header = ["trainer [families]", "budget s (find + shrink)", "found in", "first failed check",
              "time to find, each search (s)", "median", "shrunk to (faults)", "schedules", "per minute"]
    rows = d["searches"]
    current = [r for r in rows if "(" not in r["trainer"]]
    old = [r for r in rows if "before a609fe9" in r["trainer"]]
    between = [r for r in rows if "(" in r["trainer"] and "before a609fe9" not in r["trainer"]]
    planned = [r for r in current if "faults_planned" in r]
    fired, total = sum(r["faults_fired"] for r in planned), sum(r["faults_planned"] for r in planned)
    sched, minutes = sum(r["schedules"] for r in current), sum(r["run_s"] for r in current) / 60
    text = ("One `ckpt-chaos explore` search per trainer and seed (`benchmarks/explore_planted.py`), stopped at its "
            "first finding, no example database. Time to find: from the start of the search (golden runs "
            "included) to the end of the first failing run. A label in parentheses names the code the search "
            "ran before (`before COMMIT`) or a budget other than its row's.\n\n"
            f"## The current generator and runner ({len(current)} searches)\n\n"
            "Labels without parentheses. " +
            (f"Faults that fired: {fired} of {total} planned ({100 * fired / total:.0f} %, shrink runs included). "
             if total else "") +
            f"Schedules: {sched} in {minutes:.0f} minutes of search ({sched / minutes:.1f} a minute).\n\n" +
            _md(header, _search_rows(current)) +
            f"\n## Between a609fe9 and the current generator ({len(between)} searches)\n\n" +
            _md(header, _search_rows(between)) +
            f"\n## Before a609fe9: the old generator ({len(old)} searches)\n\n" +
            "Random places, one hypothesis round whose size grew with the budget; some rows ran while other work "
            "shared the two cores.\n\n" + _md(header, _search_rows(old)) +
            "\n## Commands, in the order they ran\n\n" + "".join(f"* {c}\n" for c in d["commands"]))
    return text


def _launch_md(d: dict) -> str:
    phases = ("launcher", "imports", "process group", "model", "resume", "first step", "to first step", "teardown")
    header = ["launch", "launched by"] + list(phases)
    rows = []
    for launch in ("first", "relaunch"):
        for m, e in d["launchers"].items():
            cells = [f"{e[launch][p]['s']:.2f} s (×{e[launch][p]['x_import_torch']:.2f})" if p in e[launch] else ""
                     for p in phases]
            rows.append([launch if m == "torchrun" else "", m] + cells)
    ratios = ", ".join(f"{m}: first step × {r['first']:.2f}, relaunch × {r['relaunch']:.2f}"
                       for m, r in d["agent_over_torchrun"].items())
    return (f"`python benchmarks/launch_phases.py --rounds {d['rounds']}` ({d['machine']['cpus']} CPUs, Python "
            f"{d['machine']['python']}): the reference trainer on 2 ranks, a fresh launch killed after its step-4 "
            f"checkpoint and the relaunch that resumes from it, each launcher in turn, medians of {d['rounds']} "
            f"rounds of rank 0's phases; in brackets, the ratio to `python -c \"import torch\"` in the same run "
            f"({d['import_torch_s']:.2f} s). Time to the first (new) step against torchrun: {ratios}.\n\n"
            + _md(header, rows))


def _cost_md(d: dict) -> str:
    rows = [[m, f"{e['scenario_s']:.1f} s", f"× {e['scenario_x_import_torch']:.1f}",
             f"{e['explore_schedules_per_min']:.1f}" if "explore_schedules_per_min" in e else ""]
            for m, e in d["launchers"].items()]
    r = d["agent_over_torchrun"]
    return (f"`python benchmarks/scenario_cost.py --rounds {d['rounds']}"
            + (f" --explore-s {d['launchers']['agent'].get('explore_budget_s')}" if "explore_schedules_per_min" in r
               else "") +
            f"` ({d['machine']['cpus']} CPUs, Python {d['machine']['python']}): `ckpt-chaos run {d['scenario']}` "
            f"with its golden run cached, a fresh CLI process each time, and a search over process and storage "
            f"(seed 0), under each launcher in turn, medians of {d['rounds']} rounds; `import torch` took "
            f"{d['import_torch_s']:.2f} s. Agent against torchrun: scenario × {r['scenario']:.2f}"
            + (f", schedules a minute × {r['explore_schedules_per_min']:.2f}" if "explore_schedules_per_min" in r
               else "") + ".\n\n" + _md(["launcher", "one scenario", "× import torch", "search: schedules a minute"],
                                        rows))


def _probe_md(d: dict) -> str:
    def ms(v):
        return f"{v * 1e3:.3f} ms"

    cost = [[name, ms(e["step_s_without"]), ms(e["step_s_with"]), f"× {e['ratio']:.3f}",
             f"× {e['ratio_median_step']:.3f}" if "ratio_median_step" in e else "",
             ms(e["step_s_every_point"]), f"× {e['ratio_every_point']:.3f}"]
            for name, e in d["cost"].items()]
    out = (f"`{d['command']}` ({d['cpus']} CPUs, Python {d['python']}).\n\n"
           "**Step time, end to end.** Each example trainer (2 ranks) without the automatic probe layer, with it as "
           "a chaos run has it when no trigger names a per-step point (the trajectory recorded, state digests as "
           f"a scenario has them by default: every {d.get('digest_every', 4) or 'save and at exit'}), and with every per-step point sent to the controller (as in a golden run). A step timer loaded "
           "the same way in every arm times rank 0's optimizer steps; a run's step time is the mean interval after "
           "the warm-up, the table gives the median over the rounds (the arms' order rotating), and the ratio of the "
           "median step intervals too.\n\n"
           + _md(["trainer", "step without", "step with", "ratio (mean step)", "ratio (median step)",
                  "with every step point", "ratio"], cost))
    if "cpu" in d:
        rows = [[k.replace("digest_every_", "every ") if k != "digest_every_0" else "none",
                 f"{e['step_s_without'] * 1e6:.1f} µs", f"{e['step_s_with'] * 1e6:.1f} µs",
                 f"+{e['extra_s'] * 1e6:.1f} µs"] for k, e in d["cpu"].items()]
        out += ("\n\n**The layer's work per step, in one process.** The plain loop's model trained in one process "
                "(no collective to hide the layer's work behind), the layer switched on and off every 500 steps, "
                "40 times; medians.\n\n" + _md(["state digests", "step without", "step with", "extra per step"], rows))
    for key, what in (("precision", "`file.write` (the automatic probe layer), plain DDP loop"),
                      ("precision_faultfs", "`faultfs.write` (faultfs, for writers Python cannot see)")):
        if key not in d:
            continue
        p = d[key]
        prec = [[f"{r['fraction']:.1f}", f"{r['planned_bytes']} B", f"{r['on_disk_bytes']} B",
                 f"{r['landed']:.3f}" if r["landed"] is not None else "not reached"] for r in p["rows"]]
        out += (f"\n\nA SIGKILL at {what}, `min_fraction` f, of `{p['file']}`: bytes written against f of the "
                "size planned from the fault-free run.\n\n" + _md(["f", "planned", "written", "landed at"], prec))
    return out


def coverage_md(d: dict) -> str:
    cp = d["checkpoint_path"]
    out = (f"`{d['command']}` ({d['machine']['cpus']} CPUs, Python {d['machine']['python']}): "
           f"{d['scenarios']} scenarios ({', '.join(f'{n} {v}' for v, n in d['verdicts'].items())}), "
           "every rank, relaunch and uploader measured.\n\n"
           f"Checkpoint path: **{_pct(cp['line_percent'] / 100)} of lines** ({cp['statements'] - cp['missing']} of "
           f"{cp['statements']}), **{_pct(cp['branch_percent'] / 100)} of branches** ({cp['covered_branches']} of "
           f"{cp['branches']}).\n\n")
    out += _md(["file", "lines", "branches", "lines missed"],
               [[f"`{p}`", f"{f['percent']:.1f} %", f"{f['covered_branches']} of {f['branches']}", f["missing"]]
                for p, f in sorted(d["files"].items())])
    out += "\n\nLines no scenario reaches (reasons: `benchmarks/coverage_gaps.toml`):\n\n"
    out += _md(["file", "lines", "first line", "reason"],
               [[f"`{u['file']}`", f"{u['lines'][0]}" + (f"–{u['lines'][1]}" if u['lines'][1] != u['lines'][0] else ""),
                 f"`{u['code'][:60]}`", u["reason"] or "**none yet: a scenario to write**"] for u in d["unreached"]])
    return out


def mutation_md(d: dict) -> str:
    t = d["totals"]
    s = d["sample"]
    def score(c: dict) -> str:
        ci = c.get("score_ci95")
        return _pct(c["score"]) + (f" ({_pct(ci[0], 0)}–{_pct(ci[1], 0)})" if ci else "")

    def row(name: str, c: dict) -> list:
        return [name, score(c), c["killed"], c["survived"], c["not reached"], c["timeout"], c["error"],
                c["equivalent"], c["pending"], c["total"]]

    rows = [row(f"`{f}`", c) for f, c in [*d["files"].items(), ("all", t)]]
    ops = s.get("operators", "core")
    made_by = {"core": "cosmic-ray's mutants", "checkpoint": "the checkpoint operators' mutants "
               "(`ckpt_chaos/mutation/operators.py`)"}.get(ops, "cosmic-ray's and the checkpoint operators' mutants")
    cached = (f"; {d['mutants_cached']} verdicts taken from the cache (same mutated file, operator, trainer, harness and "
              "coverage)" if d.get("mutants_cached") else "")
    # --example NAME: the whole of the example's train.py, under its own scenarios
    what = (f"of `{s['files'][0]}` (the whole file), each against the scenarios of `{s['scenarios']}` (every "
            "suite) that pass unmutated and reach its line" if s.get("example") else
            "of the checkpoint path, each against the "
            # a baseline of named scenarios is scope.baseline_scenarios() (ckpt_chaos.mutation); one of a
            # suite, the default suite
            + ("scenarios of the default and mutation suites" if "/custom/" in d.get("baseline", "")
               else "default-suite scenarios") + " that reach its line")
    at = f" at {d['commit'][:7]}" if d.get("commit") else ""
    out = (f"`{d['command']}`{at} ({d['machine']['cpus']} CPUs, Python {d['machine']['python']}): {made_by} "
           f"{what}, cheapest first, to the first failure. Mutants: "
           + (f"those named ({len(s['named'])})" if s.get("named") else
              f"a sample of {s['limit']} (seed {s['seed']})" if s["limit"] else "all")
           + f" of the {s['to run'] + s['not reached'] + s['equivalent'] + s['not sampled'] + s.get('cached', 0)} in "
           f"scope; {d['mutants_run']} run{cached}, median {_f(d['median_mutant_s'], 0, ' s')} per mutant (killed "
           f"{_f(d.get('median_killed_s'), 0, ' s')}, survivors {_f(d.get('median_survived_s'), 0, ' s')}), "
           f"{_f(d['exec_wall_s'] / 60, 0, ' min')} in all. Score = killed / (total - equivalent); "
           "not reached, timed out and errors count as not killed; pending: not run before `--budget` ran out, "
           "left out of the score (docs/mutation.md)."
           + (" A sample's score is followed by its 95 % Wilson interval: where the score of all the mutants in "
              "scope lies." if t.get("score_ci95") else "") + "\n\n"
           + _md(["file", "score", "killed", "survived", "not reached", "timed out", "error", "equivalent", "pending",
                  "total"],
                 rows))
    if len(d.get("operators", {})) > 1 or ops != "core":
        out += "\n\nBy operator:\n\n" + _md(
            ["operator", "score", "killed", "survived", "not reached", "timed out", "error", "equivalent", "pending",
             "total"], [row(f"`{o}`", c) for o, c in d["operators"].items()])
    by = lambda *st: [m for m in d["mutants"] if m["status"] in st]
    killed = [[f"`{m['file']}:{m['line']}`", m["operator"].removeprefix("core/"), m["scenario"],
               ", ".join(m["checks"]) or "(the run's reason)", _f(m.get("wall_s"), 0, " s")] for m in by("killed")]
    if killed:
        out += "\n## Killed\n\n" + _md(["mutant", "operator", "scenario", "failing checks", "wall"], killed)
    for title, status in (("Survived", ("survived", "not reached", "timeout", "error")), ("Equivalent", ("equivalent",))):
        if not by(*status):
            continue
        out += f"\n## {title}\n"
        for m in by(*status):
            why = m.get("reason") or m["status"] + (f": ran {', '.join(m['ran'])}" if m.get("ran") else "")
            out += (f"\n`{m['file']}:{m['line']}` {m['operator'].removeprefix('core/')} "
                    f"(occurrence {m['occurrence']}): {why}\n\n```diff\n{m['diff']}\n```\n")
    return out


def _audit_md(d: dict) -> str:
    rows = [[str(i + 1), f"{r['discover_s']:.0f} s", f"{r['relaunch_s']:.0f} s", f"{r['suite_s']:.0f} s",
             f"{r['total_s']:.0f} s", f"{r['run']} of {r['cells']}", str(r["findings"]), f"{r['loadavg_start']:.1f}"]
            for i, r in enumerate(d["runs"])]
    m = d["median"]
    rows.append(["median", f"{m['discover_s']:.0f} s", f"{m['relaunch_s']:.0f} s", f"{m['suite_s']:.0f} s",
                 f"{m['total_s']:.0f} s", "", "", ""])
    return (f"`python benchmarks/audit_time.py --rounds {d['rounds']}` ({d['machine']['cpus']} CPUs, Python "
            f"{d['machine']['python']}): `{d['command']}` from an empty golden-run cache, timed from outside; the "
            "parts are those the audit records in its matrix.json: discovery (the fault-free run, twice, and the "
            "profile), the stop-and-relaunch run, the generated scenarios side by side with the matrix and the "
            "report. The load average at each round's start says how busy the machine was.\n\n"
            + _md(["round", "discovery", "stop and relaunch", "scenarios", "first matrix", "cells run", "findings",
                   "load at start"], rows))


TABLES = {
    "audit_time": ("The audit of the plain DDP example: command line to first matrix", _audit_md),
    "probe_layer": ("What the automatic probe layer costs, and where its faults land", _probe_md),
    "launch_phases": ("Where a launch's time goes", _launch_md),
    "scenario_cost": ("What one scenario and a search minute cost", _cost_md),
    "checkpoint_overhead": ("What checkpointing costs the reference trainer", overhead_md),
    "soak_goodput": ("Goodput under real failures against the model", soak_md),
    "backend_startup": ("What a multi-node backend adds per launch", backend_md),
    "slurm_cluster": ("A private Slurm cluster: start, job start, requeue, stop", slurm_md),
    "slurm_fanout": ("The process scenarios fanned out over a Slurm cluster, against a serial run", fanout_md),
    "remote_upload": ("The remote tier: upload throughput and training stall", remote_md),
    "storage_stall": ("Checkpoint stall on healthy, fault-layered and slow storage", storage_md),
    "explore_order": ("When the search first composes a narrow window", order_md),
    "explore_planted": ("The fault-schedule search against planted bugs", planted_md),
    "trainer_coverage": ("Which lines of the reference trainer's checkpoint path the suite reaches", coverage_md),
    "mutation": ("Mutation score of the checkpoint path under the scenarios", mutation_md),
    "mutation-checkpoint": ("Mutation score of the checkpoint path under the scenarios: checkpoint operators",
                            mutation_md),
    "mutation-all": ("Mutation score of the checkpoint path under the scenarios: every operator", mutation_md),
}


def write_tables(results: Path = RESULTS) -> list[Path]:
    """``results/NAME.md`` for each ``results/NAME.json`` that has a table writer; runs nothing."""
    written = []
    for name, (title, render) in TABLES.items():
        src = results / f"{name}.json"
        if not src.exists():
            continue
        md = _HEADER.format(src=f"`{src.name}`", title=title) + render(json.loads(src.read_text()))
        (results / f"{name}.md").write_text(md)
        written.append(results / f"{name}.md")
    # a run of an example's trainer (--example NAME) is named mutation-<operators>-<NAME>
    for src in sorted(results.glob("mutation-*-*.json")):
        d = json.loads(src.read_text())
        if src.stem in TABLES or not d.get("sample", {}).get("example"):
            continue
        title = (f"Mutation score of the {d['sample']['example']} example's trainer under its own scenarios: "
                 f"--operators {d['sample']['operators']}")
        (results / f"{src.stem}.md").write_text(_HEADER.format(src=f"`{src.name}`", title=title) + mutation_md(d))
        written.append(results / f"{src.stem}.md")
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "reports" / "bench"))
    ap.add_argument("--tables", action="store_true",
                    help="write benchmarks/results/*.md from benchmarks/results/*.json and nothing else")
    args = ap.parse_args()
    if args.tables:
        for path in write_tables():
            print(f"table: {path.relative_to(ROOT)}")
        return
    print(f"bench report: {build(Path(args.out))}")


if __name__ == "__main__":
    main()
