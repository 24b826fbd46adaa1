"""What a multi-node backend adds to a scenario: start-up and tear-down against the local launcher.

Each backend runs the same short fault-free job (reference trainer, 2 ranks, 4 steps, one
checkpoint) and is timed in four parts:

* ``setup_s``: making the nodes' world (Docker: network; netns: namespaces, veths, bridge);
* ``first_step_s``: from the launch call to the first trajectory record (rendezvous, process
  group, model and data set-up, one step);
* ``wall_s``: from the launch call to the job's exit;
* ``teardown_s``: removing containers, volumes, network or namespaces.

Backends run round-robin, ``--rounds`` times, so drift of the machine hits all of them alike;
figures are medians, ratios are against ``local`` from the same run.

    python benchmarks/backend_startup.py --rounds 5   # writes benchmarks/results/backend_startup.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ckpt_chaos.env import cluster
from ckpt_chaos.check.history import trajectory
from ckpt_chaos.env.launcher import launch
from ckpt_chaos.run.runner import trainer_args

TRAINER = {"max_steps": 4, "warmup_steps": 1, "ckpt_every_steps": 4, "dataset_size": 96, "global_batch": 16, "grad_accum": 2,
           "collective_timeout_s": 30}
BACKENDS = ("local", "netns", "docker")


def one_run(work: Path, backend: str) -> dict:
    run_dir = work / f"{backend}-{time.time_ns()}"
    run_dir.mkdir(parents=True)
    args = trainer_args({**TRAINER, "run_dir": str(run_dir)})
    t0 = time.monotonic()
    nodes = None if backend == "local" else cluster.Cluster(run_dir, backend, 1, 2, timeout_s=30)
    t1 = time.monotonic()
    started = time.time()
    job = None
    try:
        job = launch(run_dir, 2, args) if nodes is None else \
            nodes.launch(0, 2, "reference_trainer", args, controller=None, env={})
        rc = job.wait(300)
        ended = time.time()
    finally:
        t2 = time.monotonic()
        if job is not None:
            job.kill()  # containers: logs kept, then removed
        if nodes is not None:
            nodes.close()
        t3 = time.monotonic()
    if rc != 0:
        raise SystemExit(f"{backend}: the job failed (exit {rc}); see {run_dir}")
    first = trajectory(run_dir)[1]["t"]
    return {"setup_s": t1 - t0, "first_step_s": first - started, "wall_s": ended - started, "teardown_s": t3 - t2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "backend_startup.json"))
    args = ap.parse_args()
    backends = [b for b in BACKENDS if b == "local" or cluster.missing(b) is None]
    for b in set(BACKENDS) - set(backends):
        print(f"SKIPPED {b}: {cluster.missing(b)}", file=sys.stderr)
    runs: dict[str, list[dict]] = {b: [] for b in backends}
    with tempfile.TemporaryDirectory(prefix="ckpt-chaos-bench-", dir=str(Path(__file__).parent.parent / "runs")
                                     if (Path(__file__).parent.parent / "runs").is_dir() else None) as tmp:
        for r in range(args.rounds):
            for b in backends:
                runs[b].append(one_run(Path(tmp), b))
                print(f"round {r + 1}/{args.rounds} {b}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs[b][-1].items()),
                      flush=True)
    keys = ("setup_s", "first_step_s", "wall_s", "teardown_s")
    rows = {b: {k: statistics.median(x[k] for x in rs) for k in keys} for b, rs in runs.items()}
    for row in rows.values():
        row["total_s"] = sum(row[k] for k in ("setup_s", "wall_s", "teardown_s"))
    base = rows["local"]
    for row in rows.values():
        row["extra_vs_local_s"] = row["total_s"] - base["total_s"]
        row["wall_vs_local"] = row["wall_s"] / base["wall_s"]
    out = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": platform.node(),
           "cpus": os.cpu_count(), "rounds": args.rounds, "trainer": TRAINER, "results": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"\n{'backend':<8} {'setup s':>8} {'1st step s':>11} {'wall s':>8} {'teardown s':>11} {'extra s':>8} "
          f"{'x local':>8}")
    for b, row in rows.items():
        print(f"{b:<8} {row['setup_s']:>8.2f} {row['first_step_s']:>11.2f} {row['wall_s']:>8.2f} "
              f"{row['teardown_s']:>11.2f} {row['extra_vs_local_s']:>8.2f} {row['wall_vs_local']:>8.2f}")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
