"""The audit's matrix: each generated scenario's verdict, by fault and point, with the cause of each
failure (its root: the first failing check in causal order, ``check.verdict.causal``; the job's own
outcome comes last, as it says only that something failed)."""

from __future__ import annotations

import json
from pathlib import Path

from ckpt_chaos.audit.generate import Generated
from ckpt_chaos.check.verdict import causal
FAILED = ("fail", "xpass", "unknown", "error")


def cell(g: Generated, row: dict | None) -> dict:
    """One cell: the scenario's fault, point, verdict and, for a failure, its first telling check."""
    out = {"scenario": g.name, "family": g.family, "fault": g.fault, "point": g.point}
    if g.left_out:
        return {**out, "verdict": "left out", "check": "", "detail": g.left_out, "run_dir": ""}
    if row is None:
        return {**out, "verdict": "error", "check": "", "detail": "no result: the run stopped before it",
                "run_dir": ""}
    checks = row.get("checks") or []
    failing = causal([c for c in checks if c.get("verdict") == "fail"]) or \
        causal([c for c in checks if c.get("verdict") == "unknown"])
    first = failing[0] if failing else None
    verdict = row.get("verdict", "error")
    detail = (first or {}).get("detail") or (row.get("reason") or "" if verdict != "pass" else "")
    return {**out, "verdict": verdict, "check": (first or {}).get("name", ""), "detail": detail,
            "run_dir": row.get("run_dir", "")}


def cells(gen: list[Generated], results: Path | None) -> list[dict]:
    """The cells of every generated scenario, from a suite run's ``results.json`` (None: not run)."""
    rows = {}
    if results is not None and results.is_file():
        rows = {r["scenario"]: r for r in json.loads(results.read_text())["results"]}
    return [cell(g, rows.get(g.name)) for g in gen]


GRID = "audit.json"
"""The cells, beside the suite run's results.json: its HTML report draws them as a grid."""


def grid(cs: list[dict]) -> dict:
    """The cells as the HTML report's grid: a row per fault, a column per point, in the order the
    suite was generated; a pair with no scenario has no cell."""
    faults = list(dict.fromkeys(c["fault"] for c in cs))
    points = list(dict.fromkeys(c["point"] for c in cs))
    at = {(c["fault"], c["point"]): c for c in cs}
    return {"points": points, "rows": [(f, [at.get((f, p)) for p in points]) for f in faults]}


def findings(cs: list[dict]) -> list[dict]:
    return [c for c in cs if c["verdict"] in FAILED]


def table(cs: list[dict], width: int = 100):
    """The matrix as a rich table: a row per fault and point."""
    from rich.markup import escape
    from rich.table import Table

    colour = {"pass": "green", "fail": "red", "xpass": "red", "unknown": "magenta", "error": "red",
              "skipped": "yellow", "left out": "yellow", "xfail": "cyan"}
    t = Table(title="ckpt-chaos audit: fault x point", show_lines=False)
    for col in ("fault", "point", "verdict"):
        t.add_column(col, no_wrap=True)
    t.add_column("cause", overflow="fold")
    for c in cs:
        v = c["verdict"]
        cause = f"{c['check']}: {c['detail']}" if c["check"] else c["detail"]
        if len(cause) > width:  # the findings below the table give it whole
            cause = cause[:width - 3] + "..."
        t.add_row(c["fault"], c["point"], f"[{colour.get(v, 'white')}]{v}[/]", escape(cause))
    return t
