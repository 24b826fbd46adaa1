"""Which scenarios ``list`` and ``run`` take: ``--scenarios``, else the project's folders; the built-in
catalogue only with ``--builtin`` (or ``builtin = true``), or where there is no such folder; a scenario
named on the command line is also found in the project's folders and the built-in catalogue."""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from ckpt_chaos.subcommands.common import EXIT_OK, UsageError, json_out, project


def _given(args: argparse.Namespace) -> list[Path]:
    """The folders of ``--scenarios``."""
    given = [Path(d) for d in args.scenarios or []]
    for d in given:
        if not d.is_dir():
            raise UsageError(f"--scenarios {d}: not a folder; give a folder of scenario .toml files")
    return given


def scenario_dirs(args: argparse.Namespace) -> list[Path]:
    """The folders ``list`` and ``run`` select from: ``--scenarios``, else the project's; the built-in
    catalogue only with ``--builtin`` (or ``builtin = true``), or when there is neither."""
    return project().scenario_dirs(_given(args), builtin=args.builtin)


def _project_selected(args: argparse.Namespace) -> bool:
    """Folders of a project's (``--scenarios``, ``[tool.ckpt-chaos] scenarios``) are selected."""
    return bool(_given(args) or project().scenarios)


def _files(d: Path) -> list[Path]:
    # pyproject.toml is a project's configuration, never a scenario (as for the pytest plugin)
    return [p for p in sorted(d.rglob("*.toml")) if p.name != "pyproject.toml"]


def _catalogue(args: argparse.Namespace) -> tuple[dict, dict]:
    """Every scenario in the folders, by name; a name used twice is an error naming both files. And the
    files that do not load, by the name they would have, with their error: one bad file does not stop
    the others of its folder from being named and run."""
    from ckpt_chaos.scenario import ScenarioError, load

    by_name, invalid = {}, {}
    for d in scenario_dirs(args):
        for path in _files(d):
            try:
                s = load(path)
            except ScenarioError as e:
                invalid.setdefault(_name_of(path), e)
                continue
            if s.name in by_name:
                raise UsageError(f"{path}: name: {s.name!r} is also the name of {by_name[s.name].source}; "
                                 "names must be unique across the scenario folders: rename one of the files "
                                 "(or set its `name`)")
            by_name[s.name] = s
    return by_name, invalid


def _name_of(path: Path) -> str:
    """The name a scenario file that does not load would have: its ``name`` where it can be read, else
    the file's name without ``.toml``."""
    import tomllib

    try:
        name = tomllib.loads(path.read_text()).get("name")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        name = None
    return name if isinstance(name, str) and name else path.stem


def _lookup(args: argparse.Namespace, name: str):
    """A scenario named on the command line that the folders selected lack: the first of that name in the
    project's folders or the built-in catalogue (naming one asks for it), else None. A file of that name
    that does not load raises its error; other such files are passed over."""
    from ckpt_chaos.scenario import ScenarioError, load

    selected = scenario_dirs(args)
    for d in project().lookup_dirs(_given(args), builtin=args.builtin):
        if d not in selected:
            for path in _files(d):
                try:
                    s = load(path)
                except ScenarioError:
                    if _name_of(path) == name:
                        raise
                    continue
                if s.name == name:
                    return s
    return None


def _not_loaded(invalid: dict) -> str:
    return "; ".join(str(e) for e in invalid.values())


def select_scenarios(args: argparse.Namespace) -> list:
    """Scenarios named on the command line (names or files), else the suite's: ``--suite S`` from every
    folder selected; without it, every scenario of the project's folders and, of the built-in catalogue,
    its ``default`` suite (``run``) or all of it (``list``)."""
    from ckpt_chaos.scenario import FULL_SUITE, builtin, load

    by_name, invalid = _catalogue(args)
    if args.scenario:
        chosen = []
        for ref in args.scenario:
            if ref in by_name:
                chosen.append(by_name[ref])
            elif ref in invalid:
                raise UsageError(str(invalid[ref]))
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
        for name, e in invalid.items():  # said, not fatal: none of them was asked for
            print(f"ckpt-chaos {args.command}: {name} not loaded: {e}", file=sys.stderr)
    else:
        if invalid:  # the suite asked for holds them
            raise UsageError(f"{len(invalid)} scenario file(s) of the folders selected do not load: "
                             f"{_not_loaded(invalid)}")
        ordered = sorted(by_name.values(), key=lambda s: s.name)
        if args.suite is not None:
            chosen = [s for s in ordered if args.suite in s.suites]
        else:
            of_builtin = "default" if args.command == "run" else FULL_SUITE
            chosen = [s for s in ordered if of_builtin in s.suites or not builtin(s.source)]
    if args.k:
        chosen = [s for s in chosen if args.k in s.name or args.k in s.labels]
    return chosen


def suite_name(args: argparse.Namespace) -> str:
    """The suite a run reports as (its folder, reports/<suite>): ``custom`` when scenarios are named,
    else ``--suite``; without it ``project`` where a project's folders are selected, else ``default``."""
    if args.scenario:
        return "custom"
    return args.suite or ("project" if _project_selected(args) else "default")


def cmd_list(args: argparse.Namespace) -> int:
    chosen = select_scenarios(args)
    if args.json:
        json_out([{"name": s.name, "description": s.description, "labels": s.labels, "suites": s.suites,
                    "file": s.source, "known_failure": s.expect.known_failure} for s in chosen])
        return EXIT_OK
    for s in chosen:
        labels = " ".join(s.labels)
        print(f"{s.name:<44} {','.join(s.suites):<13} [{labels}]  {s.description}")
    return EXIT_OK
