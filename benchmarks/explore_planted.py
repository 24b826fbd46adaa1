"""How fast the fault-schedule search finds each planted bug, how small it shrinks it, and what it
finds against the correct trainer in the same budget.

For each planted-bug trainer (with the process and storage families; process and topology for the
bug only a world-size change shows, remote alone for the uploader's), and each
seed: one search (``ckpt_chaos.search.explore.Search``, no example database, so nothing is remembered
between rounds) with a time budget for generation and one for shrinking, stopped at its first
finding. Recorded: whether it found the bug, the time from the start to the first failing run,
the fault count of the shrunk schedule, whether the written file reproduced, and the schedules
run. Then the reference trainer gets the same budget per seed: the figure that matters there is
zero findings, and its runs give the schedules per minute.

    .venv/bin/python benchmarks/explore_planted.py --seeds 0 1 2 --budget 600 --shrink 90
    .venv/bin/python benchmarks/explore_planted.py --table     # the README table, from the results file

Figures go to benchmarks/results/explore_planted.json (rewritten after every search, so a run
cut short keeps what it measured) and a table is printed.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ckpt_chaos.search.explore import Search

# Every planted checkpointing bug the other issues keep as tests (crashes_natively is not one: it is a
# crash of the runtime, which the runner retries).
PLANTED = ("rng_not_saved", "rng_not_restored", "loader_not_restored", "optimizer_not_restored",
           "latest_before_durable", "deletes_previous_before_commit", "rename_without_fsync",
           "save_swallows_enospc", "loader_trusts_newest", "loader_drops_ranks", "uploader_marks_durable_early")
DEFAULT_FAMILIES = ("process", "storage")
# A bug that only a relaunch on another world size shows is searched with the topology family.
FAMILIES = {"loader_drops_ranks": ("process", "topology"), "uploader_marks_durable_early": ("remote",)}
RESULTS = Path(__file__).resolve().parent / "results" / "explore_planted.json"


def one(module: str, families: tuple[str, ...], seed: int, budget: float, shrink: float, work: Path,
        golden: Path) -> dict:
    started = time.monotonic()
    out = work / f"{module.rsplit('.', 1)[-1]}-{'-'.join(families)}-{seed}"
    sm = Search(trainer_module=module, families=families, budget_s=budget, shrink_s=shrink, seed=seed, out=out,
                regressions=out / "found", golden_root=golden, database=None, max_findings=1).run()
    f = (sm.findings or sm.not_reproduced or [None])[0]
    label = module if families == DEFAULT_FAMILIES else f"{module} [{'+'.join(families)}]"
    return {"trainer": label, "families": list(families), "seed": seed, "budget_s": budget, "shrink_s": shrink, "found": bool(sm.findings), "identity": f.identity if f else None,
            "time_to_find_s": sm.first_failure_s, "shrunk_faults": f.faults if f else None,
            "reproduced": f.reproduced if f else None, "shrink_runs": f.shrink_runs if f else None,
            "schedules": sm.schedules, "nothing_new": sm.nothing_new, "faults_planned": sm.faults_planned,
            "faults_fired": sm.faults_fired, "run_s": sm.run_s,
            "wall_s": time.monotonic() - started, "error": sm.error}


def summarize(rows: list[dict]) -> dict:
    out = {}
    for module in dict.fromkeys(r["trainer"] for r in rows):
        rs = [r for r in rows if r["trainer"] == module]
        found = [r for r in rs if r["found"]]
        out[module] = {
            "searches": len(rs), "found": len(found),
            "median_time_to_find_s": statistics.median(r["time_to_find_s"] for r in found) if found else None,
            "max_shrunk_faults": max(r["shrunk_faults"] for r in found) if found else None,
            "identities": sorted({r["identity"] for r in rs if r["identity"]}),
            "budgets_s": sorted({f"{r['budget_s']:.0f} + {r['shrink_s']:.0f}" if 'budget_s' in r else '?' for r in rs}),
            "schedules": sum(r["schedules"] for r in rs),
            "schedules_per_minute": 60 * sum(r["schedules"] for r in rs) / max(1e-9, sum(r["run_s"] for r in rs)),
        }
    return out


def markdown(rows: list[dict]) -> str:
    """The README's table: one line per trainer label, each search's time to find in seed order."""
    lines = ["| trainer [families] | budget s (find + shrink) | found in | first failed check | time to find, each "
             "search (s) | median | shrunk to (faults) | schedules | per minute |", "|---" * 9 + "|"]
    for label, s in summarize(rows).items():
        rs = sorted((r for r in rows if r["trainer"] == label), key=lambda r: r["seed"])
        times = ", ".join(f"{r['time_to_find_s']:.0f}" if r["found"] else "–" for r in rs)
        med = "–" if s["median_time_to_find_s"] is None else f"**{s['median_time_to_find_s']:.0f} s**"
        shrunk = ", ".join(str(r["shrunk_faults"]) for r in rs if r["found"]) or "–"
        lines.append(f"| `{label.removeprefix('tests.planted.')}` | {', '.join(s['budgets_s'])} | {s['found']} of "
                     f"{s['searches']} (seeds {', '.join(str(r['seed']) for r in rs)}) | "
                     f"{', '.join(s['identities']) or 'nothing'} | {times} | {med} | {shrunk} | {s['schedules']} | "
                     f"{s['schedules_per_minute']:.1f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--budget", type=float, default=300, help="generation budget per search, seconds")
    p.add_argument("--shrink", type=float, default=180, help="shrinking budget per finding, seconds")
    p.add_argument("--bugs", nargs="*", default=list(PLANTED), help="planted trainers (tests/planted/NAME.py)")
    p.add_argument("--no-reference", action="store_true", help="skip the correct trainer's searches")
    p.add_argument("--reference", nargs="*", metavar="FAMILY+FAMILY",
                   help="the families the correct trainer is searched with (default: those of the bugs)")
    p.add_argument("--append", action="store_true", help="add to the searches already in the results file "
                   "(a benchmark run in parts)")
    p.add_argument("--table", action="store_true", help="print the results file's searches as the README's "
                   "markdown table and run nothing")
    args = p.parse_args()
    if args.table:
        print(markdown(json.loads(RESULTS.read_text())["searches"]))
        return 0
    work = Path(tempfile.mkdtemp(prefix="explore-bench-"))
    golden = work / "golden"
    rows: list[dict] = json.loads(RESULTS.read_text())["searches"] if args.append and RESULTS.exists() else []
    commands = (json.loads(RESULTS.read_text()).get("commands", []) if args.append and RESULTS.exists() else [])
    commands.append("benchmarks/explore_planted.py " + " ".join(sys.argv[1:]))
    searches = [(f"tests.planted.{b}", FAMILIES.get(b, DEFAULT_FAMILIES)) for b in args.bugs]
    if args.reference is not None:
        searches += [("reference_trainer", tuple(fam.split("+"))) for fam in args.reference]
    elif not args.no_reference:  # the correct trainer, with every set of families the bugs were searched with
        searches += [("reference_trainer", fam) for fam in dict.fromkeys(fam for _, fam in searches)]
    started = time.monotonic()
    for module, families in searches:
        for seed in args.seeds:
            r = one(module, families, seed, args.budget, args.shrink, work, golden)
            rows.append(r)
            print(f"{r['trainer']:<60} seed {seed}: {'found ' + r['identity'] if r['found'] else 'nothing found':<40} "
                  f"after {r['time_to_find_s'] or 0:6.0f}s, {r['shrunk_faults'] or '-'} fault(s), "
                  f"{r['schedules']} schedules, {r['wall_s']:.0f}s", flush=True)
            RESULTS.parent.mkdir(parents=True, exist_ok=True)
            RESULTS.write_text(json.dumps({
                "commands": commands,
                "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
                "budget_s": args.budget, "shrink_s": args.shrink, "seeds": args.seeds,
                "wall_s": time.monotonic() - started, "summary": summarize(rows), "searches": rows}, indent=1) + "\n")
    print()
    print(f"{'trainer':<60} {'found':>7} {'median find s':>14} {'max faults':>11} {'sched/min':>10}")
    for module, s in summarize(rows).items():
        med = "-" if s["median_time_to_find_s"] is None else f"{s['median_time_to_find_s']:.0f}"
        print(f"{module:<60} {s['found']:>3}/{s['searches']:<3} {med:>14} {s['max_shrunk_faults'] or '-':>11} "
              f"{s['schedules_per_minute']:>10.2f}")
    print(f"figures: {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
