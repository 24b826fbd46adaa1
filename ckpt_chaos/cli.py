"""The ``ckpt-chaos`` command line.

``list`` and ``run`` take the scenarios of the folders given with ``--scenarios``, else of the
project's folders (``[tool.ckpt-chaos] scenarios`` in its ``pyproject.toml``); the built-in catalogue
only with ``--builtin`` (or ``builtin = true``), or where there is no such folder. A scenario named on
the command line is also found in the project's folders and the built-in catalogue. Runs and
reports go under the output directory (``ckpt_chaos.config``). Human output goes to stderr when
``--json`` puts the machine-readable one on stdout.

This module parses the command line; each subcommand is in ``ckpt_chaos/subcommands/``.
"""

from __future__ import annotations

import argparse
import sys

from ckpt_chaos import __version__, config
from ckpt_chaos.subcommands.audit import audit_options, cmd_audit
from ckpt_chaos.subcommands.cadence import cmd_cadence
from ckpt_chaos.subcommands.common import (EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNKNOWN,
                                           EXIT_USAGE, UsageError)
from ckpt_chaos.subcommands.explore import cmd_explore
from ckpt_chaos.subcommands.run import cmd_run
from ckpt_chaos.subcommands.selection import cmd_list
from ckpt_chaos.subcommands.stored import cmd_check, cmd_ckpts, cmd_report

# under the names the tests know them by, from when they were defined here
from ckpt_chaos.subcommands.common import project as _project  # noqa: F401
from ckpt_chaos.subcommands.selection import select_scenarios as _select  # noqa: F401
from ckpt_chaos.subcommands.selection import suite_name as _suite_name  # noqa: F401

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
  {EXIT_UNKNOWN}    run: no scenario failed, but one could not tell (a planned fault never
       fired, the evidence a check needs is missing): the run did not exercise
       what the scenario states; a scenario may allow it (expect.may_be_unknown)
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

    c = command("list", "list scenarios with their suites, labels and descriptions", cmd_list)
    _selection(c, "full")
    _json_flag(c)

    c = command("run", "run scenarios and check them against a golden run", cmd_run)
    _selection(c, "default")
    _json_flag(c)
    _run_options(c)

    c = command("check", "re-check a stored scenario run without running it", cmd_check)
    c.add_argument("run_dir", help="a scenario run directory: reports/<suite>/<time>/<scenario>")
    _json_flag(c)

    c = command("ckpts", "list a run's checkpoints and validate each", cmd_ckpts)
    c.add_argument("dir", help="a run directory or its checkpoints/ directory")
    c.add_argument("--fast", action="store_true", help="skip SHA-256 verification")
    _json_flag(c)

    c = command("report", "rebuild the HTML report of a stored suite run", cmd_report)
    c.add_argument("results", help="a suite run directory, e.g. reports/default/latest")
    c.add_argument("--no-plots", action="store_true", help="keep the plots already drawn (no 'report' extra needed)")
    c.add_argument("--browser", action="store_true",
                   help="open it in headless Chromium and fail on a script error, a plot that does not load, "
                        "a plot a scenario's run should have and has not (plot-error.txt), or a scenario "
                        "missing (writes report.png next to it)")

    _cadence_options(command("cadence", "goodput against checkpoint interval (no training)", cmd_cadence))
    _explore_options(command("explore", "search fault schedules for failures, shrink each one", cmd_explore))
    audit_options(command("audit", "a trainer's resilience matrix from its command line alone", cmd_audit), _jobs)
    return p


def _selection(c: argparse.ArgumentParser, suite: str) -> None:
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


def _json_flag(c: argparse.ArgumentParser) -> None:
    c.add_argument("--json", action="store_true",
                   help="machine-readable output on stdout (human output, if any, on stderr)")


def _run_options(c: argparse.ArgumentParser) -> None:
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
    c.add_argument("--repeat", type=_positive, default=1, metavar="N",
                   help="run each scenario N times and compare: one whose verdict or failing checks differ "
                        "between runs fails as flaky, naming what differed (the last run's folders are the "
                        "report's, the others in repeat/run-K)")
    c.add_argument("--load", choices=("cpu", "io", "both"),
                   help="busy the machine while the scenarios run: stress-ng (Debian's stress-ng) on every "
                        "core, on the disk of the output folder, or both; stopped with the run. Without "
                        f"stress-ng nothing runs (exit {EXIT_CANNOT_RUN})")
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


def _cadence_options(c: argparse.ArgumentParser) -> None:
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


def _explore_options(c: argparse.ArgumentParser) -> None:
    c.add_argument("--budget", type=_duration, default=_duration("20m"), help="search time, e.g. 3m, 20m, 1h")
    c.add_argument("--shrink-budget", type=_duration, default=None,
                   help="time to shrink each failure found (default: half the budget, 1 to 5 minutes)")
    c.add_argument("--families", default=None,
                   help="fault families to compose: process, storage (the default), topology (relaunches on fewer "
                        "ranks), remote (the upload tier); with --command, the audit's families (default: as audit's)")
    c.add_argument("--trainer", default=None,
                   help="python module of the trainer (-m under torchrun; default: reference_trainer)")
    c.add_argument("--command", dest="command_file", metavar="FILE",
                   help="a [command] trainer instead: a scenario file with a [command] table, or an audit's "
                        "profile.json; composes two of the audit's faults across launches (docs/audit.md, The search)")
    c.add_argument("--seed", type=int, default=None, help="fixes the schedules generated (CI)")
    c.add_argument("--max-faults", type=int, default=None,
                   help="steps per schedule (faults and training progress; default 4)")
    c.add_argument("--out", metavar="DIR", help="output directory: runs and summary.json go in "
                                                "DIR/reports/explore/<time> (default: as for run)")
    c.add_argument("--regressions", default=None,
                   help="where failures are written (default: found/ in the search's output folder)")
    c.add_argument("--golden-dir", metavar="DIR", help="cache of fault-free runs (default: as for run)")
    c.add_argument("--no-database", action="store_true", help="do not replay or keep failing examples")


def _positive(text: str, want: str = "a whole number of 1 or more") -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give {want}")
    return n


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
    return _positive(text, "a number of scenarios at once (1 or more) or auto")


def main(argv: list[str] | None = None) -> int:
    from ckpt_chaos.scenario import ScenarioError

    p = parser()
    args = p.parse_args(argv)
    args.parse = p.parse_args  # for a command that runs another (audit runs run): no import of this module
    try:
        return args.func(args)
    except (UsageError, ScenarioError) as e:
        print(f"ckpt-chaos {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
