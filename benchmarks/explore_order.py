"""How many schedules the fault-schedule search runs before it first composes the fault a
narrow-window planted bug needs, computed from the generator alone (no training, seconds).

Generation does not depend on what a run finds (until a failure, which stops a benchmark search),
so the order in which a seed's schedules come is a property of the generator: this runs the real
``Search`` with a runner that passes every schedule at once, and records for each seed the index of
the first schedule that holds

* a crash (kill, stop, power cut) of rank 0 at ``ckpt.fsync`` or ``ckpt.manifest``: the window
  ``latest_before_durable`` needs (its `latest` moved before the rename);
* an I/O error on a shard's write or fsync, or on opening ``.metadata``: the save error that
  ``save_swallows_enospc`` swallows (a full disk does not show it: the manifest write fails too).

Multiplied by the seconds a schedule takes here (``explore_planted.json``), it says which budget
makes a search find each bug; the timed searches are the proof.

    .venv/bin/python benchmarks/explore_order.py --seeds 40
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from ckpt_chaos.search.explore import Search
from ckpt_chaos.run.runner import Result

RESULTS = Path(__file__).resolve().parent / "results" / "explore_order.json"
WINDOWS = {
    "latest_before_durable": lambda f: (f.kind in ("kill", "stop", "power_loss") and f.target != "rank:1"
                                        and f.when.point in ("ckpt.fsync", "ckpt.manifest")),
    "save_swallows_enospc": lambda f: (f.kind == "errno" and (f.params.call in ("write", "fsync")
                                                             or ".metadata" in (f.params.path or ""))),
}


class _Enough(BaseException):
    """Stops a search once it has run enough schedules (a BaseException: hypothesis lets it through)."""


def first_schedules(seed: int, schedules: int, budget_s: float) -> dict[str, int | None]:
    seen = []

    def runner(s, out, golden):
        seen.append(s)
        if len(seen) >= schedules:
            raise _Enough
        return Result(scenario=s.name, verdict="pass", checks=[], reason="")

    try:
        Search(runner=runner, budget_s=budget_s, database=None, seed=seed, out=tempfile.mkdtemp()).run()
    except _Enough:
        pass
    return {bug: next((i + 1 for i, s in enumerate(seen) if any(map(hit, s.faults))), None)
            for bug, hit in WINDOWS.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=40, help="seeds 0 .. N-1")
    p.add_argument("--schedules", type=int, default=60, help="schedules looked at per seed")
    p.add_argument("--budget", type=float, default=1e6, help="the search's budget (the generator may depend on it)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    rows = {seed: first_schedules(seed, args.schedules, args.budget) for seed in range(args.seeds)}
    summary = {}
    for bug in WINDOWS:
        xs = sorted(r[bug] or args.schedules + 1 for r in rows.values())
        summary[bug] = {"median": statistics.median(xs), "p90": xs[int(0.9 * (len(xs) - 1))], "max": xs[-1],
                        "not_within": sum(r[bug] is None for r in rows.values()),
                        "seeds_0_1_2": [rows[s][bug] for s in range(min(3, args.seeds))]}
        print(f"{bug:<24} first schedule with its window: median {summary[bug]['median']}, "
              f"90th percentile {summary[bug]['p90']}, max {summary[bug]['max']} "
              f"({summary[bug]['not_within']} of {args.seeds} seeds none in {args.schedules}); "
              f"seeds 0, 1, 2: {summary[bug]['seeds_0_1_2']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": "benchmarks/explore_order.py " + " ".join(sys.argv[1:]),
                                    "summary": summary, "seeds": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
