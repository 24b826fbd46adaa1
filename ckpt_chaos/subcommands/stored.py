"""The subcommands over what a run left: ``check`` re-checks a scenario run, ``ckpts`` lists its
checkpoints, ``report`` rebuilds a suite's HTML report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ckpt_chaos.probe.run_files import SCENARIO
from ckpt_chaos.subcommands.common import EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_OK, UsageError, json_out, needs


def cmd_check(args: argparse.Namespace) -> int:
    """Re-run the checkers over a stored scenario run, without running anything."""
    from ckpt_chaos.check.history import HistoryError
    from ckpt_chaos.report import results
    from ckpt_chaos.run.runner import evaluate
    from ckpt_chaos.scenario import load

    run_dir = Path(args.run_dir)
    if not (run_dir / SCENARIO).is_file():
        raise UsageError(f"{run_dir}: holds no {SCENARIO}; give a scenario run directory such as "
                         "reports/default/latest/kill-rank1-mid-shard-write")
    s = load(run_dir / SCENARIO)
    try:
        row = results.scenario_row(evaluate(s, run_dir, (run_dir / "golden").resolve()), s, write=False)
    except HistoryError as e:
        raise UsageError(str(e)) from None
    code = EXIT_FAILED if results.failed(row) else EXIT_OK
    if args.json:
        json_out({**results.stamp(), "exit_status": code, **row})
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
    """List the checkpoints of a run directory (or a checkpoint directory) and whether each validates:
    the reference trainer's by their manifests, a ``[command]`` trainer's by its ``complete`` rule and
    the run's evidence (``_command_rows``)."""
    from ckpt_chaos.probe.layout import LATEST

    root = Path(args.dir)
    run = _command_run(root)
    if run is not None:
        return _command_ckpts(*run, args)
    if (root / "checkpoints").is_dir():
        root = root / "checkpoints"
    if not root.is_dir():
        raise UsageError(f"{root}: not a folder; give a run directory or its checkpoints/ folder")
    rows = _checkpoint_rows(root, verify_checksums=not args.fast)
    if args.json:
        json_out(rows)
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


def _command_run(root: Path):
    """(scenario, run directory) where ``root`` is a ``[command]`` scenario's run directory or its
    checkpoint folder; else None."""
    from ckpt_chaos.scenario import ScenarioError, load

    for run_dir in (root, root.parent):
        if not (run_dir / SCENARIO).is_file():
            continue
        try:
            s = load(run_dir / SCENARIO)
        except ScenarioError as e:
            raise UsageError(str(e)) from None
        if s.command is not None and (run_dir == root or (run_dir / s.command.ckpt_dir).resolve() == root.resolve()):
            return s, run_dir
    return None


def _command_rows(s, run_dir: Path) -> list[dict[str, Any]]:
    """A row per entry of a ``[command]`` run's checkpoint folder (a file, or a folder and what is in
    it): ``complete`` as the trainer's ``command.complete`` counts it now (``via``: the pointer that
    names it), ``valid`` whole or not by the same evidence as the checks (``Evidence.torn`` as the last
    launch ended: files left mid-write, closed after a failed write, missing or empty where the golden
    run's were not), with ``reason``; ``strays``, temporary files left half written inside it; the
    step it holds where known and it is whole; ``newest``, the newest complete and whole one, which a relaunch must
    resume from (``resumed_newest``)."""
    from ckpt_chaos.check.commits import torn_in as _torn_in
    from ckpt_chaos.check.evidence import Evidence
    from ckpt_chaos.check.verdict import Run
    from ckpt_chaos.run.command import complete, listing

    run = Run.load(s, run_dir, (run_dir / "golden").resolve())
    ev = Evidence(run)
    launches = run.launches()
    last = launches[-1] if launches else None
    ended = last is not None and run.exit_of(last) is not None
    torn = ev.torn(last) if ended else {}
    strays = ev.strays(last) if ended else {}
    done = complete(s, run_dir)
    files = listing(s, run_dir)
    folder = run_dir / s.command.ckpt_dir
    entries = sorted({ev.checkpoint_of(p) for p in files} | {f"{ev.ckpt}/{p.name}" for p in folder.iterdir()}
                     if folder.is_dir() else set())
    saved = ev.saved_steps()
    rows = []
    for entry in entries:
        mine = {p: n for p, n in files.items() if p == entry or p.startswith(entry + "/")}
        bad = [f"{t}: {torn[t]}" for t in _torn_in(ev, torn, entry)]
        left = [f"{t}: {strays[t]}" for t in sorted(strays) if t.startswith(entry + "/")]
        row: dict[str, Any] = {"name": entry[len(ev.ckpt) + 1:], "path": entry, "complete": entry in done,
                               "valid": None if not ended else not bad, "reason": "; ".join(bad),
                               "files": len(mine), "bytes": sum(mine.values()),
                               "step": saved.get(entry) if ended and not bad else None,  # a torn one holds none
                               "strays": left, "newest": False}
        if entry in done and done[entry].get("via"):
            row["via"] = done[entry]["via"]
        if not ended:
            row["reason"] = ("the run holds no record of how its last launch ended, so whether its files are "
                             "whole is not known")
        rows.append(row)
    whole = [r for r in rows if r["complete"] and r["valid"]]
    if whole:
        max(whole, key=lambda r: (done[r["path"]]["mtime_ns"], r["path"]))["newest"] = True
    return rows


def _command_ckpts(s, run_dir: Path, args: argparse.Namespace) -> int:
    rows = _command_rows(s, run_dir)
    if args.json:
        json_out(rows)
        return EXIT_OK
    rule = s.command.complete if isinstance(s.command.complete, str) else f"the checkpoint {s.command.complete['pointer']} names"
    print(f"{run_dir / s.command.ckpt_dir}: complete = {rule}; * the newest complete and whole")
    if not rows:
        print("no checkpoints")
    width = max([20, *(len(r["name"]) for r in rows)])
    for r in rows:
        mark = "*" if r["newest"] else " "
        state = "complete  " if r["complete"] else "          "
        step = f"step {r['step']:<5}" if r["step"] is not None else " " * 10
        size = f"{r['files']} file(s) {r['bytes']:>10} bytes"
        if r["valid"] is None:
            print(f"{mark} {r['name']:<{width}} {state}?       {size}  {r['reason']}")
        elif r["valid"]:
            print(f"{mark} {r['name']:<{width}} {state}whole   {step} {size}"
                  + (f"  stray: {'; '.join(r['strays'])}" if r["strays"] else ""))
        else:
            print(f"{mark} {r['name']:<{width}} {state}TORN    {r['reason']}")
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    """Rebuild the HTML report of a stored suite run (reports/<suite>/<time>, or its ``latest`` link)."""
    root = Path(args.results)
    if not (root / "results.json").is_file():
        raise UsageError(f"{root}: holds no results.json; give a suite run directory such as "
                         "reports/default/latest")
    if not args.no_plots and (code := needs("report", "report")) is not None:
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
