"""What one scenario and one search minute cost, torchrun against the forking agent, side by side.

Each round measures ``python -c "import torch"`` (the floor), then, for each launcher
(``CKPT_CHAOS_LAUNCHER``), the wall time of ``ckpt-chaos run kill-rank1-mid-shard-write`` as a user
runs it (a fresh CLI process; the golden run is cached by a first, untimed run). With
``--explore-s S``, each round also runs ``ckpt-chaos explore`` over the process and storage
families for S seconds (seed 0, no database) under each launcher and counts its schedules.
Figures are medians over the rounds, ratios against the floor and against torchrun.

    python benchmarks/scenario_cost.py --rounds 3 --explore-s 300   # writes benchmarks/results/scenario_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "ckpt_chaos.cli"]
SCENARIO = "kill-rank1-mid-shard-write"
LAUNCHERS = ("torchrun", "agent")


def timed(cmd: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    t = time.monotonic()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    return time.monotonic() - t, p


def scenario_s(work: Path, launcher: str, cache: Path) -> float:
    env = {**os.environ, "CKPT_CHAOS_LAUNCHER": launcher, "CKPT_CHAOS_CACHE": str(cache)}
    wall, p = timed([*CLI, "run", SCENARIO, "--out", str(work), "--json"], env)
    if p.returncode != 0:
        raise SystemExit(f"{launcher}: {SCENARIO} did not pass (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return wall


def explore_schedules(work: Path, launcher: str, cache: Path, budget_s: int) -> dict:
    env = {**os.environ, "CKPT_CHAOS_LAUNCHER": launcher, "CKPT_CHAOS_CACHE": str(cache)}
    out = work / f"explore-{launcher}-{time.time_ns()}"
    wall, p = timed([*CLI, "explore", "--budget", f"{budget_s}s", "--shrink-budget", "0s", "--seed", "0",
                     "--no-database", "--families", "process,storage", "--out", str(out)], env)
    summary = json.loads(next(out.rglob("summary.json")).read_text())
    return {"schedules": summary["schedules"], "schedules_per_min": summary["schedules_per_minute"],
            "wall_s": wall, "findings": [f.get("check") or f.get("identity") or str(f)[:80]
                                         for f in summary["findings"]], "exit": p.returncode}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--explore-s", type=int, default=0, help="also a search of this many seconds per launcher")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scenario_cost.json"))
    args = ap.parse_args()
    floor: list[float] = []
    runs: dict[str, list[float]] = {m: [] for m in LAUNCHERS}
    searches: dict[str, list[dict]] = {m: [] for m in LAUNCHERS}
    with tempfile.TemporaryDirectory(prefix="ckpt-chaos-cost-") as tmp:
        work, cache = Path(tmp), Path(tmp) / "cache"
        scenario_s(work, "agent", cache)  # the golden run, cached for every launcher (same key)
        for r in range(args.rounds):
            floor.append(timed([sys.executable, "-c", "import torch"], dict(os.environ))[0])
            for m in LAUNCHERS:
                runs[m].append(scenario_s(work, m, cache))
                print(f"round {r + 1}/{args.rounds}: import torch {floor[-1]:.2f} s, {SCENARIO} under {m} "
                      f"{runs[m][-1]:.1f} s", flush=True)
            if args.explore_s:
                for m in LAUNCHERS:
                    searches[m].append(explore_schedules(work, m, cache, args.explore_s))
                    x = searches[m][-1]
                    print(f"round {r + 1}/{args.rounds}: explore under {m}: {x['schedules']} schedules, "
                          f"{x['schedules_per_min']:.1f}/min", flush=True)
    torch_s = statistics.median(floor)
    out = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "rounds": args.rounds,
           "import_torch_s": torch_s, "scenario": SCENARIO, "launchers": {}}
    for m in LAUNCHERS:
        s = statistics.median(runs[m])
        entry = {"scenario_s": s, "scenario_x_import_torch": s / torch_s}
        if searches[m]:
            per_min = [x["schedules_per_min"] for x in searches[m]]
            entry.update(explore_budget_s=args.explore_s, explore_schedules_per_min=statistics.median(per_min),
                         explore_runs=searches[m])
        out["launchers"][m] = entry
    a, t = out["launchers"]["agent"], out["launchers"]["torchrun"]
    out["agent_over_torchrun"] = {"scenario": a["scenario_s"] / t["scenario_s"]}
    if args.explore_s:
        out["agent_over_torchrun"]["explore_schedules_per_min"] = (a["explore_schedules_per_min"]
                                                                   / t["explore_schedules_per_min"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("import_torch_s", "agent_over_torchrun")}, indent=1))


if __name__ == "__main__":
    main()
