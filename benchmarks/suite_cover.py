"""What a suite covers, and at what cost, from a stored suite run (no training, seconds).

The default suite must exercise every fault family, fault kind, check and setup at least once
(``ckpt_chaos/check/coverage.py``; ``tests/test_suites.py`` holds it to that from the scenario
files alone). This prints, from the verdicts and wall times of a stored run (a full one, best):

* for each check, the scenarios of the run that gave it a verdict (not n/a), and those of the suite;
* every verdict a coverage rule promises that the run did not give: a rule to correct;
* the suite's summed wall time against the run's;
* with ``--greedy``, the cheapest covering set that a greedy weighted set cover finds (scenarios
  missing from the run are weighed at the run's median), to start from when the suite is revised.

``--recheck`` first runs today's checkers over the stored run directories, for runs stored before
a check changed (the verdicts n/a, for one, came after some runs).

    .venv/bin/python benchmarks/suite_cover.py reports/full/latest --recheck --greedy
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

from ckpt_chaos.check import coverage
from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.scenario import Scenario, catalogue


def check_of(c: dict) -> str:
    """The check a verdict is of; rows stored before checks carried it have only the shown name."""
    if c.get("check"):
        return c["check"]
    name = c["name"].split("@")[0]
    m = re.fullmatch(r"fault_\d+_(.+)", name)
    return f"fault_{m.group(1)}" if m else name


def rows(run: Path, scenarios: dict[str, Scenario], recheck: bool) -> list[dict]:
    out = json.loads((run / "results.json").read_text())["results"]
    if recheck:
        from ckpt_chaos.run.runner import evaluate

        for r in out:
            d = run / r["scenario"]
            if r["scenario"] in scenarios and (d / "history.jsonl").exists():
                r["checks"] = evaluate(scenarios[r["scenario"]], d, (d / "golden").resolve()).checks
    return out


def greedy(scenarios: dict[str, Scenario], wall: dict[str, float]) -> list[str]:
    """Regressions (they stay in default) and the only scenario to cover an item first, then the
    scenario with the least wall time per item still uncovered; finally drop any scenario the rest
    covers without it."""
    median = statistics.median(wall.values())
    cost = {n: wall.get(n, median) for n in scenarios}
    items = {n: coverage.items_of(s) for n, s in scenarios.items()}
    left = coverage.universe(scenarios.values())
    regressions = builtin_scenarios() / "regressions"
    chosen = [n for n, s in scenarios.items() if Path(s.source).resolve().is_relative_to(regressions)]
    chosen += sorted({ns[0] for ns in coverage.coverage(scenarios.values()).values() if len(ns) == 1} - set(chosen))
    left -= set().union(set(), *(items[n] for n in chosen))
    while left:
        best = min((n for n in sorted(scenarios) if n not in chosen and items[n] & left),
                   key=lambda n: cost[n] / len(items[n] & left))
        chosen.append(best)
        left -= items[best]
    for n in sorted(chosen, key=cost.get, reverse=True):
        if not Path(scenarios[n].source).resolve().is_relative_to(regressions) and \
                coverage.universe(scenarios.values()) <= set().union(*(items[m] for m in chosen if m != n)):
            chosen.remove(n)
    return sorted(chosen)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a stored suite run directory (holding results.json)")
    ap.add_argument("--suite", default="default", help="the suite to report on (default: default)")
    ap.add_argument("--recheck", action="store_true", help="re-run today's checkers over the stored runs first")
    ap.add_argument("--greedy", action="store_true", help="print a cheap covering set")
    args = ap.parse_args()

    scenarios = {s.name: s for s in catalogue(builtin_scenarios())}
    suite = {n for n, s in scenarios.items() if args.suite in s.suites}
    results = rows(args.run, scenarios, args.recheck)
    wall = {r["scenario"]: r["wall_s"] for r in results}
    gave: dict[str, set[str]] = {}
    for r in results:
        for c in r["checks"]:
            if c["verdict"] != "n/a":
                gave.setdefault(check_of(c), set()).add(r["scenario"])

    print(f"{'check':<26} {'run':>4} {args.suite:>8}  cheapest in {args.suite} (wall s)")
    for check in sorted(set(coverage.emitted_checks()) | set(gave)):
        mine = sorted(gave.get(check, set()) & suite, key=wall.get)
        cheapest = f"{mine[0]} ({wall[mine[0]]:.0f})" if mine else "-- not exercised in this run"
        print(f"{check:<26} {len(gave.get(check, ())):>4} {len(mine):>8}  {cheapest}")

    print("\nverdicts a coverage rule promises that the run did not give:")
    broken = [(r["scenario"], sorted(coverage.checks_of(scenarios[r["scenario"]])
                                     - {check_of(c) for c in r["checks"] if c["verdict"] != "n/a"}))
              for r in results if r["scenario"] in scenarios and r["verdict"] in ("pass", "xfail")]
    print("\n".join(f"  {n}: {', '.join(cs)}" for n, cs in broken if cs) or "  none")

    ran = [n for n in sorted(suite) if n in wall]
    print(f"\nsuite {args.suite}: {len(suite)} scenarios, {sum(wall[n] for n in ran):.0f} s summed over the "
          f"{len(ran)} in the run (the run: {len(results)} scenarios, {sum(wall.values()):.0f} s)"
          + (f"; not in the run: {', '.join(sorted(suite - set(wall)))}" if suite - set(wall) else ""))
    if args.greedy:
        pick = greedy(scenarios, wall)
        print(f"\ngreedy cover: {len(pick)} scenarios, {sum(wall.get(n, 0) for n in pick):.0f} s summed over "
              f"those in the run")
        for n in pick:
            print(f"  {n:<46} {wall[n]:>5.0f}" if n in wall else f"  {n:<46}  (not in the run)")


if __name__ == "__main__":
    main()
