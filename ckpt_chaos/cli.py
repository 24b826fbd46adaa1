"""The ``ckpt-chaos`` command line."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from ckpt_chaos.config import golden_dir, out_dir

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"


def _select(args: argparse.Namespace):
    """Scenarios named on the command line (names or files), else the suite's; errors exit 2."""
    from ckpt_chaos.scenario import ScenarioError, catalogue, load

    try:
        everything = catalogue(args.scenarios_dir)
        by_name = {s.name: s for s in everything}
        if args.scenario:
            chosen = []
            for ref in args.scenario:
                if ref in by_name:
                    chosen.append(by_name[ref])
                elif Path(ref).is_file():
                    chosen.append(load(ref))
                else:
                    raise ScenarioError(f"{ref}: no scenario of that name in {args.scenarios_dir} and no such file; "
                                        "`ckpt-chaos list` shows the names")
        else:
            chosen = [s for s in everything if args.suite in s.suites]
    except ScenarioError as e:
        print(f"ckpt-chaos: {e}", file=sys.stderr)
        raise SystemExit(2)
    if getattr(args, "k", None):
        chosen = [s for s in chosen if args.k in s.name or args.k in s.labels]
    return chosen


def cmd_list(args: argparse.Namespace) -> int:
    for s in _select(args):
        labels = " ".join(s.labels)
        print(f"{s.name:<44} [{labels}]  {s.description}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from ckpt_chaos.report import results
    from ckpt_chaos.run.runner import run_scenario

    chosen = _select(args)
    if not chosen:
        print("ckpt-chaos: no scenario selected", file=sys.stderr)
        return 2
    console = Console()
    suite = "custom" if args.scenario else args.suite
    out = results.suite_dir(Path(args.reports), suite)
    console.print(f"ckpt-chaos: {len(chosen)} scenario(s) of suite [bold]{suite}[/], results in {out}")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    rows, started = [], time.monotonic()
    colour = {"pass": "green", "fail": "red", "skipped": "yellow"}
    try:
        for i, s in enumerate(chosen, 1):
            with console.status(f"[{i}/{len(chosen)}] {s.name}"):
                r = run_scenario(s, out, Path(args.golden_dir))
            rows.append(r.to_dict())
            console.print(f"[{i}/{len(chosen)}] [{colour[r.verdict]}]{r.verdict:<7}[/] {s.name}  "
                          f"({r.wall_s:.0f}s){'  ' + escape(r.reason) if r.reason else ''}")
    except KeyboardInterrupt:
        console.print("[red]interrupted: every process of the running scenario was killed[/]")
        results.write(out, suite, rows, time.monotonic() - started)
        return 130
    wall = time.monotonic() - started
    html = results.write(out, suite, rows, wall)
    t = Table(title=f"suite {suite}: {wall:.0f}s")
    for col in ("scenario", "verdict", "lost", "detect s", "recover s", "save s"):
        t.add_column(col)
    for r in rows:
        f = lambda v, d=1: "" if v is None else f"{v:.{d}f}"
        t.add_row(r["scenario"], f"[{colour[r['verdict']]}]{r['verdict']}[/]", str(r["steps_lost"] or 0),
                  f(r["time_to_detect_s"]), f(r["time_to_recover_s"]), f(r["save_s"], 3))
    console.print(t)
    console.print(f"report: {html}")
    skipped = [r for r in rows if r["verdict"] == "skipped"]
    for r in skipped:
        console.print(f"[yellow]SKIPPED[/] {r['scenario']}: {escape(r['reason'])}")
    # Last, so that a CI log cut to its tail still names what failed and why.
    for r in rows:
        if r["verdict"] == "fail":
            console.print(f"[red]FAILED[/] {r['scenario']} ({r['run_dir']})")
            for c in r["checks"]:
                if c["verdict"] == "fail":
                    console.print(f"  {c['name']}: {c['detail'][:500]}", markup=False, highlight=False, soft_wrap=True)
    if skipped and args.strict:
        console.print(f"[red]--strict: {len(skipped)} scenario(s) could not run on this machine[/]")
        return 1
    return 1 if any(r["verdict"] == "fail" for r in rows) else 0


def cmd_check(args: argparse.Namespace) -> int:
    """Re-run the checkers over a stored scenario run, without running anything."""
    from ckpt_chaos.run.runner import evaluate
    from ckpt_chaos.scenario import load

    run_dir = Path(args.run_dir)
    s = load(run_dir / "scenario.toml")
    r = evaluate(s, run_dir, (run_dir / "golden").resolve())
    for c in r.checks:
        print(f"{c['verdict']:<5} {c['name']}: {c['detail']}")
    print(f"verdict: {r.verdict}")
    return 1 if r.verdict == "fail" else 0


def cmd_ckpts(args: argparse.Namespace) -> int:
    """List the checkpoints of a run directory (or a checkpoint directory) and whether each validates."""
    from reference_trainer.checkpoint import LATEST, describe

    root = Path(args.dir)
    if (root / "checkpoints").is_dir():
        root = root / "checkpoints"
    if not root.is_dir():
        print(f"ckpt-chaos: {root} is not a directory", file=sys.stderr)
        return 2
    rows = describe(root, verify_checksums=not args.fast)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    latest = (root / LATEST).read_text().strip() if (root / LATEST).exists() else None
    if not rows:
        print(f"{root}: no checkpoints")
    for r in rows:
        mark = "*" if r["name"] == latest else " "
        if r["valid"]:
            print(f"{mark} {r['name']:<20} valid   world {r['world_size']}  tokens {r['tokens_seen']:>9}  "
                  f"{r['bytes'] / 1e6:8.2f} MB  loss {r['loss']}")
        else:
            print(f"{mark} {r['name']:<20} INVALID {r['reason']}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Rebuild the HTML report of a stored suite run (reports/<suite>/<time>, or its ``latest`` link)."""
    root = Path(args.results)
    if not (root / "results.json").is_file():
        print(f"ckpt-chaos report: {root} holds no results.json; give a suite run directory such as "
              f"reports/default/latest", file=sys.stderr)
        return 2
    from ckpt_chaos.report import results

    html = results.rebuild(root, plots=not args.no_plots)
    print(f"report: {html}")
    if not args.browser:
        return 0
    try:
        view = results.view_in_browser(html, screenshot=root / "report.png")
    except FileNotFoundError as e:
        print(f"ckpt-chaos report: cannot check the report in a browser: {e}", file=sys.stderr)
        return 2
    problems = view.problems(expected_plots=results.expected_plots(root))
    print(f"in headless Chromium: {view.sections} scenarios, {view.plots} plots loaded"
          f"{'' if view.broken_plots == 0 else f', {view.broken_plots} broken'}, {len(view.script_errors)} script "
          f"errors; screenshot {view.screenshot}")
    for p in problems:
        print(f"ckpt-chaos report: {p}", file=sys.stderr)
    return 1 if problems else 0


def cmd_cadence(args: argparse.Namespace) -> int:
    """Goodput against checkpoint interval for the user's costs and MTBF; no training is run."""
    from dataclasses import asdict

    from ckpt_chaos.report.goodput import Costs, plot, recommend

    mtbf = args.mtbf_h * 3600 if args.mtbf_h else None
    if args.node_mtbf_h:  # independent nodes: the job fails when any node does
        mtbf = args.node_mtbf_h * 3600 / args.nodes
    if mtbf is None:
        print("ckpt-chaos cadence: give --mtbf-h (the job's), or --node-mtbf-h with --nodes", file=sys.stderr)
        return 2
    costs = Costs(save=args.save_s, restart=args.restart_s, mtbf=mtbf)
    try:
        rec = recommend(costs, current=args.interval_s, runs=args.runs, shape=args.weibull_shape,
                        horizon=args.horizon_h * 3600 if args.horizon_h else None, seed=args.seed)
    except ValueError as e:
        print(f"ckpt-chaos cadence: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
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
    return 0


def _duration(text: str) -> float:
    """``90``, ``90s``, ``20m``, ``1h`` -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"{text!r}: give a duration such as 90s, 20m or 1h") from None


def cmd_explore(args: argparse.Namespace) -> int:
    """Search random fault schedules for a failure; write each one found, shrunk, as a scenario file."""
    from rich.console import Console

    from ckpt_chaos.search.explore import KINDS, Search

    families = [f for f in args.families.split(",") if f]
    bad = [f for f in families if f not in KINDS]
    if bad or not families:
        print(f"ckpt-chaos explore: unknown family {bad[0] if bad else '(none)'}; searchable: {', '.join(KINDS)}",
              file=sys.stderr)
        return 2
    console = Console()
    out = Path(args.out) / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    status = console.status("starting")

    def show(kind: str, search, obj) -> None:
        sm = search.summary
        if kind == "run":
            colour = "red" if obj.identity else "green" if obj.verdict == "pass" else "yellow"
            what = obj.identity or ("pass" if obj.verdict == "pass" else "a fault did not fire")
            console.print(f"{search.elapsed():5.0f}s  [{colour}]{what:<22}[/] {obj.name}  {obj.faults} fault(s), "
                          f"{obj.fired} fired  ({obj.wall_s:.0f}s)")
        elif kind == "finding":
            if obj.reproduced:
                console.print(f"[red bold]FOUND[/] {obj.identity}: shrunk to {obj.faults} fault(s), reproduced; "
                              f"{obj.file}")
            else:
                console.print(f"[yellow]did not reproduce[/] {obj.identity}: the shrunk schedule passed or failed "
                              f"otherwise when run again from its file ({obj.rerun_reason or 'pass'})")
        phase = "shrinking" if search.found_at is not None else "searching"
        status.update(f"{phase}: {sm.schedules} schedules, {sm.faults_fired} faults fired, "
                      f"{len(sm.findings)} failure(s) found, {search.elapsed():.0f}s of {args.budget:.0f}s")

    search = Search(trainer_module=args.trainer, families=families, budget_s=args.budget, shrink_s=args.shrink_budget,
                    seed=args.seed, out=out, regressions=args.regressions, golden_root=args.golden_dir,
                    database=None if args.no_database else True, max_faults=args.max_faults, on_event=show)
    console.print(f"ckpt-chaos explore: trainer {args.trainer}, families {', '.join(families)}, budget "
                  f"{args.budget:.0f}s (+ {search.summary.shrink_s:.0f}s to shrink a failure), seed {args.seed}; "
                  f"runs in {out}")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        with status:
            sm = search.run()
    except KeyboardInterrupt:
        console.print("[red]interrupted: every process of the running schedule was killed[/]")
        return 130
    console.print(f"schedules tried: {sm.schedules} ({sm.schedules_per_minute:.1f}/min, {sm.cache_hits} repeats "
                  f"answered from the cache, {sm.nothing_new} with nothing new not run)  faults fired: {sm.faults_fired} of {sm.faults_planned}  "
                  f"failures found: {len(sm.findings)}  not reproduced: {len(sm.not_reproduced)}  "
                  f"wall: {sm.wall_s:.0f}s")
    for f in sm.findings:
        console.print(f"  {f.identity}: {f.faults} fault(s), found after {f.found_after_s:.0f}s -> ckpt-chaos run {f.file}")
    if sm.error:
        console.print(f"[red]search stopped: {sm.error}[/]")
    console.print(f"summary: {out / 'summary.json'}")
    return 1 if sm.findings or sm.error else 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ckpt-chaos",
        description="Fault-injection and resilience tests for distributed-training checkpoint/resume.")
    sub = p.add_subparsers(dest="command", required=True)
    reports = out_dir() / "reports"

    def selection(c: argparse.ArgumentParser) -> None:
        c.add_argument("scenario", nargs="*", help="scenario names or files (default: the suite)")
        c.add_argument("--suite", default="default", help="suite to run when no scenario is named")
        c.add_argument("-k", help="keep scenarios whose name contains this, or that have it as a tag, fault kind or family")
        c.add_argument("--scenarios-dir", default=str(SCENARIO_DIR))

    c = sub.add_parser("list", help="list scenarios with their labels and descriptions")
    selection(c)
    c.set_defaults(func=cmd_list)

    c = sub.add_parser("run", help="run scenarios; exit status 1 when any fails")
    selection(c)
    c.add_argument("--reports", default=str(reports), help="where results are written")
    c.add_argument("--golden-dir", default=str(golden_dir()), help="cache of fault-free runs")
    c.add_argument("--strict", action="store_true",
                   help="a scenario skipped for want of root, FUSE, libfiu... fails the run (CI)")
    c.set_defaults(func=cmd_run)

    c = sub.add_parser("check", help="re-check a stored scenario run (reports/<suite>/<time>/<scenario>)")
    c.add_argument("run_dir")
    c.set_defaults(func=cmd_check)

    c = sub.add_parser("ckpts", help="list a run's checkpoints and validate each (manifest, sizes, checksums)")
    c.add_argument("dir", help="a run directory or its checkpoints/ directory")
    c.add_argument("--fast", action="store_true", help="skip SHA-256 verification")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(func=cmd_ckpts)

    c = sub.add_parser("report", help="rebuild the HTML report of a stored suite run")
    c.add_argument("results", help="a suite run directory, e.g. reports/default/latest")
    c.add_argument("--no-plots", action="store_true", help="keep the plots already drawn")
    c.add_argument("--browser", action="store_true",
                   help="open it in headless Chromium and fail on a script error, a plot that does not load or "
                        "a scenario missing (writes report.png next to it)")
    c.set_defaults(func=cmd_report)

    c = sub.add_parser("cadence", help="goodput against checkpoint interval for your save cost and MTBF (no training)")
    c.add_argument("--save-s", type=float, required=True, help="training stall per checkpoint, seconds")
    c.add_argument("--restart-s", type=float, required=True, help="failure to first new step, seconds")
    c.add_argument("--mtbf-h", type=float, help="mean time between failures of the whole job, hours")
    c.add_argument("--node-mtbf-h", type=float, help="per-node MTBF, hours (with --nodes)")
    c.add_argument("--nodes", type=int, default=1, help="nodes in the job (with --node-mtbf-h)")
    c.add_argument("--interval-s", type=float, help="your current checkpoint interval, seconds")
    c.add_argument("--runs", type=int, default=0, help="also simulate this many jobs per interval (Monte Carlo)")
    c.add_argument("--weibull-shape", type=float, default=1.0,
                   help="failure-time shape for the simulation: 1 exponential, < 1 infant mortality")
    c.add_argument("--horizon-h", type=float, help="useful work per simulated job, hours (default: 50 MTBFs)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--out", default=str(reports / "cadence"), help="where the plot and figures go")
    c.set_defaults(func=cmd_cadence)

    c = sub.add_parser("explore", help="search random fault schedules for failures, shrink each to a scenario file")
    c.add_argument("--budget", type=_duration, default=_duration("20m"), help="search time, e.g. 3m, 20m, 1h")
    c.add_argument("--shrink-budget", type=_duration, default=None,
                   help="time to shrink each failure found (default: half the budget, 1 to 5 minutes)")
    c.add_argument("--families", default="process,storage",
                   help="fault families to compose: process, storage, topology (relaunches on fewer ranks), "
                        "remote (the upload tier)")
    c.add_argument("--trainer", default="reference_trainer", help="python module of the trainer (-m under torchrun)")
    c.add_argument("--seed", type=int, default=None, help="fixes the schedules generated (CI)")
    c.add_argument("--max-faults", type=int, default=4, help="steps per schedule (faults and training progress)")
    c.add_argument("--out", default=str(reports / "explore"), help="where runs and summary.json go")
    c.add_argument("--regressions", default=None,
                   help="where failures are written (default: found/ in the search's output folder)")
    c.add_argument("--golden-dir", default=str(golden_dir()), help="cache of fault-free runs")
    c.add_argument("--no-database", action="store_true", help="do not replay or keep failing examples "
                   "(explore/ in the cache)")
    c.set_defaults(func=cmd_explore)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
