"""The subcommands over what a run left: ``check`` re-checks a scenario run, ``ckpts`` lists its
checkpoints, ``report`` rebuilds a suite's HTML report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ckpt_chaos.subcommands.common import EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_OK, UsageError, json_out, needs


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
    """List the checkpoints of a run directory (or a checkpoint directory) and whether each validates."""
    from ckpt_chaos.probe.layout import LATEST

    root = Path(args.dir)
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
