"""``ckpt-chaos run``: run the scenarios selected (one after another, ``-n`` in worker processes, or
``--executor slurm`` as Slurm jobs), a line for each as it ends, then the suite's table, its HTML
report (JUnit XML, JSON where asked) and, last, what failed and why."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt_chaos import config
from ckpt_chaos.extras import missing_extra
from ckpt_chaos.subcommands.common import (EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNKNOWN,
                                           UsageError, json_out, project)
from ckpt_chaos.subcommands.selection import scenario_dirs, select_scenarios, suite_name

COLOUR = {"pass": "green", "fail": "red", "skipped": "yellow", "xfail": "cyan", "xpass": "red", "unknown": "magenta"}


class _FirstFailure(KeyboardInterrupt):
    """``run -x``: a scenario failed; stop the others as an interrupt would, then report as usual."""



def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ckpt_chaos.report import results

    chosen = _chosen(args)
    if (code := _needs_trainer(chosen)) is not None:
        return code
    target = _slurm_target(args)
    if target is not None:
        from ckpt_chaos.run import fanout

        if why := fanout.missing(target):
            print(f"ckpt-chaos run: --executor slurm: {why}", file=sys.stderr)
            return EXIT_CANNOT_RUN
    _check_coverage_options(args, target)
    if (code := _load_missing(args, target)) is not None:
        return code
    reports = Path(args.reports) if args.reports else config.out_dir(args.out, project()) / "reports"
    golden = Path(args.golden_dir) if args.golden_dir else config.golden_dir()
    console = Console(stderr=args.json)
    plots = {"all": True, "failed": "failed", "none": False}[args.plots] if missing_extra("report") is None else False
    suite = suite_name(args)
    out = results.suite_dir(reports, suite)
    jobs = min(args.jobs, len(chosen))
    _begin(args, chosen, console, suite, out, target, jobs)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    run = _SuiteRun(args, chosen, console, suite, out, plots)
    with _background_load(args, out, console):
        code = _run_all(run, golden, jobs, target) if args.repeat == 1 else _run_repeated(run, golden, jobs, target)
    if code is not None:
        return code  # interrupted, or the Slurm jobs could not be run: written and said already
    failing = [r for r in run.rows if results.failed(r)]
    skipped = [r for r in run.rows if r["verdict"] == "skipped"]
    decided = [r for r in failing if not results.undecided(r)]
    code = (EXIT_FAILED if decided else EXIT_UNKNOWN if failing else EXIT_CANNOT_RUN if skipped and args.strict
            else EXIT_OK)
    code = run.finish(code)
    _summary(run, failing, skipped, code)
    return code


def _load_missing(args: argparse.Namespace, target) -> int | None:
    """``--load`` where it cannot be made: the run does not start, and says why (a run meant to show
    what load changes would show nothing without it)."""
    if not args.load:
        return None
    from ckpt_chaos.run import load

    why = ("the load is made on this machine, and the scenarios run on the Slurm cluster's nodes"
           if target is not None else load.missing())
    if why is None:
        return None
    print(f"ckpt-chaos run: --load {args.load}: SKIPPED, nothing run: {why}", file=sys.stderr)
    return EXIT_CANNOT_RUN


@contextlib.contextmanager
def _background_load(args: argparse.Namespace, out: Path, console):
    """stress-ng busy for as long as the scenarios run (``--load``), its files beside the runs."""
    if not args.load:
        yield
        return
    from ckpt_chaos.run import load

    with load.Load(args.load, out) as running:
        console.print(f"background load ({args.load}): {' '.join(running.proc.args)} (pid {running.proc.pid}), "
                      "stopped with the run")
        yield


def _run_repeated(run: "_SuiteRun", golden: Path, jobs: int, target) -> int | None:
    """``--repeat N``: every scenario N times, the last run in the suite's folder (its report's), the
    others in repeat/run-K; then one row each, a scenario whose runs disagree failing as flaky
    (``ckpt_chaos/run/repeat.py``). None once done; the exit status where a run was interrupted."""
    from ckpt_chaos.report import results
    from ckpt_chaos.run import repeat

    args, n, by_name = run.args, run.args.repeat, {}
    for k in range(1, n + 1):
        out = run.out if k == n else run.out / "repeat" / f"run-{k}"
        out.mkdir(parents=True, exist_ok=True)
        run.console.print(f"[bold]run {k} of {n}[/] ({out})")
        one = _SuiteRun(args, run.chosen, run.console, run.suite, out, run.plots)
        if (code := _run_all(one, golden, jobs, target)) is not None:
            return code
        for row in one.rows:
            by_name.setdefault(row["scenario"], []).append(row)
        if args.exitfirst and any(results.failed(r) for r in one.rows):
            break
    run.rows[:] = [repeat.merged(by_name[s.name]) for s in run.chosen if s.name in by_name]
    for row in run.rows:
        flaky = next((c for c in row["checks"] if c["name"] == "flaky"), None)
        if flaky is not None:
            run.console.print(f"[red]FLAKY[/] {row['scenario']}: {flaky['detail']}", markup=True,
                              highlight=False, soft_wrap=True)
    same = sum(1 for r in run.rows if not any(c["name"] == "flaky" for c in r["checks"]))
    run.console.print(f"--repeat {n}: {same} of {len(run.rows)} scenario(s) had the same verdict and failing "
                      "checks on every run")
    return None


def _chosen(args: argparse.Namespace) -> list:
    """The scenarios to run; a usage error where none is selected, or where --junitxml names a folder."""
    chosen = select_scenarios(args)
    if not chosen:
        what = ("the scenarios named" if args.scenario else f"suite {args.suite!r}" if args.suite else
                "the scenario folders (" + ", ".join(map(str, scenario_dirs(args))) + ")")
        raise UsageError(f"no scenario selected from {what}{' with -k ' + args.k if args.k else ''}; "
                         "`ckpt-chaos list --suite SUITE` shows a suite's scenarios, --scenarios DIR selects a "
                         "folder, --builtin adds the built-in catalogue")
    if args.junitxml and Path(args.junitxml).is_dir():
        raise UsageError(f"--junitxml {args.junitxml}: is a folder; give a file name such as chaos-junit.xml")
    return chosen


def _check_coverage_options(args: argparse.Namespace, target) -> None:
    if args.cov_source and not args.coverage:
        raise UsageError("--cov-source needs --coverage")
    if args.coverage:
        from ckpt_chaos.report import trainer_coverage

        if why := trainer_coverage.missing():
            raise UsageError(f"--coverage {why}")
        if target is not None:
            raise UsageError("--coverage measures processes on this machine: use it without --executor slurm")
        missing = [p for p in args.cov_source or [] if not Path(p).exists()]
        if missing:
            raise UsageError(f"--cov-source {missing[0]}: no such file or folder")


def _begin(args: argparse.Namespace, chosen: list, console, suite: str, out: Path, target, jobs: int) -> None:
    """Say what the run will do and where, and start measuring coverage where asked."""
    console.print(f"ckpt-chaos: {len(chosen)} scenario(s) of suite [bold]{suite}[/], results in {out}")
    if args.coverage:
        from ckpt_chaos.report import trainer_coverage

        sources = [str(Path(p).resolve()) for p in args.cov_source or []] or trainer_coverage.default_sources(chosen)
        trainer_coverage.start(out / "coverage", sources)
        console.print(f"coverage of {', '.join(sources)}")
    if args.plots != "none" and missing_extra("report") is not None:
        console.print(f"[yellow]no plots in the report: it {missing_extra('report')}[/]")
    if target is not None:
        from ckpt_chaos.run.fanout import nested

        here = sum(1 for s in chosen if nested(s))
        console.print(f"one Slurm job each on {target.describe()}"
                      + (f"; {here} scenario(s) on the slurm backend run here afterwards, one at a time"
                         if here else ""))
    elif jobs > 1:
        from ckpt_chaos.run.parallel import rank_budget, usable_cores, weight

        alone = sum(1 for s in chosen if weight(s).alone)
        console.print(f"up to {jobs} at once, at most {rank_budget()} ranks together on {usable_cores()} core(s)"
                      + (f"; {alone} scenario(s) run alone (timing-sensitive, or on Docker or netns nodes)"
                         if alone else ""))


@dataclass
class _SuiteRun:
    """A suite run under way: the rows of the scenarios finished, in catalogue order, and how each is
    shown as it ends and the whole written at the end."""

    args: argparse.Namespace
    chosen: list
    console: Any
    suite: str
    out: Path
    plots: Any  # results.write's: True, "failed" or False
    rows: list[dict] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def finish(self, code: int) -> int:
        """Write the report (JUnit XML, JSON on stdout where asked) of a run that exits ``code``."""
        from ckpt_chaos.report import results

        args, console, out = self.args, self.console, self.out
        wall = time.monotonic() - self.started
        if args.coverage:
            from ckpt_chaos.report import trainer_coverage

            os.environ.pop(trainer_coverage.ENV, None)
            for line in trainer_coverage.format_summary(trainer_coverage.report(out / "coverage")):
                console.print(line, markup=False, highlight=False)
            console.print(f"coverage: {out / 'coverage' / 'index.html'}")
        html = results.write(out, self.suite, self.rows, wall, plots=self.plots)
        if args.junitxml:
            results.write_junit(Path(args.junitxml), self.suite, self.rows, wall)
        if args.json:
            json_out({**results.stamp(), "suite": self.suite, "wall_s": wall, "exit_status": code, "out": str(out),
                      "report": str(html), "junitxml": args.junitxml, "results": self.rows})
        return code

    def progress(self, i: int, s, row: dict) -> None:
        from rich.markup import escape

        from ckpt_chaos.report import results

        v = row["verdict"]
        self.console.print(f"[{i}/{len(self.chosen)}] [{COLOUR.get(v, 'magenta')}]{v:<7}[/] {s.name}  "
                           f"({row['wall_s']:.0f}s){'  ' + escape(row['reason']) if row['reason'] else ''}",
                           markup=True, highlight=False)
        if self.args.exitfirst and results.failed(row):
            raise _FirstFailure()


def _run_all(run: _SuiteRun, golden: Path, jobs: int, target) -> int | None:
    """Run the scenarios, one after another, in worker processes or as Slurm jobs. None once every one
    has run (or -x stopped them); the exit status where the run was interrupted or its Slurm jobs could
    not be run, its report written."""
    from rich.markup import escape

    from ckpt_chaos.report import results
    from ckpt_chaos.run.runner import run_scenario

    chosen, out, rows, progress, console = run.chosen, run.out, run.rows, run.progress, run.console
    try:
        if target is not None:
            from ckpt_chaos.run import fanout

            try:
                _run_parallel(chosen, out, golden, jobs, rows, progress, console, target)
            except fanout.FanoutError as e:
                console.print(f"[red]--executor slurm: {escape(str(e))}[/]", highlight=False)
                return run.finish(EXIT_CANNOT_RUN)
        elif jobs > 1:
            _run_parallel(chosen, out, golden, jobs, rows, progress, console)
        else:
            for i, s in enumerate(chosen, 1):
                with console.status(f"[{i}/{len(chosen)}] {s.name}"):
                    r = run_scenario(s, out, golden)
                row = results.scenario_row(r, s)
                rows.append(row)
                progress(i, s, row)
    except _FirstFailure:
        console.print(f"[red]-x: stopped at the first failure; {len(chosen) - len(rows)} scenario(s) not run "
                      "or stopped[/]")
    except KeyboardInterrupt:
        if target is not None:
            stopped = "" if target.conf else ", the throwaway cluster is stopped"
            console.print(f"[red]interrupted: the Slurm jobs were cancelled and have ended{stopped}[/]")
        else:
            console.print(f"[red]interrupted: every process of the running scenario{'s' if jobs > 1 else ''} "
                          "was killed[/]")
        return run.finish(EXIT_INTERRUPTED)
    return None


def _summary(run: _SuiteRun, failing: list[dict], skipped: list[dict], code: int) -> None:
    """The suite's table, what was skipped, expected to fail or warned of, and last what failed."""
    from rich.markup import escape
    from rich.table import Table

    from ckpt_chaos.report import results

    args, console, out, rows = run.args, run.console, run.out, run.rows
    wall = time.monotonic() - run.started
    t = Table(title=f"suite {run.suite}: {wall:.0f}s")
    for col in ("scenario", "verdict", "lost", "detect s", "recover s", "save s"):
        t.add_column(col)
    for r in rows:
        f = lambda v, d=1: "" if v is None else f"{v:.{d}f}"
        t.add_row(r["scenario"], f"[{COLOUR.get(r['verdict'], 'magenta')}]{r['verdict']}[/]",
                  results.shown(r, "steps_lost"), f(r["time_to_detect_s"]), f(r["time_to_recover_s"]),
                  f(r["save_s"], 3))
    console.print(t)
    console.print(f"report: {out / 'index.html'}" + (f"  junit: {args.junitxml}" if args.junitxml else ""))
    for r in skipped:
        console.print(f"[yellow]SKIPPED[/] {r['scenario']}: {escape(r['reason'])}", highlight=False)
    for r in rows:
        if r["verdict"] == "xfail":
            console.print(f"[cyan]XFAIL[/] {r['scenario']}: {escape(r['reason'][:300])}", highlight=False)
    for r in rows:  # a check that does not change the verdict but says something (probe_versions)
        for c in r.get("checks", []):
            if c["verdict"] == "warn":
                console.print(f"[yellow]WARNING[/] {r['scenario']}: {c['name']}: {escape(c['detail'])}", highlight=False)
    # Last, so that a CI log cut to its tail still names what failed and why.
    for r in rows:
        if r["verdict"] == "unknown" and r.get("may_be_unknown"):
            console.print(f"[magenta]UNKNOWN[/] {r['scenario']}, as it allows ({escape(r['may_be_unknown'])}): "
                          f"{escape(r['reason'][:300])}", highlight=False)
    for r in failing:
        label = {"xpass": "[red]XPASS[/]", "unknown": "[magenta]UNKNOWN[/]"}.get(r["verdict"], "[red]FAILED[/]")
        console.print(f"{label} {r['scenario']} ({r['run_dir']})"
                      + (": the run could not tell (expect.may_be_unknown lets a scenario allow it)"
                         if r["verdict"] == "unknown" else ""))
        if r["verdict"] == "xpass":
            console.print(f"  {r['reason']}", markup=False, highlight=False, soft_wrap=True)
        for c in r["checks"]:
            if c["verdict"] in ("fail", "unknown"):
                console.print(f"  {c['name']}: {c['detail'][:500]}", markup=False, highlight=False, soft_wrap=True)
    if code == EXIT_CANNOT_RUN:
        console.print(f"[red]--strict: {len(skipped)} scenario(s) could not run on this machine[/]")


def _run_parallel(chosen: list, out: Path, golden: Path, jobs: int, rows: list, progress, console,
                  target=None) -> None:
    """``run -n``: the scenarios in worker processes (``ckpt_chaos.run.parallel``), or with ``target``
    (``run --executor slurm``) as Slurm jobs (``ckpt_chaos.run.fanout``); ``rows`` keeps those finished in
    catalogue order (as a serial run's), also when interrupted."""
    from ckpt_chaos.run import fanout
    from ckpt_chaos.run.parallel import ParallelRun

    running: list[str] = []
    by_index: dict[int, dict] = {}
    status = console.status("starting")

    def show() -> None:
        status.update(f"[{len(by_index)}/{len(chosen)}] running {', '.join(running)}")

    def on_start(i: int, s) -> None:
        running.append(s.name)
        show()

    def on_done(i: int, s, row: dict, log: str) -> None:
        running.remove(s.name)
        by_index[i] = row
        rows[:] = [by_index[k] for k in sorted(by_index)]
        for line in log.splitlines():  # what its worker said (a golden run retried, a native crash)
            console.print(f"  {s.name}: {line}", markup=False, highlight=False)
        progress(len(by_index), s, row)
        show()

    with status:
        if target is not None:
            fanout.run(chosen, out, golden, target, on_start=on_start, on_done=on_done)
        else:
            ParallelRun(chosen, out, golden, jobs, on_start=on_start, on_done=on_done).run()


def _slurm_target(args: argparse.Namespace):
    """``run --executor slurm``'s cluster (``fanout.SlurmTarget``), from the options and SLURM_CONF; None
    for a local run. Every --slurm-* option without --executor slurm is an error: it would do nothing."""
    given = [o for o, v in (("--slurm-nodes", args.slurm_nodes), ("--slurm-conf", args.slurm_conf),
                            ("--slurm-arg", args.slurm_arg)) if v]
    if args.executor != "slurm":
        if given:
            raise UsageError(f"{given[0]} is for --executor slurm; add --executor slurm, or drop {given[0]}")
        return None
    from ckpt_chaos.run import fanout
    from ckpt_chaos.run.fanout import SlurmTarget

    if args.jobs > 1:
        raise UsageError("-n: with --executor slurm, Slurm decides how many scenarios run at once (as many as "
                         "its nodes hold); drop -n")
    for arg in args.slurm_arg or []:
        if option := fanout.harness_option(arg):
            raise UsageError(f"--slurm-arg {arg}: the harness sets {option} itself (it finds its jobs, their "
                             "logs and their rows by it); drop it, and give only resources and placement "
                             "(partition, account, time, constraint, qos)")
    conf, conf_from = args.slurm_conf, "--slurm-conf"
    if conf is None and os.environ.get("SLURM_CONF"):
        conf, conf_from = os.environ["SLURM_CONF"], "SLURM_CONF"
    if conf is not None:
        if args.slurm_nodes is not None:
            other = "drop --slurm-conf" if conf_from == "--slurm-conf" else "unset SLURM_CONF"
            raise UsageError(f"--slurm-nodes is for the throwaway cluster, and {conf_from} names an existing one "
                             f"({conf}); drop --slurm-nodes, or {other} for a throwaway cluster")
        if not Path(conf).is_file():
            raise UsageError(f"{conf_from} {conf}: no such file; give the slurm.conf of an existing cluster (the one "
                             "its clients read, often /etc/slurm/slurm.conf), or leave "
                             f"{'--slurm-conf out' if conf_from == '--slurm-conf' else 'SLURM_CONF unset'} for a "
                             "throwaway cluster on this host")
        return SlurmTarget(conf=Path(conf), sbatch_args=args.slurm_arg or [], conf_from=conf_from)
    return SlurmTarget(nodes=args.slurm_nodes or 2, sbatch_args=args.slurm_arg or [])


def _needs_trainer(chosen: list) -> int | None:
    """The reference trainer's torch is an extra (the core installs none): a run that trains it
    without torch here stops before anything starts, with one line that names the extra."""
    ours = [s.name for s in chosen if s.command is None]
    why = missing_extra("trainer") if ours else None
    if why is None:
        return None
    which = ours[0] if len(ours) == 1 else (("the " if len(ours) == len(chosen) else f"{len(ours)} of the ")
                                            + f"{len(chosen)} scenarios ({', '.join(ours[:3])}"
                                            + f"{', ...' if len(ours) > 3 else ''})")
    print(f"ckpt-chaos run: {which} train{'s' if len(ours) == 1 else ''} the reference trainer, which {why}",
          file=sys.stderr)
    return EXIT_CANNOT_RUN
