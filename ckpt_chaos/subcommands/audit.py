"""``ckpt-chaos audit``: the trainer's fault-free run, its profile, a scenario per fault that applies
to what it showed, those run with ``ckpt-chaos run``'s suite runner, then the matrix of fault × point
→ verdict (``ckpt_chaos/audit/``). The trainer comes from the command line after ``--``, else from the
project's ``[tool.ckpt-chaos.audit]``."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
import time
from pathlib import Path

from ckpt_chaos import config
from ckpt_chaos.subcommands.common import (EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNKNOWN,
                                           EXIT_USAGE, UsageError, json_out, needs, project)

TABLE = "tool.ckpt-chaos.audit"
# [tool.ckpt-chaos.audit] key -> (type, example): the same settings as the options
KEYS = {"argv": (list, 'argv = ["train.py", "--ckpt-dir", "{ckpt_dir}"]'), "nproc": (int, "nproc = 2"),
        "launcher": (str, 'launcher = "torchrun"'), "relaunch_args": (list, 'relaunch_args = ["--resume"]'),
        "env": (dict, 'env = { TMPDIR = "{run_dir}/tmp" }'), "key": (list, 'key = ["src/**/*.py"]'),
        "out": (str, 'out = "build/audit"'), "jobs": (int, "jobs = 2"),
        "families": (list, 'families = ["mid-write", "kill"]'), "complete": ((str, dict), 'complete = "step_*"'),
        "save_every": (int, "save_every = 100"), "keep_last": (int, "keep_last = 2"),
        "changes": (list, 'changes = ["seed=7", "save-every=2"]'), "resumable": (list, 'resumable = ["save-every"]'),
        "resize": (list, 'resize = ["1=resumes"]'), "budget": ((str, int), 'budget = "10m"')}


def audit_options(c: argparse.ArgumentParser, jobs_type) -> None:
    from ckpt_chaos.audit import FAMILIES

    c.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- ARGV",
                   help="the trainer's command, with {ckpt_dir} where its checkpoint folder goes (default: "
                        f"[{TABLE}] argv of the project's pyproject.toml)")
    c.add_argument("--nproc", type=int, default=None, help="ranks (default: 2)")
    c.add_argument("--launcher", choices=("torchrun", "self"), default=None,
                   help="torchrun (default): the harness starts the ranks; self: ARGV starts its own")
    c.add_argument("--relaunch-args", default=None, metavar="ARGS",
                   help="arguments added on every relaunch, one string (e.g. '--resume auto')")
    c.add_argument("--env", action="append", default=None, metavar="K=V", help="set for the trainer (repeatable)")
    c.add_argument("--key", action="append", default=None, metavar="GLOB",
                   help="files whose change makes a new fault-free run (default: the files ARGV names)")
    c.add_argument("--complete", default=None, metavar="GLOB",
                   help="declare the trainer's newest-complete-checkpoint rule (a glob in its checkpoint folder) "
                        "instead of inferring it")
    c.add_argument("--save-every", type=int, default=None, help="declare the steps between saves")
    c.add_argument("--keep-last", type=int, default=None, help="declare how many checkpoints it keeps")
    c.add_argument("--change", action="append", default=None, metavar="KEY=VALUE",
                   help="a relaunch with this option changed (given as --KEY=VALUE), expected refused unless KEY is "
                        "--resumable (repeatable)")
    c.add_argument("--resumable", action="append", default=None, metavar="KEY",
                   help="an option a resume may take changed: its --change must resume (repeatable)")
    c.add_argument("--resize", action="append", default=None, metavar="N=resumes|refused",
                   help="a relaunch on N ranks, which the trainer declares it resumes from or refuses (repeatable)")
    c.add_argument("--families", default=None,
                   help=f"fault families to generate, comma-separated, of {','.join(FAMILIES)} (default: all but "
                        "corrupt, whose check needs a rejection event a [command] trainer does not write)")
    c.add_argument("--out", metavar="DIR",
                   help="where the profile, scenarios and runs go (default: OUT/audit/<trainer>, OUT as for run)")
    c.add_argument("--write-scenarios", metavar="DIR", help="write the scenario files here (to keep in the repo)")
    c.add_argument("--discover-only", action="store_true", help="print the trainer's profile and stop")
    c.add_argument("--no-run", action="store_true",
                   help="write the scenarios and stop, running none (not even the stop-and-relaunch run)")
    c.add_argument("-n", "--jobs", type=jobs_type, default=None, metavar="N",
                   help="scenarios at once (default 1; 'auto' as the machine allows)")
    c.add_argument("--golden-dir", metavar="DIR", help="cache of fault-free runs (default: as for run)")
    c.add_argument("--budget", default=None, metavar="TIME",
                   help="after the suite, search this long (90s, 10m, 1h, or seconds) for two of its faults, each "
                        "passed alone, that fail composed: a launch-ending fault, then another in the relaunch "
                        "(docs/audit.md, The search; default: no search)")
    c.add_argument("--seed", type=int, default=0, help="the search's seed: the order it composes the faults in")
    c.add_argument("--json", action="store_true", help="the profile (and the matrix) as JSON on stdout")


def _table_value(file, table: dict, key: str):
    want, example = KEYS[key]
    v = table[key]
    if key in ("argv", "relaunch_args", "key", "families", "changes", "resumable", "resize") and isinstance(v, str):
        v = shlex.split(v) if key != "families" else v.split(",")
    if not isinstance(v, want) or isinstance(v, bool) or (isinstance(v, list)
                                                          and not all(isinstance(x, str) for x in v)):
        raise UsageError(f"{file}: {TABLE}.{key}: found {v!r}; write e.g. {example}")
    return v


def spec_of(args: argparse.Namespace):
    """The trainer and settings: the options, over the project's [tool.ckpt-chaos.audit]."""
    from ckpt_chaos.audit import Spec

    argv = list(args.argv or [])
    if argv[:1] == ["--"]:
        argv = argv[1:]
    proj = project()
    table = proj.audit or {}
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise UsageError(f"{proj.file}: {TABLE}.{unknown[0]}: unknown key; allowed keys: {', '.join(KEYS)}")
    given = {k: _table_value(proj.file, table, k) for k in table}
    if "out" in given:  # as [tool.ckpt-chaos] out: relative to the pyproject.toml
        given["out"] = str((proj.file.parent / given["out"]).resolve())
    source = "the command line" if argv else f"{proj.file} [{TABLE}]"
    if not argv:
        argv = given.get("argv", [])
    if not argv:
        raise UsageError("no trainer: give its command after --, e.g. ckpt-chaos audit -- train.py --ckpt-dir "
                         f"{{ckpt_dir}}; or declare it in pyproject.toml: [{TABLE}] argv = [...]")
    env = dict(given.get("env", {}))
    for kv in args.env or []:
        k, eq, v = kv.partition("=")
        if not eq or not k:
            raise UsageError(f"--env {kv}: give KEY=VALUE")
        env[k] = v
    relaunch = shlex.split(args.relaunch_args) if args.relaunch_args is not None else given.get("relaunch_args", [])
    if not any("{ckpt_dir}" in a for a in [*argv, *env.values()]):
        where = "" if source == "the command line" else f"{source}: "
        raise UsageError(f"{where}the command does not name {{ckpt_dir}}: put it where the trainer's checkpoint "
                         "folder goes (e.g. --ckpt-dir {ckpt_dir}), so that each run writes its own checkpoints "
                         "where the harness watches them")
    declared = {k: v for k, v in (("complete", args.complete or given.get("complete")),
                                  ("save_every", args.save_every or given.get("save_every")),
                                  ("keep_last", args.keep_last or given.get("keep_last"))) if v}
    nproc = args.nproc or given.get("nproc", 2)
    if nproc < 1:
        raise UsageError(f"--nproc {nproc}: give 1 or more ranks")
    spec = Spec(argv=argv, nproc=nproc, launcher=args.launcher or given.get("launcher", "torchrun"),
                relaunch_argv=relaunch, env=env, key=args.key or given.get("key", []), declared=declared,
                source=source)
    spec.scenario()  # the [command] table's own checks: placeholders, launcher
    return spec, given


def changes_of(args: argparse.Namespace, given: dict) -> tuple:
    """The relaunch changes asked for (``--change``, else the table's ``changes``), each expected refused
    unless its key is declared resumable (``--resumable``, else the table's ``resumable``)."""
    from ckpt_chaos.audit.changes import parse_change

    resumable = args.resumable if args.resumable is not None else given.get("resumable", [])
    texts = args.change if args.change is not None else given.get("changes", [])
    try:
        changes = tuple(parse_change(t, resumable) for t in texts)
    except ValueError as e:
        raise UsageError(str(e)) from None
    unused = sorted(set(resumable) - {c.key for c in changes})
    if unused:
        raise UsageError(f"--resumable {unused[0]}: no --change {unused[0]}=VALUE to expect resumed; add one, or "
                         "drop it")
    return changes


def resizes_of(args: argparse.Namespace, given: dict, nproc: int) -> tuple:
    """The world-size changes declared (``--resize``, else the table's ``resize``)."""
    from ckpt_chaos.audit.changes import parse_resize

    try:
        resizes = tuple(parse_resize(t, nproc) for t in (args.resize if args.resize is not None
                                                         else given.get("resize", [])))
    except ValueError as e:
        raise UsageError(str(e)) from None
    twice = sorted({r.world for r in resizes if sum(x.world == r.world for x in resizes) > 1})
    if twice:
        raise UsageError(f"--resize {twice[0]}: declared more than once; a trainer resumes on {twice[0]} ranks or "
                         "refuses to, so give one of the two")
    return resizes


def cmd_audit(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ckpt_chaos.audit import generate as gen_mod
    from ckpt_chaos.audit import DEFAULT_FAMILIES, FAMILIES, golden, matrix
    from ckpt_chaos.audit.discover import DiscoveryError, describe, discover
    from ckpt_chaos.run.command import missing
    from ckpt_chaos.scenario import ScenarioError

    spec, given = spec_of(args)
    families = tuple(f.strip() for f in (args.families.split(",") if args.families else
                                         given.get("families", DEFAULT_FAMILIES)) if f.strip())
    bad = [f for f in families if f not in FAMILIES]
    if bad:
        raise UsageError(f"--families {bad[0]}: unknown family; choose from {', '.join(FAMILIES)}")
    changes = changes_of(args, given)
    resizes = resizes_of(args, given, spec.nproc)
    budget = budget_of(args, given)
    if budget and (code := needs("search", "audit --budget")) is not None:
        return code
    console = Console(stderr=args.json)
    say = lambda text: console.print(text, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    if why := missing(spec.scenario()):
        print(f"ckpt-chaos audit: {why}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    started = time.monotonic()
    root = Path(args.golden_dir) if args.golden_dir else config.golden_dir()
    say(f"fault-free run of: {' '.join(spec.argv)} ({spec.nproc} ranks, {spec.launcher})")
    try:
        g = golden(spec, root)
    except ScenarioError as e:
        print(f"ckpt-chaos audit: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        profile = discover(g, spec.declared)
    except DiscoveryError as e:
        print(f"ckpt-chaos audit: {e}", file=sys.stderr)
        return EXIT_USAGE
    profile.command = {**profile.command, "key": spec.command_table()["key"]}
    out = (Path(args.out).resolve() if args.out else
           Path(given["out"]).resolve() if given.get("out") else
           config.out_dir(None, project()) / "audit" / gen_mod.trainer_name(profile))
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(profile.to_json() + "\n")
    for line in describe(profile):
        say(line)
    phases = {"fault_free_and_profile_s": round(time.monotonic() - started, 1)}
    say(f"profile: {out / 'profile.json'} ({phases['fault_free_and_profile_s']:.0f}s)")
    if profile.complete is None:
        print("ckpt-chaos audit: cannot tell which checkpoint the trainer resumes from: "
              + "; ".join(profile.problems) + " (--complete, or complete in [tool.ckpt-chaos.audit])", file=sys.stderr)
        return EXIT_USAGE
    if not args.no_run:
        from ckpt_chaos.audit import relaunch

        say("stop and relaunch: every rank killed between saves, then relaunched as each scenario will be")
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            r = relaunch.stop_and_relaunch(profile, out / "relaunch", root)
        profile.relaunch = r.to_dict() if r else None
        (out / "profile.json").write_text(profile.to_json() + "\n")
        phases["stop_and_relaunch_s"] = round(time.monotonic() - started - sum(phases.values()), 1)
        for line in relaunch.describe(r):
            say(line)
        if r is not None and (why := relaunch.never_resumed(profile, r)):
            print(f"ckpt-chaos audit: {why}", file=sys.stderr)
            return EXIT_USAGE
    if args.discover_only:
        if args.json:
            json_out(profile.to_dict())
        return EXIT_OK

    folder = Path(args.write_scenarios) if args.write_scenarios else out / "scenarios"
    gen = gen_mod.check(gen_mod.generate(profile, families, changes, resizes), folder, g)
    paths = gen_mod.write(gen, folder)
    say(f"{len(paths)} scenario(s) in {folder}")
    for x in gen:
        if x.left_out:
            say(f"left out: {x.fault} at {x.point}: {x.left_out}")
    if args.no_run or not paths:
        return EXIT_OK
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        code, results = _run(args.parse, paths, out, root, args.jobs or given.get("jobs", 1))
    if code == EXIT_INTERRUPTED:
        return code  # the suite runner said what it stopped and wrote its report
    cs = matrix.cells(gen, results)
    wall = round(time.monotonic() - started, 1)
    phases["scenarios_s"] = round(wall - sum(phases.values()), 1)
    (out / "matrix.json").write_text(json_out_text({"profile": str(out / "profile.json"), "results": str(results),
                                                    "wall_s": wall, "phases": phases, "cells": cs}))
    if results is not None:  # the suite's HTML report, headed by the grid
        from ckpt_chaos.report.results import rebuild

        (results.parent / matrix.GRID).write_text(json_out_text({"cells": cs}))
        rebuild(results.parent, plots=False)
    console.print(matrix.table(cs))
    found = matrix.findings(cs)
    for c in found:
        say(f"FINDING {c['fault']} at {c['point']}: {c['check'] or c['verdict']}: {c['detail']}  "
            f"(repro: {folder / (c['scenario'] + '.toml')}; run: {c['run_dir']})")
    say(f"audit: {len(cs)} cell(s), {len(found)} finding(s), {sum(c['verdict'] == 'left out' for c in cs)} left out; "
        f"{time.monotonic() - started:.0f}s; report: {results.parent / 'index.html' if results else '-'}")
    searched = None
    if budget:
        from ckpt_chaos.audit import search

        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            searched = search.run_after_suite(profile, gen, cs, out / "search", root, budget, args.seed, say)
    if args.json:
        json_out({"profile": profile.to_dict(), "cells": cs, **({"search": searched.to_dict()} if searched else {})})
    # as run: a finding fails; cells that could not tell, with no finding beside them, are exit 4
    if searched is not None and searched.findings:
        return EXIT_FAILED
    return EXIT_FAILED if any(c["verdict"] != "unknown" for c in found) else EXIT_UNKNOWN if found else EXIT_OK


def budget_of(args: argparse.Namespace, given: dict) -> float | None:
    """The search's budget in seconds (``--budget``, else the table's ``budget``); None: no search."""
    from ckpt_chaos.audit.search import parse_budget

    value = args.budget if args.budget is not None else given.get("budget")
    if value is None:
        return None
    try:
        return parse_budget(value)
    except ValueError as e:
        where = f"--budget {value}" if args.budget is not None else f"{project().file}: {TABLE}.budget"
        raise UsageError(f"{where}: {e}") from None


def json_out_text(data) -> str:
    import json

    return json.dumps(data, indent=1) + "\n"


def _run(parse, paths: list[Path], out: Path, golden: Path, jobs: int) -> tuple[int, Path | None]:
    """Run the scenarios with ``ckpt-chaos run``'s suite runner (its progress, table and report), its
    arguments parsed by ``parse`` (the CLI's parser's); its exit status and the suite run's results.json."""
    from ckpt_chaos.subcommands.run import cmd_run

    reports = out / "reports"
    args = parse(["run", *map(str, paths), "--reports", str(reports), "--golden-dir", str(golden),
                                "-n", str(jobs), "--plots", "none"])
    code = cmd_run(args)
    latest = reports / "custom" / "latest" / "results.json"
    return code, latest if latest.is_file() else None
