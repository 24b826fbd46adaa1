"""``python -m ckpt_chaos.mutation``: the command line of mutation testing (``make mutation``), and
cosmic-ray's test command (``test``)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from ckpt_chaos import mutation
from ckpt_chaos.mutation import RESULTS, ROOT, WORK, MutationError
from ckpt_chaos.mutation.cache import CACHE
from ckpt_chaos.mutation.driver import cmd_run, report_only, resume, work_dir
from ckpt_chaos.mutation.scope import OPERATOR_SETS, TARGETS
from ckpt_chaos.mutation.verdict import cmd_test


def _interrupted(signum: int, frame) -> None:
    raise KeyboardInterrupt


def own_checkout_first() -> None:
    """Every process a run starts (cosmic-ray, its test command, the ckpt-chaos runs under it) imports
    the harness of this package's own checkout: in a worktree of another commit (a run resumed where
    it began) the installed entry point would import the editable install's harness instead."""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        dict.fromkeys([str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m ckpt_chaos.mutation", description=mutation.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    t = sub.add_parser("test", help="(cosmic-ray's test command) run the mutant now in the current directory")
    t.add_argument("--state", required=True)
    ap.add_argument("--files", nargs="+", metavar="FILE", help=f"files to mutate (default: {', '.join(TARGETS)}; "
                                                              "with --example, its train.py)")
    ap.add_argument("--example", metavar="NAME",
                    help="score examples/NAME/train.py (the whole file) under every scenario of "
                         "examples/NAME/scenarios instead of the reference trainer's checkpoint path; results "
                         "in mutation-OPERATORS-NAME.json, work in build/mutation-OPERATORS-NAME")
    ap.add_argument("--limit", type=int, help="a random sample of this many mutants (default: all)")
    ap.add_argument("--seed", type=int, default=0, help="the sample's seed (default: 0)")
    ap.add_argument("--coverage-from", metavar="DIR",
                    help="a `ckpt-chaos run --coverage` of the default suite from this tree, e.g. "
                         "reports/default/latest; with --example, of every scenario of its folder (--suite full "
                         "--scenarios examples/NAME/scenarios) (default: made first, about 10 minutes)")
    ap.add_argument("--golden-dir", metavar="DIR", help="the golden runs of the pristine tree (default: those the "
                                                        "coverage run used, or WORK/golden)")
    ap.add_argument("--operators", choices=sorted(OPERATOR_SETS), default="core",
                    help="cosmic-ray's own operators (core, the default), the checkpoint operators of "
                         "ckpt_chaos.mutation.operators (checkpoint), or both (all)")
    ap.add_argument("--golden-tree", metavar="DIR",
                    help="the tree whose trainer code keys the golden runs (default: this repository); for a "
                         "--coverage-from baseline made before the trainer changed in a way that leaves its "
                         "trajectory alone")
    ap.add_argument("--work", help=f"scratch folder (default: {WORK.relative_to(ROOT)}, "
                                   f"{WORK.relative_to(ROOT)}-OPERATORS for other operators)")
    ap.add_argument("--cache", default=str(CACHE), help="where verdicts are cached by the hash of the mutated file "
                                                        f"and operator (default: {CACHE.relative_to(ROOT)})")
    ap.add_argument("--no-cache", action="store_true", help="run every mutant, and cache nothing")
    ap.add_argument("--mutant", action="append", metavar="FILE:LINE[:OPERATOR[:OCCURRENCE]]",
                    help="only these mutants (repeatable), e.g. a survivor again after a new scenario: "
                         "reference_trainer/checkpoint.py:277:core/AddNot")
    ap.add_argument("--results", default=str(RESULTS), help="where mutation.json and mutation.md go "
                                                            f"(default: {RESULTS.relative_to(ROOT)})")
    ap.add_argument("--jobs", metavar="N", help="a mutant's scenarios side by side, as `ckpt-chaos run -n N` "
                                                "(auto: as the machine allows; default 1); -x still stops the "
                                                "rest at the first failure")
    ap.add_argument("--executor", choices=["local", "slurm"],
                    help="slurm: each scenario of a mutant as a Slurm job (`ckpt-chaos run --executor slurm`), "
                         "on a throwaway cluster on this host unless --slurm-conf names one")
    ap.add_argument("--slurm-nodes", metavar="N", help="the throwaway cluster's nodes (ckpt-chaos run's)")
    ap.add_argument("--slurm-conf", metavar="PATH", help="an existing cluster's slurm.conf (ckpt-chaos run's)")
    ap.add_argument("--budget", type=float, metavar="SECONDS",
                    help="stop running mutants after this long and report those done (default: no limit)")
    ap.add_argument("--resume", action="store_true",
                    help="go on with the last run in --work: its mutants still pending (cut by --budget)")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: write the results again from the last run in --work (after marking an "
                         "equivalent mutant)")
    ap.add_argument("--keep-runs", action="store_true", help="keep each mutant's scenario runs in WORK/runs")
    args = ap.parse_args(argv)
    args.argv = argv
    if args.work is None:
        args.work = str(work_dir(args.operators, args.example))
    own_checkout_first()
    try:
        if args.cmd == "test":
            return cmd_test(Path(args.state))
        # A run started in the background ignores SIGINT: `kill PID` stops it as Ctrl-C does, the
        # mutant running left pending and every result so far kept for --resume.
        signal.signal(signal.SIGTERM, _interrupted)
        return report_only(args) if args.report_only else resume(args) if args.resume else cmd_run(args)
    except MutationError as e:
        print(f"mutation: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
