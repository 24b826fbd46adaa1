"""``ckpt-chaos explore``: search random fault schedules for a failure, shrink each one found."""

from __future__ import annotations

import argparse
import signal
import time

from ckpt_chaos import config
from ckpt_chaos.subcommands.common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, UsageError, needs, project


def cmd_explore(args: argparse.Namespace) -> int:
    """Search random fault schedules for a failure; write each one found, shrunk, as a scenario file."""
    if args.command_file is not None:
        if args.trainer is not None:
            raise UsageError(f"--trainer {args.trainer} and --command {args.command_file}: give one; --trainer names a "
                             "Python module trainer (the reference trainer's probe points), --command a [command] "
                             "trainer (a scenario file with a [command] table, or an audit's profile.json)")
        only = [o for o, v in (("--shrink-budget", args.shrink_budget), ("--max-faults", args.max_faults)) if v]
        if only:
            raise UsageError(f"{only[0]} is --trainer's: with --command the search composes two faults and shrinks "
                             "each failure by dropping one; drop the option")
        if (code := needs("search", "explore")) is not None:
            return code
        return _explore_command(args)
    if (code := needs("search", "explore")) is not None:
        return code
    from rich.console import Console

    from ckpt_chaos.search.explore import Search
    from ckpt_chaos.search.schedule import KINDS

    args.trainer = args.trainer or "reference_trainer"
    args.max_faults = args.max_faults or 4
    families = [f for f in (args.families or "process,storage").split(",") if f]
    bad = [f for f in families if f not in KINDS]
    if bad or not families:
        raise UsageError(f"--families: unknown family {bad[0] if bad else '(none)'}; searchable: {', '.join(KINDS)}")
    console = Console()
    out = config.out_dir(args.out, project()) / "reports" / "explore" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
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


def _explore_command(args: argparse.Namespace) -> int:
    """``explore --command FILE``: the audit's search (``ckpt_chaos/audit/search.py``) on a ``[command]``
    trainer, from its scenario file's fault-free run or from an audit's profile.json."""
    from pathlib import Path

    from rich.console import Console

    from ckpt_chaos.audit import DEFAULT_FAMILIES, FAMILIES
    from ckpt_chaos.audit import search as audit_search
    from ckpt_chaos.audit.discover import DiscoveryError

    families = tuple(f.strip() for f in args.families.split(",") if f.strip()) if args.families else DEFAULT_FAMILIES
    bad = [f for f in families if f not in FAMILIES]
    if bad or not families:
        raise UsageError(f"--families {bad[0] if bad else '(none)'}: with --command, the audit's families: "
                         f"{', '.join(FAMILIES)}")
    path = Path(args.command_file)
    if not path.is_file() or path.suffix not in (".toml", ".json"):
        raise UsageError(f"--command {path}: {'no such file' if not path.is_file() else 'neither .toml nor .json'}; "
                         "give a scenario file with a [command] table, or an audit's profile.json")
    console = Console()
    say = lambda text: console.print(text, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    root = Path(args.golden_dir) if args.golden_dir else config.golden_dir()
    out = (Path(args.out).resolve() / "reports" / "explore" if args.out else
           config.out_dir(None, project()) / "reports" / "explore") / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    seed = 0 if args.seed is None else args.seed
    say(f"ckpt-chaos explore: the [command] trainer of {path}, families {', '.join(families)}, budget "
        f"{args.budget:.0f}s, seed {seed}; runs in {out}")
    try:
        profile, gen, verdicts = audit_search.from_file(path, root, families)
    except (ValueError, DiscoveryError) as e:
        raise UsageError(str(e)) from None
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))

    def show(kind: str, obj) -> None:
        if kind == "run":
            say(f"  {obj.identity or obj.verdict:<16} {' then '.join(obj.composed)}  ({obj.wall_s:.0f}s)")

    try:
        sm = audit_search.search(profile, gen, out, root, args.budget, seed, verdicts, on_event=show)
    except KeyboardInterrupt:
        console.print("[red]interrupted: every process of the running schedule was killed[/]")
        return EXIT_INTERRUPTED
    if args.regressions:  # the findings kept where the caller wants them
        keep = Path(args.regressions)
        keep.mkdir(parents=True, exist_ok=True)
        for f in sm.findings:
            moved = keep / Path(f.file).name
            Path(f.file).replace(moved)
            f.file = str(moved)
    for line in audit_search.describe(sm, out):
        say(line)
    return EXIT_FAILED if sm.findings else EXIT_OK
