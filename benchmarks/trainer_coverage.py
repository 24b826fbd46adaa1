"""Which lines of the reference trainer's checkpoint path a scenario suite reaches, and why the rest.

Runs ``ckpt-chaos run --coverage`` on a suite (or reads a stored run with ``--from``), and writes
``benchmarks/results/trainer_coverage.json``: line and branch coverage of the checkpoint path
(``ckpt_chaos.report.trainer_coverage.CHECKPOINT_PATH``), each file's figures, and every line no
scenario reaches, grouped in ranges, with the reason kept by hand in
``benchmarks/coverage_gaps.toml``, matched by a piece of the range's code (a range without one is
a scenario still to write).
``python benchmarks/report.py --tables`` renders it.

    python benchmarks/trainer_coverage.py                      # the default suite (make coverage)
    python benchmarks/trainer_coverage.py --from reports/default/latest
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GAPS = Path(__file__).parent / "coverage_gaps.toml"
OUT = Path(__file__).parent / "results" / "trainer_coverage.json"


def ranges(lines: list[int]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for n in sorted(lines):
        if out and n == out[-1][1] + 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return [(a, b) for a, b in out]


def reason_for(gaps: list[dict], path: str, code: list[str]) -> str | None:
    """The reason kept for a range of unreached lines: a gap of the same file whose ``match`` text is
    in one of its lines (text, not line numbers, so that an edit elsewhere in the file keeps it)."""
    return next((g["reason"] for g in gaps if path.endswith(g["file"]) and any(g["match"] in c for c in code)), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", default="default")
    ap.add_argument("--from", dest="stored", metavar="DIR", help="a suite run made with --coverage")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    command = f"ckpt-chaos run --suite {args.suite} --coverage"
    if args.stored:
        run = Path(args.stored).resolve()
    else:
        out = ROOT / "reports"
        subprocess.run([sys.executable, "-m", "ckpt_chaos.cli", "run", "--suite", args.suite, "--coverage",
                        "--reports", str(out)], check=False, cwd=ROOT)
        run = (out / args.suite / "latest").resolve()
    summary = json.loads((run / "coverage" / "summary.json").read_text())
    results = json.loads((run / "results.json").read_text())
    gaps = tomllib.loads(GAPS.read_text()).get("gap", []) if GAPS.exists() else []
    unreached = []
    for path, m in sorted(summary["missing"].items()):
        text = (ROOT / path).read_text().splitlines() if (ROOT / path).exists() else []
        for first, last in ranges(m["lines"]):
            code = text[first - 1:last]
            unreached.append({"file": path, "lines": [first, last], "code": code[0].strip() if code else "",
                              "reason": reason_for(gaps, path, code)})
    data = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "command": command,
            "suite": results["suite"], "scenarios": len(results["results"]),
            "verdicts": {v: sum(1 for r in results["results"] if r["verdict"] == v)
                         for v in sorted({r["verdict"] for r in results["results"]})},
            "checkpoint_path": summary["checkpoint_path"],
            "files": {p: f for p, f in summary["files"].items()
                      if any(p.endswith(k) for k in ("checkpoint.py", "layout.py", "state.py", "remote.py", "train.py"))},
            "unreached": unreached}
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    cp = data["checkpoint_path"]
    print(f"checkpoint path under {data['suite']} ({data['scenarios']} scenarios): lines {cp['line_percent']:.1f} %, "
          f"branches {cp['branch_percent']:.1f} %; {len(unreached)} unreached range(s), "
          f"{sum(1 for u in unreached if u['reason'] is None)} without a reason; {args.out}")


if __name__ == "__main__":
    main()
