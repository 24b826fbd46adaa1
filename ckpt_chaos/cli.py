"""The ``ckpt-chaos`` command line.

``list`` and ``run`` take the scenarios of the folders given with ``--scenarios``, else of the
project's folders (``[tool.ckpt-chaos] scenarios`` in its ``pyproject.toml``); the built-in catalogue
only with ``--builtin`` (or ``builtin = true``), or where there is no such folder. A scenario named on
the command line is also found in the project's folders and the built-in catalogue. Runs and
reports go under the output directory (``ckpt_chaos.config``). Human output goes to stderr when
``--json`` puts the machine-readable one on stdout.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import signal
import sys
import time
from functools import cache
from pathlib import Path
from typing import Any

from ckpt_chaos import __version__, config
from ckpt_chaos.extras import missing_extra

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CANNOT_RUN, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

EPILOG = f"""\
exit status:
  {EXIT_OK}    every scenario passed (an expected failure, xfail, counts as passed)
  {EXIT_FAILED}    a scenario failed, or passed although it declares a known failure
       (xpass); explore found a failure; check: the run fails; report
       --browser: the report has a problem
  {EXIT_USAGE}    bad input: a malformed scenario file or [tool.ckpt-chaos] table, an
       unknown scenario name, a wrong option; nothing was run or written
  {EXIT_CANNOT_RUN}    cannot run here: a needed extra is not installed (or Slurm, for run
       --executor slurm), or (run --strict) a scenario was skipped for want of
       root, FUSE, Docker...
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C, SIGTERM); every process of the running scenarios was
       killed

environment:
  {config.ENV_OUT}          output directory when --out is not given (else the
                          project's [tool.ckpt-chaos] out, else the current
                          directory)
  {config.ENV_CACHE}        cache of golden runs and of the search's examples
                          (default: ~/.cache/ckpt-chaos, the user cache folder)
  CKPT_CHAOS_S3_ENDPOINT  S3-compatible server for the remote-tier scenarios,
                          with the usual AWS_* credentials (default: a local
                          moto server per run)
  SLURM_CONF              run --executor slurm: submit to this existing cluster
                          (default: a throwaway cluster on this host)
  NO_COLOR                no colours in the human output

project settings, in its pyproject.toml:
  [tool.ckpt-chaos]
  scenarios = ["chaos/scenarios"]  # the project's scenario folders: what list
                                   # and run take (--scenarios DIR instead)
  out = "build/chaos"              # the output directory
  builtin = false                  # true: take the built-in catalogue too
                                   # (--builtin)
"""


class UsageError(Exception):
    """Bad input; the message names the file or option and the fix. Exits 2."""


class _FirstFailure(KeyboardInterrupt):
    """``run -x``: a scenario failed; stop the others as an interrupt would, then report as usual."""


@cache
def _project() -> config.ProjectConfig:
    try:
        return config.project_config()
    except config.ConfigError as e:
        raise UsageError(str(e)) from None


def _given(args: argparse.Namespace) -> list[Path]:
    """The folders of ``--scenarios``."""
    given = [Path(d) for d in args.scenarios or []]
    for d in given:
        if not d.is_dir():
            raise UsageError(f"--scenarios {d}: not a folder; give a folder of scenario .toml files")
    return given


def _scenario_dirs(args: argparse.Namespace) -> list[Path]:
    """The folders ``list`` and ``run`` select from: ``--scenarios``, else the project's; the built-in
    catalogue only with ``--builtin`` (or ``builtin = true``), or when there is neither."""
    return _project().scenario_dirs(_given(args), builtin=args.builtin)


def _project_selected(args: argparse.Namespace) -> bool:
    """Folders of a project's (``--scenarios``, ``[tool.ckpt-chaos] scenarios``) are selected."""
    return bool(_given(args) or _project().scenarios)


def _files(d: Path) -> list[Path]:
    # pyproject.toml is a project's configuration, never a scenario (as for the pytest plugin)
    return [p for p in sorted(d.rglob("*.toml")) if p.name != "pyproject.toml"]


def _catalogue(args: argparse.Namespace) -> dict:
    """Every scenario in the folders, by name; a name used twice is an error naming both files."""
    from ckpt_chaos.scenario import load

    by_name = {}
    for d in _scenario_dirs(args):
        for path in _files(d):
            s = load(path)
            if s.name in by_name:
                raise UsageError(f"{path}: name: {s.name!r} is also the name of {by_name[s.name].source}; "
                                 "names must be unique across the scenario folders: rename one of the files "
                                 "(or set its `name`)")
            by_name[s.name] = s
    return by_name


def _lookup(args: argparse.Namespace, name: str):
    """A scenario named on the command line that the folders selected lack: the first of that name in the
    project's folders or the built-in catalogue (naming one asks for it), else None."""
    from ckpt_chaos.scenario import load

    selected = _scenario_dirs(args)
    for d in _project().lookup_dirs(_given(args), builtin=args.builtin):
        if d not in selected:
            for path in _files(d):
                if (s := load(path)).name == name:
                    return s
    return None


def _select(args: argparse.Namespace) -> list:
    """Scenarios named on the command line (names or files), else the suite's: ``--suite S`` from every
    folder selected; without it, every scenario of the project's folders and, of the built-in catalogue,
    its ``default`` suite (``run``) or all of it (``list``)."""
    from ckpt_chaos.scenario import FULL_SUITE, builtin, load

    by_name = _catalogue(args)
    if args.scenario:
        chosen = []
        for ref in args.scenario:
            if ref in by_name:
                chosen.append(by_name[ref])
            elif Path(ref).is_file():
                chosen.append(load(ref))
            elif (found := _lookup(args, ref)) is not None:
                chosen.append(found)
            else:
                near = difflib.get_close_matches(ref, list(by_name), n=3)
                raise UsageError(f"{ref}: no scenario of that name and no such file"
                                 + (f"; did you mean {', '.join(near)}?" if near else "")
                                 + "; `ckpt-chaos list` shows the names, --scenarios DIR selects a folder, "
                                   "--builtin adds the built-in catalogue")
    else:
        ordered = sorted(by_name.values(), key=lambda s: s.name)
        if args.suite is not None:
            chosen = [s for s in ordered if args.suite in s.suites]
        else:
            of_builtin = "default" if args.command == "run" else FULL_SUITE
            chosen = [s for s in ordered if of_builtin in s.suites or not builtin(s.source)]
    if args.k:
        chosen = [s for s in chosen if args.k in s.name or args.k in s.labels]
    return chosen


def _suite_name(args: argparse.Namespace) -> str:
    """The suite a run reports as (its folder, reports/<suite>): ``custom`` when scenarios are named,
    else ``--suite``; without it ``project`` where a project's folders are selected, else ``default``."""
    if args.scenario:
        return "custom"
    return args.suite or ("project" if _project_selected(args) else "default")


def _json_out(data) -> None:
    sys.stdout.write(json.dumps(data, indent=1) + "\n")
    sys.stdout.flush()


def cmd_list(args: argparse.Namespace) -> int:
    chosen = _select(args)
    if args.json:
        _json_out([{"name": s.name, "description": s.description, "labels": s.labels, "suites": s.suites,
                    "file": s.source, "known_failure": s.expect.known_failure} for s in chosen])
        return EXIT_OK
    for s in chosen:
        labels = " ".join(s.labels)
        print(f"{s.name:<44} {','.join(s.suites):<13} [{labels}]  {s.description}")
    return EXIT_OK


COLOUR = {"pass": "green", "fail": "red", "skipped": "yellow", "xfail": "cyan", "xpass": "red"}


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table
    from rich.markup import escape

    from ckpt_chaos.report import results
    from ckpt_chaos.run.runner import run_scenario

    chosen = _select(args)
    if not chosen:
        what = ("the scenarios named" if args.scenario else f"suite {args.suite!r}" if args.suite else
                "the scenario folders (" + ", ".join(map(str, _scenario_dirs(args))) + ")")
        raise UsageError(f"no scenario selected from {what}{' with -k ' + args.k if args.k else ''}; "
                         "`ckpt-chaos list --suite SUITE` shows a suite's scenarios, --scenarios DIR selects a "
                         "folder, --builtin adds the built-in catalogue")
    if args.junitxml and Path(args.junitxml).is_dir():
        raise UsageError(f"--junitxml {args.junitxml}: is a folder; give a file name such as chaos-junit.xml")
    if (code := _needs_trainer(chosen)) is not None:
        return code
    target = _slurm_target(args)
    if target is not None:
        from ckpt_chaos.run import fanout

        if why := fanout.missing(target):
            print(f"ckpt-chaos run: --executor slurm: {why}", file=sys.stderr)
            return EXIT_CANNOT_RUN
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
    reports = Path(args.reports) if args.reports else config.out_dir(args.out, _project()) / "reports"
    golden = Path(args.golden_dir) if args.golden_dir else config.golden_dir()
    console = Console(stderr=args.json)
    plots = {"all": True, "failed": "failed", "none": False}[args.plots] if missing_extra("report") is None else False
    suite = _suite_name(args)
    out = results.suite_dir(reports, suite)
    console.print(f"ckpt-chaos: {len(chosen)} scenario(s) of suite [bold]{suite}[/], results in {out}")
    if args.coverage:
        sources = [str(Path(p).resolve()) for p in args.cov_source or []] or trainer_coverage.default_sources(chosen)
        trainer_coverage.start(out / "coverage", sources)
        console.print(f"coverage of {', '.join(sources)}")
    if args.plots != "none" and missing_extra("report") is not None:
        console.print(f"[yellow]no plots in the report: it {missing_extra('report')}[/]")
    jobs = min(args.jobs, len(chosen))
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
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    rows, started = [], time.monotonic()

    def finish(code: int) -> int:
        wall = time.monotonic() - started
        if args.coverage:
            os.environ.pop(trainer_coverage.ENV, None)
            for line in trainer_coverage.format_summary(trainer_coverage.report(out / "coverage")):
                console.print(line, markup=False, highlight=False)
            console.print(f"coverage: {out / 'coverage' / 'index.html'}")
        html = results.write(out, suite, rows, wall, plots=plots)
        if args.junitxml:
            results.write_junit(Path(args.junitxml), suite, rows, wall)
        if args.json:
            _json_out({**results.stamp(), "suite": suite, "wall_s": wall, "exit_status": code, "out": str(out),
                       "report": str(html), "junitxml": args.junitxml, "results": rows})
        return code

    def progress(i: int, s, row: dict) -> None:
        v = row["verdict"]
        console.print(f"[{i}/{len(chosen)}] [{COLOUR.get(v, 'magenta')}]{v:<7}[/] {s.name}  "
                      f"({row['wall_s']:.0f}s){'  ' + escape(row['reason']) if row['reason'] else ''}",
                      markup=True, highlight=False)
        if args.exitfirst and results.failed(row):
            raise _FirstFailure()

    try:
        if target is not None:
            from ckpt_chaos.run import fanout

            try:
                _run_parallel(chosen, out, golden, jobs, rows, progress, console, target)
            except fanout.FanoutError as e:
                console.print(f"[red]--executor slurm: {escape(str(e))}[/]", highlight=False)
                return finish(EXIT_CANNOT_RUN)
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
        return finish(EXIT_INTERRUPTED)
    failing = [r for r in rows if results.failed(r)]
    skipped = [r for r in rows if r["verdict"] == "skipped"]
    code = EXIT_FAILED if failing else EXIT_CANNOT_RUN if skipped and args.strict else EXIT_OK
    code = finish(code)
    wall = time.monotonic() - started
    t = Table(title=f"suite {suite}: {wall:.0f}s")
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
    for r in failing:
        console.print(f"[red]{'XPASS' if r['verdict'] == 'xpass' else 'FAILED'}[/] {r['scenario']} ({r['run_dir']})")
        if r["verdict"] == "xpass":
            console.print(f"  {r['reason']}", markup=False, highlight=False, soft_wrap=True)
        for c in r["checks"]:
            if c["verdict"] in ("fail", "unknown"):
                console.print(f"  {c['name']}: {c['detail'][:500]}", markup=False, highlight=False, soft_wrap=True)
    if code == EXIT_CANNOT_RUN:
        console.print(f"[red]--strict: {len(skipped)} scenario(s) could not run on this machine[/]")
    return code


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


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of 1 or more")
    return n


def cmd_check(args: argparse.Namespace) -> int:
    """Re-run the checkers over a stored scenario run, without running anything."""
    from ckpt_chaos.check.history import HistoryError
    from ckpt_chaos.report import results
    from ckpt_chaos.run.runner import evaluate
    from ckpt_chaos.scenario import load

    run_dir = Path(args.run_dir)
    if not (run_dir / "scenario.toml").is_file():
        raise UsageError(f"{run_dir}: holds no scenario.toml; give a scenario run directory such as "
                         "reports/default/latest/kill-rank1-mid-shard-write")
    s = load(run_dir / "scenario.toml")
    try:
        row = results.scenario_row(evaluate(s, run_dir, (run_dir / "golden").resolve()), s, write=False)
    except HistoryError as e:
        raise UsageError(str(e)) from None
    code = EXIT_FAILED if results.failed(row) else EXIT_OK
    if args.json:
        _json_out({**results.stamp(), "exit_status": code, **row})
        return code
    print(results.check_lines(row))
    print(f"verdict: {row['verdict']}" + (f" ({row['reason']})" if row["verdict"] in ("xfail", "xpass") else ""))
    return code


def _checkpoint_rows(root: Path, verify_checksums: bool) -> list[dict[str, Any]]:
    """A row per checkpoint directory: name, validity and the manifest's key facts."""
    from ckpt_chaos.probe.layout import list_checkpoints, read_manifest, validate

    rows = []
    for path in list_checkpoints(root):
        reason = validate(path, verify_checksums)
        row: dict[str, Any] = {"name": path.name, "valid": reason is None, "reason": reason or ""}
        if reason is None:
            m = read_manifest(path)
            row.update(world_size=m["world_size"], tokens_seen=m["tokens_seen"], loss=m["loss"],
                       bytes=sum(v["size"] for v in m["files"].values()))
        rows.append(row)
    return rows


def cmd_ckpts(args: argparse.Namespace) -> int:
    """List the checkpoints of a run directory (or a checkpoint directory) and whether each validates."""
    from ckpt_chaos.probe.layout import LATEST

    root = Path(args.dir)
    if (root / "checkpoints").is_dir():
        root = root / "checkpoints"
    if not root.is_dir():
        raise UsageError(f"{root}: not a folder; give a run directory or its checkpoints/ folder")
    rows = _checkpoint_rows(root, verify_checksums=not args.fast)
    if args.json:
        _json_out(rows)
        return EXIT_OK
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
    return EXIT_OK


def _needs(extra: str, command: str) -> int | None:
    why = missing_extra(extra)
    if why is None:
        return None
    print(f"ckpt-chaos {command}: {why}", file=sys.stderr)
    return EXIT_CANNOT_RUN


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


def cmd_report(args: argparse.Namespace) -> int:
    """Rebuild the HTML report of a stored suite run (reports/<suite>/<time>, or its ``latest`` link)."""
    root = Path(args.results)
    if not (root / "results.json").is_file():
        raise UsageError(f"{root}: holds no results.json; give a suite run directory such as "
                         "reports/default/latest")
    if not args.no_plots and (code := _needs("report", "report")) is not None:
        return code
    from ckpt_chaos.report import results

    html = results.rebuild(root, plots=not args.no_plots)
    print(f"report: {html}")
    if not args.browser:
        return EXIT_OK
    missing = results.missing_plots(root, drawn=not args.no_plots)  # a plot that should be there and is not
    for p in missing:
        print(f"ckpt-chaos report: {p}", file=sys.stderr)
    try:
        view = results.view_in_browser(html, screenshot=root / "report.png")
    except FileNotFoundError as e:
        print(f"ckpt-chaos report: cannot check the report in a browser: {e}", file=sys.stderr)
        return EXIT_FAILED if missing else EXIT_CANNOT_RUN
    problems = view.problems(expected_plots=results.expected_plots(root))
    print(f"in headless Chromium: {view.sections} scenarios, {view.plots} plots loaded"
          f"{'' if view.broken_plots == 0 else f', {view.broken_plots} broken'}, {len(view.script_errors)} script "
          f"errors; screenshot {view.screenshot}")
    for p in problems:
        print(f"ckpt-chaos report: {p}", file=sys.stderr)
    return EXIT_FAILED if problems or missing else EXIT_OK


def cmd_cadence(args: argparse.Namespace) -> int:
    """Goodput against checkpoint interval for the user's costs and MTBF; no training is run."""
    from dataclasses import asdict

    if (code := _needs("report", "cadence")) is not None:
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
    out = Path(args.out) if args.out else config.out_dir(None, _project()) / "reports" / "cadence"
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


def _duration(text: str) -> float:
    """``90``, ``90s``, ``20m``, ``1h`` -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"{text!r}: give a duration such as 90s, 20m or 1h") from None


def _jobs(text: str) -> int:
    """``-n``: a count of 1 or more, or ``auto``."""
    if text == "auto":
        from ckpt_chaos.run.parallel import auto_jobs

        return auto_jobs()
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of scenarios at once (1 or more) or auto")
    return n


def cmd_explore(args: argparse.Namespace) -> int:
    """Search random fault schedules for a failure; write each one found, shrunk, as a scenario file."""
    if (code := _needs("search", "explore")) is not None:
        return code
    from rich.console import Console

    from ckpt_chaos.search.explore import KINDS, Search

    families = [f for f in args.families.split(",") if f]
    bad = [f for f in families if f not in KINDS]
    if bad or not families:
        raise UsageError(f"--families: unknown family {bad[0] if bad else '(none)'}; searchable: {', '.join(KINDS)}")
    console = Console()
    out = config.out_dir(args.out, _project()) / "reports" / "explore" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
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
                    seed=args.seed, out=out, regressions=args.regressions,
                    golden_root=args.golden_dir or config.golden_dir(),
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
        return EXIT_INTERRUPTED
    console.print(f"schedules tried: {sm.schedules} ({sm.schedules_per_minute:.1f}/min, {sm.cache_hits} repeats "
                  f"answered from the cache, {sm.nothing_new} with nothing new not run)  faults fired: {sm.faults_fired} of {sm.faults_planned}  "
                  f"failures found: {len(sm.findings)}  not reproduced: {len(sm.not_reproduced)}  "
                  f"wall: {sm.wall_s:.0f}s")
    for f in sm.findings:
        console.print(f"  {f.identity}: {f.faults} fault(s), found after {f.found_after_s:.0f}s -> ckpt-chaos run {f.file}")
    if sm.error:
        console.print(f"[red]search stopped: {sm.error}[/]")
    console.print(f"summary: {out / 'summary.json'}")
    return EXIT_FAILED if sm.findings or sm.error else EXIT_OK


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ckpt-chaos", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Fault-injection tests for distributed-training checkpoint/resume.")
    p.add_argument("--version", action="version", version=f"ckpt-chaos {__version__}")
    # One line each in `ckpt-chaos --help`: keep these helps short.
    sub = p.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")

    def command(name: str, summary: str, func) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=summary, description=f"{summary[0].upper()}{summary[1:]}.", epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        c.set_defaults(func=func)
        return c

    def selection(c: argparse.ArgumentParser, suite: str) -> None:
        c.add_argument("scenario", nargs="*", help="scenario names or files (default: the suite's)")
        c.add_argument("--suite", default=None,
                       help="suite to take when no scenario is named (default: every scenario of the project's "
                            f"folders, and the built-in catalogue's {suite} suite; full: every scenario)")
        c.add_argument("-k", help="keep scenarios whose name contains this, or that have it as a tag, fault kind "
                                  "or family")
        c.add_argument("--scenarios", action="append", metavar="DIR",
                       help="take scenarios from this folder (repeatable), instead of the project's "
                            "[tool.ckpt-chaos] scenarios; the built-in catalogue only with --builtin")
        c.add_argument("--builtin", action="store_true",
                       help="take the built-in catalogue too (in a project, or with --scenarios); a built-in "
                            "scenario named on the command line is found without it")

    def json_flag(c: argparse.ArgumentParser) -> None:
        c.add_argument("--json", action="store_true",
                       help="machine-readable output on stdout (human output, if any, on stderr)")

    c = command("list", "list scenarios with their suites, labels and descriptions", cmd_list)
    selection(c, "full")
    json_flag(c)

    c = command("run", "run scenarios and check them against a golden run", cmd_run)
    selection(c, "default")
    json_flag(c)
    c.add_argument("--out", metavar="DIR", help=f"output directory: runs and reports go in DIR/reports/<suite>/<time> "
                                                f"(default: ${config.ENV_OUT}, the project's out, else .)")
    c.add_argument("--reports", metavar="DIR", help="the reports folder itself (default: OUT/reports)")
    c.add_argument("--golden-dir", metavar="DIR",
                   help=f"cache of fault-free runs (default: ${config.ENV_CACHE}/golden or ~/.cache/ckpt-chaos/golden)")
    c.add_argument("--plots", choices=("failed", "all", "none"), default="failed",
                   help="draw the loss and timeline plots of the scenarios that failed (default), of all, or of "
                        "none; `ckpt-chaos report DIR` draws them all later")
    c.add_argument("--junitxml", metavar="FILE", help="also write JUnit XML: one testcase per scenario, its checks "
                                                      "as text")
    c.add_argument("--strict", action="store_true",
                   help=f"a scenario skipped for want of root, FUSE, libfiu... exits {EXIT_CANNOT_RUN} (CI)")
    c.add_argument("-x", "--exitfirst", action="store_true",
                   help="stop at the first scenario that fails (or passes although it declares a known "
                        "failure); with -n the running ones are stopped")
    c.add_argument("-n", "--jobs", type=_jobs, default=1, metavar="N",
                   help="run up to N scenarios at once, each in a worker process; 'auto': as the cores and "
                        "memory allow. Their ranks stay within 2 per core, and timing-sensitive scenarios and "
                        "those on Docker or netns nodes run alone, so that verdicts are those of a serial run")
    c.add_argument("--coverage", action="store_true",
                   help="measure which lines of the trainer the scenarios reach (every rank, relaunch and "
                        "uploader): an HTML report in the suite's coverage/ folder, linked from index.html "
                        "(needs the 'coverage' extra)")
    c.add_argument("--cov-source", action="append", metavar="PATH",
                   help="with --coverage: a folder or file to measure (repeatable; default: the reference "
                        "trainer, or the folder of a [command] trainer's script or module)")
    c.add_argument("--executor", choices=("local", "slurm"), default="local",
                   help="local (default): on this machine; slurm: one Slurm job per scenario, on a throwaway "
                        "cluster on this host or, with --slurm-conf or $SLURM_CONF, an existing one (docs/slurm.md)")
    c.add_argument("--slurm-nodes", type=_positive, metavar="N",
                   help="nodes of the throwaway cluster (default: 2), all on this host")
    c.add_argument("--slurm-conf", metavar="PATH",
                   help="slurm.conf of an existing cluster to submit to (default: $SLURM_CONF); the output and "
                        "golden folders must be on a file system its nodes share")
    c.add_argument("--slurm-arg", action="append", metavar="ARG",
                   help="an sbatch option for every job (repeatable), e.g. --slurm-arg=--partition=chaos "
                        "--slurm-arg=--time=30")

    c = command("check", "re-check a stored scenario run without running it", cmd_check)
    c.add_argument("run_dir", help="a scenario run directory: reports/<suite>/<time>/<scenario>")
    json_flag(c)

    c = command("ckpts", "list a run's checkpoints and validate each", cmd_ckpts)
    c.add_argument("dir", help="a run directory or its checkpoints/ directory")
    c.add_argument("--fast", action="store_true", help="skip SHA-256 verification")
    json_flag(c)

    c = command("report", "rebuild the HTML report of a stored suite run", cmd_report)
    c.add_argument("results", help="a suite run directory, e.g. reports/default/latest")
    c.add_argument("--no-plots", action="store_true", help="keep the plots already drawn (no 'report' extra needed)")
    c.add_argument("--browser", action="store_true",
                   help="open it in headless Chromium and fail on a script error, a plot that does not load, "
                        "a plot a scenario's run should have and has not (plot-error.txt), or a scenario "
                        "missing (writes report.png next to it)")

    c = command("cadence", "goodput against checkpoint interval (no training)", cmd_cadence)
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
    c.add_argument("--out", metavar="DIR", help="where the plot and figures go (default: OUT/reports/cadence)")

    c = command("explore", "search fault schedules for failures, shrink each one", cmd_explore)
    c.add_argument("--budget", type=_duration, default=_duration("20m"), help="search time, e.g. 3m, 20m, 1h")
    c.add_argument("--shrink-budget", type=_duration, default=None,
                   help="time to shrink each failure found (default: half the budget, 1 to 5 minutes)")
    c.add_argument("--families", default="process,storage",
                   help="fault families to compose: process, storage, topology (relaunches on fewer ranks), "
                        "remote (the upload tier)")
    c.add_argument("--trainer", default="reference_trainer", help="python module of the trainer (-m under torchrun)")
    c.add_argument("--seed", type=int, default=None, help="fixes the schedules generated (CI)")
    c.add_argument("--max-faults", type=int, default=4, help="steps per schedule (faults and training progress)")
    c.add_argument("--out", metavar="DIR", help="output directory: runs and summary.json go in "
                                                "DIR/reports/explore/<time> (default: as for run)")
    c.add_argument("--regressions", default=None,
                   help="where failures are written (default: found/ in the search's output folder)")
    c.add_argument("--golden-dir", metavar="DIR", help="cache of fault-free runs (default: as for run)")
    c.add_argument("--no-database", action="store_true", help="do not replay or keep failing examples")
    return p


def main(argv: list[str] | None = None) -> int:
    from ckpt_chaos.scenario import ScenarioError

    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (UsageError, ScenarioError) as e:
        print(f"ckpt-chaos {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
