"""How long ``ckpt-chaos audit`` takes a user from a command line to a first matrix: the plain DDP example.

Each round runs one ``ckpt-chaos audit -n JOBS`` from an empty golden-run cache, timed from outside
(``total_s``), and takes the parts the audit records in its ``matrix.json``:

* ``discover_s``: the trainer's fault-free run (twice, to tell a trainer that is not deterministic)
  under the probe layer and fanotify, and its profile;
* ``relaunch_s``: the stop-and-relaunch run (every rank killed between two saves, then relaunched);
* ``suite_s``: the generated scenarios side by side, the matrix and the report.

Figures are medians over ``--rounds``; the machine's CPU count and the load average at the start of
each round are kept beside them, since a loaded machine stretches every part.

    python benchmarks/audit_time.py --rounds 3   # writes benchmarks/results/audit_time.json (.md: report.py --tables)
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

ROOT = Path(__file__).resolve().parents[1]
ARGV = ["examples/plain_ddp/train.py", "--ckpt-dir", "{ckpt_dir}", "--steps", "12", "--save-every", "4"]


def audit(*args: str, timeout: float) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "ckpt_chaos.cli", "audit", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=timeout)
    return time.monotonic() - started, p


def one_round(work: Path, jobs: str, timeout: float) -> dict:
    out = work / "out"
    load = os.getloadavg()[0]
    total_s, p = audit("-n", jobs, "--golden-dir", str(work / "golden"), "--out", str(out), "--json", "--", *ARGV,
                       timeout=timeout)
    if p.returncode not in (0, 1):  # 1: findings, still a matrix
        raise SystemExit(f"audit failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    phases = json.loads((out / "matrix.json").read_text())["phases"]
    cells = json.loads(p.stdout)["cells"]
    return {"discover_s": phases["fault_free_and_profile_s"], "relaunch_s": phases["stop_and_relaunch_s"],
            "suite_s": phases["scenarios_s"], "total_s": total_s, "cells": len(cells),
            "run": sum(c["verdict"] != "left out" for c in cells),
            "findings": sum(c["verdict"] in ("fail", "xpass", "unknown", "error") for c in cells),
            "loadavg_start": load}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", "--jobs", default="auto", help="the audit's scenarios side by side (default auto)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per audit command")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "audit_time.json"))
    args = ap.parse_args()
    rounds = []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="ckpt-chaos-bench-audit-") as tmp:
            rounds.append(one_round(Path(tmp), args.jobs, args.timeout))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                                          for k, v in rounds[-1].items()), flush=True)
    keys = ("discover_s", "relaunch_s", "suite_s", "total_s")
    out = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "command": "ckpt-chaos audit -n " + args.jobs + " -- " + " ".join(ARGV), "rounds": args.rounds,
           "median": {k: statistics.median(x[k] for x in rounds) for k in keys}, "runs": rounds}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    m = out["median"]
    print(f"\nmedian of {args.rounds}: discovery {m['discover_s']:.0f} s, stop and relaunch {m['relaunch_s']:.0f} s, "
          f"scenarios {m['suite_s']:.0f} s, first matrix {m['total_s']:.0f} s; written to {args.out}")


if __name__ == "__main__":
    main()
