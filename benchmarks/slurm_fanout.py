"""What fanning the scenarios out over a Slurm cluster saves: ``run --executor slurm`` against a local serial run.

The default suite's process-only scenarios (those ``ckpt-chaos list --suite default`` labels with the
process family alone) less those on the slurm backend, which run in the harness either way, so they
would add the same time to both columns; each run as a user runs it, a fresh CLI process each time,
with the golden runs cached by an untimed first run:

* ``serial_s``: ``ckpt-chaos run NAMES`` (one at a time, on this machine);
* ``parallel_s``: ``ckpt-chaos run NAMES -n N``: the same machine's worker processes under the same
  rank budget, for scale: what the Slurm layer costs over a local parallel run;
* ``slurm_s``: ``ckpt-chaos run NAMES --executor slurm --slurm-nodes N``: a throwaway cluster of N
  nodes on this host, started and stopped inside the timed run, one job per scenario.

The order of the three turns by one each round, so a drift in the machine's load falls on all. Each
run's verdicts are recorded; a run whose verdicts differ from the scenarios' own (pass, or xfail for a
known failure) stops the benchmark: a faster wrong answer is no figure. Figures are medians over the
rounds; the 1-minute load average before each round is kept, since another process on the machine
slows every column.

    python benchmarks/slurm_fanout.py --rounds 3   # benchmarks/results/slurm_fanout.json and .md
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

from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.env.slurm import missing, version
from ckpt_chaos.run.fanout import nested
from ckpt_chaos.scenario import load

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
CLI = [sys.executable, "-m", "ckpt_chaos.cli"]


def process_scenarios() -> list:
    found = [load(p) for p in builtin_scenarios().rglob("*.toml")]
    return sorted((s for s in found if "default" in s.suites and s.families == ["process"] and not nested(s)),
                  key=lambda s: s.name)


def timed_run(names: list[str], extra: list[str], work: Path, golden: Path) -> tuple[float, dict]:
    t = time.monotonic()
    p = subprocess.run([*CLI, "run", *names, *extra, "--json", "--plots", "none", "--reports", str(work),
                        "--golden-dir", str(golden)], cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t
    try:
        data = json.loads(p.stdout)
    except ValueError:
        raise SystemExit(f"ckpt-chaos run {' '.join(extra)} gave no results (exit {p.returncode}):\n"
                         f"{p.stderr[-3000:]}") from None
    return wall, {r["scenario"]: r["verdict"] for r in data["results"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=2, help="nodes of the throwaway cluster")
    ap.add_argument("--out", default=str(RESULTS / "slurm_fanout.json"))
    args = ap.parse_args()
    if why := missing():
        raise SystemExit(f"cannot run a Slurm cluster here: {why}")
    chosen = process_scenarios()
    names = [s.name for s in chosen]
    want = {s.name: "xfail" if s.expect.known_failure else "pass" for s in chosen}
    slurm = ["--executor", "slurm", "--slurm-nodes", str(args.nodes)]
    runs = []
    with tempfile.TemporaryDirectory(prefix="ckpt-chaos-bench-fanout-") as tmp:
        golden = Path(tmp) / "golden"
        warm, verdicts = timed_run(names, [], Path(tmp) / "warm", golden)  # computes and caches the goldens
        print(f"warm-up (golden runs): {warm:.1f}s", flush=True)
        for r in range(args.rounds):
            load1 = os.getloadavg()[0]
            order = [("serial", []), ("parallel", ["-n", str(args.nodes)]), ("slurm", slurm)]
            order = order[r % 3:] + order[:r % 3]
            row = {"load1_before": load1}
            for label, extra in order:
                wall, verdicts = timed_run(names, extra, Path(tmp) / f"{label}-{r}", golden)
                if verdicts != want:
                    raise SystemExit(f"round {r + 1}, {label}: verdicts {verdicts}, not the scenarios' own {want}")
                row[f"{label}_s"] = wall
            runs.append(row)
            print(f"round {r + 1}: serial {row['serial_s']:.1f}s, -n {args.nodes} {row['parallel_s']:.1f}s, "
                  f"slurm {row['slurm_s']:.1f}s (load {load1:.2f})", flush=True)
    median = {k: statistics.median(x[k] for x in runs) for k in ("serial_s", "parallel_s", "slurm_s")}
    out = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": platform.node(),
           "cpus": os.cpu_count(), "slurm": version(), "nodes": args.nodes, "rounds": args.rounds,
           "scenarios": names, "verdicts": want, "warm_up_s": warm, "runs": runs, "median": median,
           "speedup": median["serial_s"] / median["slurm_s"]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    import report  # benchmarks/report.py: the one place that renders the results' tables

    title, render = report.TABLES["slurm_fanout"]
    md = Path(args.out).with_suffix(".md")
    md.write_text(report._HEADER.format(src=f"`{Path(args.out).name}`", title=title) + render(out))
    print(f"\nserial {median['serial_s']:.1f}s, -n {args.nodes} {median['parallel_s']:.1f}s, slurm "
          f"{median['slurm_s']:.1f}s: serial / slurm x{out['speedup']:.2f}\n"
          f"written to {args.out} and {md}")


if __name__ == "__main__":
    main()
