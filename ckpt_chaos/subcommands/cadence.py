"""``ckpt-chaos cadence``: goodput against checkpoint interval, from the user's costs; no training."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ckpt_chaos import config
from ckpt_chaos.subcommands.common import EXIT_OK, UsageError, needs, project


def cmd_cadence(args: argparse.Namespace) -> int:
    """Goodput against checkpoint interval for the user's costs and MTBF; no training is run."""
    from dataclasses import asdict

    if (code := needs("report", "cadence")) is not None:
        return code
    from ckpt_chaos.report.goodput import Costs, plot, recommend

    mtbf = args.mtbf_h * 3600 if args.mtbf_h else None
    if args.node_mtbf_h:  # independent nodes: the job fails when any node does
        mtbf = args.node_mtbf_h * 3600 / args.nodes
    if mtbf is None:
        raise UsageError("cadence: give --mtbf-h (the job's), or --node-mtbf-h with --nodes")
    costs = Costs(save=args.save_s, restart=args.restart_s, mtbf=mtbf)
    try:
        rec = recommend(costs, current=args.interval_s, runs=args.runs, shape=args.weibull_shape,
                        horizon=args.horizon_h * 3600 if args.horizon_h else None, seed=args.seed)
    except ValueError as e:
        raise UsageError(f"cadence: {e}") from None
    out = Path(args.out) if args.out else config.out_dir(None, project()) / "reports" / "cadence"
    out.mkdir(parents=True, exist_ok=True)
    plot(rec, out / "cadence.svg")
    (out / "cadence.json").write_text(json.dumps(asdict(rec), indent=1) + "\n")
    print(f"costs: save {costs.save:g} s, restart {costs.restart:g} s, job MTBF {costs.mtbf / 3600:.2f} h")
    print(f"Young's interval  {rec.young_s / 60:8.1f} min")
    print(f"Daly's interval   {rec.daly_s / 60:8.1f} min")
    how = "Monte Carlo, Weibull shape %g" % args.weibull_shape if args.runs and args.weibull_shape != 1 else "model"
    print(f"best interval     {rec.best_s / 60:8.1f} min   goodput {rec.best_goodput:.2%} ({how})")
    for name, g in rec.rules.items():
        print(f"rule of thumb: {name:<30} goodput {g:.2%}")
    if rec.current_s:
        lost = rec.best_goodput - rec.current_goodput
        print(f"your interval     {rec.current_s / 60:8.1f} min   goodput {rec.current_goodput:.2%}: "
              f"{lost:.2%} of the machine's time lost against the best interval")
    print(f"plot: {out / 'cadence.svg'}  figures: {out / 'cadence.json'}")
    return EXIT_OK
