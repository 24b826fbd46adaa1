"""Soak: the real trainer under random failures, its measured goodput beside the model's prediction.

For each checkpoint cadence, a job of ``--steps`` steps (2 ranks under torchrun) runs while the
whole job is SIGKILLed at the times of a Poisson process (exponential gaps, mean ``--mtbf-s`` of
wall time; the clock runs during restarts too, as in Daly's model) and relaunched at once, until
it finishes. Every round also runs the job once with no checkpoints and no failures: the step time
``s`` that the useful work is counted in.

Measured, per soak run:

* goodput = useful work / wall time, where useful work = ``(steps - 1) * s`` and the wall time runs
  from the first step record to the last (launch and exit of the job happen once whatever the
  failures, so they are left out on both sides);
* the costs the model takes, from the same run: the save stall ``C`` (median of the trainer's own
  ``stall_s``) and the restart cost ``R`` (kill to the first new step, less that step's ``s``; median
  over restarts that were not themselves killed); and the loop's actual cost per save (median step
  interval across a save, less one without), which ``C`` should explain.

Predicted, for each run from that run's own costs (the machine's load drifts during a soak): Daly's
closed form (``ckpt_chaos.report.goodput.expected_goodput``) at interval ``every * s`` with the injected MTBF,
and a Monte Carlo over the same finite horizon of useful work (mean, 5-95 %): one short run is a
sample from that spread, not its mean. ``--summarize-only`` recomputes them from the stored runs.

Rounds alternate cadences so machine drift hits them alike; figures are medians over rounds.

    python benchmarks/soak_goodput.py --rounds 3   # writes benchmarks/results/soak_goodput.json and .svg
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ckpt_chaos.report.goodput import Costs, expected_goodput, simulate
from ckpt_chaos.check.history import read_jsonl, trainer_events
from ckpt_chaos.env.launcher import launch, run_to_end
from ckpt_chaos.probe import ENV_ATTEMPT
from ckpt_chaos.run.runner import trainer_args

RESULTS = Path(__file__).parent / "results"
# The medium model of checkpoint_overhead.py: a 10.7 MB checkpoint, ~0.2 s steps on 2 cores.
MODEL = {"d_model": 128, "n_layers": 4, "dataset_size": 512, "global_batch": 16, "grad_accum": 2, "keep_last": 2,
         "collective_timeout_s": 30}


class Tail:
    """New records of a JSONL file as they are appended (a torn last line waits for its end)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, b""

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        return [json.loads(line) for line in lines if line.strip()]


def soak(work: Path, cfg: dict, mtbf_s: float, seed: int, timeout_s: float) -> dict:
    """Run the job to its end under Poisson whole-job kills; what happened, with wall-clock times."""
    rng = np.random.default_rng(seed)
    tail = Tail(work / "trajectory.jsonl")
    args = trainer_args({**cfg, "run_dir": str(work)})
    kills, first_records, records = [], [], []
    clock_start = next_fail = None
    deadline = time.time() + timeout_s
    attempt = 0
    while True:
        job = launch(work, 2, args, env={ENV_ATTEMPT: str(attempt)})
        first_records.append(None)
        killed = False
        try:
            while (rc := job.wait(0.02)) is None:
                now = time.time()
                for r in tail.read():
                    records.append(r)
                    first_records[-1] = first_records[-1] or r["t"]
                if clock_start is None and records:
                    clock_start = now
                    next_fail = now + rng.exponential(mtbf_s)
                # The clock stops with the last step: a kill during the final save would only redo it.
                if next_fail is not None and now >= next_fail and records[-1]["step"] < cfg["max_steps"]:
                    job.kill()
                    kills.append({"t": now, "step": records[-1]["step"] if records else 0})
                    next_fail = now + rng.exponential(mtbf_s)
                    killed = True
                    break
                if now > deadline:
                    raise SystemExit(f"soak run did not finish in {timeout_s:.0f} s; see {work / 'torchrun.log'}")
        finally:
            job.kill()
        records.extend(tail.read())
        if not killed:
            if rc != 0:
                raise SystemExit(f"the trainer failed on its own (exit {rc}); see {work / 'torchrun.log'}")
            break
        attempt += 1
    return {"clock_start": clock_start, "kills": kills, "first_records": first_records, "records": records}


def plain_step_s(work: Path, cfg: dict) -> float:
    """Seconds per step of the loop with no checkpoints and no failures (the unit of useful work)."""
    rc = run_to_end(work, 2, trainer_args({**cfg, "ckpt_every_steps": 0, "run_dir": str(work)}), timeout=900)
    if rc != 0:
        raise SystemExit(f"baseline run failed (exit {rc}); see {work / 'torchrun.log'}")
    recs = read_jsonl(work / "trajectory.jsonl")
    return (recs[-1]["t"] - recs[0]["t"]) / (len(recs) - 1)


def measure(work: Path, run: dict, every: int, steps: int, step_s: float) -> dict:
    recs, kills = run["records"], run["kills"]
    end = max(r["t"] for r in recs if r["step"] == steps)
    wall = end - run["clock_start"]
    # Restart cost: from a kill to the first step of the next launch, less that step's own work;
    # a restart that was itself killed has no first step and is left out (its cost shows in goodput).
    restarts = [first - kill["t"] - step_s for kill, first in zip(kills, run["first_records"][1:]) if first]
    stalls = [e["stall_s"] for e in trainer_events(work, "saved")]
    # The loop's own cost of a save: step intervals across a save against those without, same launch.
    by_attempt: dict[int, list[dict]] = {}
    for r in recs:
        by_attempt.setdefault(r.get("attempt", 0), []).append(r)
    across, plain = [], []
    for rows in by_attempt.values():
        for a, b in zip(rows, rows[1:]):
            if b["step"] == a["step"] + 1:
                (across if a["step"] % every == 0 else plain).append(b["t"] - a["t"])
    return {
        "every_steps": every, "interval_s": every * step_s, "wall_s": wall, "useful_s": (steps - 1) * step_s,
        "goodput": (steps - 1) * step_s / wall, "failures": len(kills), "launches": len(run["first_records"]),
        "steps_computed": len(recs), "steps_redone": len(recs) - steps,
        "save_stall_s": statistics.median(stalls), "restart_s": statistics.median(restarts) if restarts else None,
        "save_loop_cost_s": (statistics.median(across) - statistics.median(plain)) if across and plain else None,
        # Steps without a save in this run against the baseline's: whether the soak's own load slowed work.
        "step_s_in_run": statistics.median(plain) if plain else None,
    }


def predict(row: dict, mtbf_s: float, horizon_s: float, runs: int, seed: int) -> dict:
    costs = Costs(save=row["save_stall_s"], restart=row["restart_s"], mtbf=mtbf_s)
    sim = simulate(row["interval_s"], costs, horizon_s, runs=runs, seed=seed)
    return {"model": expected_goodput(row["interval_s"], costs), "sim_mean": sim.mean, "sim_p5": sim.p5,
            "sim_p95": sim.p95}


def summarize(rows: dict[int, list[dict]], step_s: float, args: argparse.Namespace) -> dict:
    """Medians per cadence, and the prediction for each run from that run's own costs: the load of
    the machine drifts during a soak, so costs pooled over runs would predict none of them well."""
    horizon = (args.steps - 1) * step_s
    all_rows = [r for rs in rows.values() for r in rs]
    pooled_restart = statistics.median(r["restart_s"] for r in all_rows if r["restart_s"] is not None)
    costs = {"save_stall_s": statistics.median(r["save_stall_s"] for r in all_rows), "restart_s": pooled_restart,
             "save_loop_cost_s": statistics.median(r["save_loop_cost_s"] for r in all_rows
                                                   if r["save_loop_cost_s"] is not None)}
    out = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "rounds": args.rounds, "steps": args.steps, "mtbf_s": args.mtbf_s, "step_s": step_s,
           "horizon_s": horizon, "model": MODEL, "costs_median": costs, "cadences": []}
    for i, (every, rs) in enumerate(rows.items()):
        for j, r in enumerate(rs):
            # A run with no restart that was not itself killed takes the pooled restart cost.
            r["predicted"] = predict({**r, "restart_s": r["restart_s"] or pooled_restart}, args.mtbf_s, horizon,
                                     args.mc_runs, args.seed + 100 * i + j)
            r["measured_vs_model"] = r["goodput"] / r["predicted"]["model"]
        med = {k: statistics.median(r[k] for r in rs if r[k] is not None) for k in rs[0]
               if k not in ("restart_s", "predicted", "measured_vs_model")}
        med["restart_s"] = statistics.median([r["restart_s"] for r in rs if r["restart_s"] is not None] or
                                             [pooled_restart])
        pred = {k: statistics.median(r["predicted"][k] for r in rs) for k in rs[0]["predicted"]}
        # Where the measured runs fall in the Monte Carlo's spread of one run, each against its own costs.
        within = sum(r["predicted"]["sim_p5"] <= r["goodput"] <= r["predicted"]["sim_p95"] for r in rs)
        out["cadences"].append({**med, "goodput_runs": [r["goodput"] for r in rs], "runs": rs, "predicted": pred,
                                "runs_within_mc_5_95": within,
                                "measured_vs_model": statistics.median(r["measured_vs_model"] for r in rs)})
    return out


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = out["costs_median"]
    costs = Costs(save=c["save_stall_s"], restart=c["restart_s"], mtbf=out["mtbf_s"])
    rows = out["cadences"]
    lo, hi = min(r["interval_s"] for r in rows) / 2, max(r["interval_s"] for r in rows) * 2
    xs = np.geomspace(lo, hi, 60)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.plot(xs, [expected_goodput(x, costs) * 100 for x in xs], label="model (Daly), median measured costs")
    for r in rows:
        ax.errorbar(r["interval_s"], r["predicted"]["sim_mean"] * 100, color="grey", capsize=4,
                    yerr=[[(r["predicted"]["sim_mean"] - r["predicted"]["sim_p5"]) * 100],
                          [(r["predicted"]["sim_p95"] - r["predicted"]["sim_mean"]) * 100]], fmt="s")
        ax.scatter([r["interval_s"]] * len(r["goodput_runs"]), [g * 100 for g in r["goodput_runs"]], color="#de2d26",
                   marker="x", zorder=3)
    ax.plot([], [], "s", color="grey", label="Monte Carlo over the run's horizon: mean, 5-95 %")
    ax.plot([], [], "x", color="#de2d26", label="measured, one point per soak run")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (s of training between saves)")
    ax.set_ylabel("goodput (%)")
    ax.set_title(f"soak: 2 ranks, MTBF {out['mtbf_s']:g} s, save {c['save_stall_s']:.3f} s, "
                 f"restart {c['restart_s']:.1f} s", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--every", default="2,20,120", help="cadences, in steps between checkpoints")
    ap.add_argument("--mtbf-s", type=float, default=20.0, help="mean wall time between injected failures")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mc-runs", type=int, default=2000)
    ap.add_argument("--out", default=str(RESULTS / "soak_goodput.json"))
    ap.add_argument("--summarize-only", action="store_true",
                    help="recompute the predictions and the plot from the runs stored in --out; no training")
    args = ap.parse_args()
    if args.summarize_only:
        stored = json.loads(Path(args.out).read_text())
        args.rounds, args.steps, args.mtbf_s = stored["rounds"], stored["steps"], stored["mtbf_s"]
        rows = {c["every_steps"]: c["runs"] for c in stored["cadences"]}
        write(summarize(rows, stored["step_s"], args), args)
        return
    cadences = [int(x) for x in args.every.split(",")]
    cfg = {**MODEL, "max_steps": args.steps, "warmup_steps": 4}
    rows: dict[int, list[dict]] = {e: [] for e in cadences}
    steps_s = []
    with tempfile.TemporaryDirectory(prefix="ckpt-chaos-soak-", dir=Path(__file__).resolve().parent.parent) as tmp:
        for rnd in range(args.rounds):
            steps_s.append(plain_step_s(Path(tmp) / f"plain-{rnd}", cfg))
            for i, every in enumerate(cadences):
                work = Path(tmp) / f"soak-{every}-{rnd}"
                seed = args.seed + 1000 * rnd + i
                run = soak(work, {**cfg, "ckpt_every_steps": every}, args.mtbf_s, seed, timeout_s=3600)
                row = measure(work, run, every, args.steps, steps_s[-1])
                rows[every].append(row)
                print(f"round {rnd + 1}/{args.rounds} every {every:>3} steps: goodput {row['goodput']:.1%}, "
                      f"{row['failures']} failures, {row['steps_redone']} steps redone, save stall "
                      f"{row['save_stall_s']:.3f} s, restart {row['restart_s'] or float('nan'):.2f} s, "
                      f"wall {row['wall_s']:.0f} s", flush=True)
    write(summarize(rows, statistics.median(steps_s), args), args)


def write(out: dict, args: argparse.Namespace) -> None:
    costs = out["costs_median"]
    RESULTS.mkdir(exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    plot(out, Path(args.out).with_suffix(".svg"))
    print(f"\nstep {out['step_s']:.3f} s, save stall {costs['save_stall_s']:.3f} s (loop cost per save "
          f"{costs['save_loop_cost_s']:.3f} s), restart {costs['restart_s']:.2f} s, MTBF {args.mtbf_s:g} s; "
          f"predictions per run from that run's own costs, medians here")
    print(f"{'every':>6} {'interval':>9} {'measured':>9} {'model':>7} {'MC mean':>8} {'MC 5-95 %':>13} {'meas/model':>10} "
          f"{'runs in MC 5-95 %':>17}")
    for c in out["cadences"]:
        p = c["predicted"]
        print(f"{c['every_steps']:>6} {c['interval_s']:>8.2f}s {c['goodput']:>9.1%} {p['model']:>7.1%} "
              f"{p['sim_mean']:>8.1%} {p['sim_p5']:>6.1%}-{p['sim_p95']:<6.1%} {c['measured_vs_model']:>10.2f} {c['runs_within_mc_5_95']:>8} of {len(c['runs'])}")
    print(f"figures: {args.out}  plot: {Path(args.out).with_suffix('.svg')}")


if __name__ == "__main__":
    main()
