"""A run's results: each mutant of the cosmic-ray session with its status, the score and its figures,
``benchmarks/results/mutation*.json`` and their tables, and the scenarios that killed each change
last time (tried first on the same change in the next run)."""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import json
import os
import platform
import statistics
from pathlib import Path

from ckpt_chaos.mutation import EQUIVALENT_MARK, NOT_REACHED, NOT_SAMPLED, OUT_OF_SCOPE, OUTCOME, RESULTS, ROOT
from ckpt_chaos.mutation.equivalence import changed_lines, equivalent_reason


def mutant(item, pristine: Path = ROOT) -> dict:
    """A work item as the report shows it: file, line, operator, occurrence, unified diff."""
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator

    spec = item.mutations[0]
    file = spec.module_path.as_posix()
    code = (pristine / file).read_text()
    mutated = mutate_code(code, get_operator(spec.operator_name)(**(spec.operator_args or {})), spec.occurrence)
    diff = "" if mutated is None else "\n".join(difflib.unified_diff(
        code.split("\n"), mutated.split("\n"), f"a/{file}", f"b/{file}", n=1, lineterm=""))
    return {"job": item.job_id, "file": file, "line": spec.start_pos[0], "operator": spec.operator_name,
            "occurrence": spec.occurrence, "diff": diff, "start": list(spec.start_pos), "end": list(spec.end_pos),
            "mutated_sha": hashlib.sha256((mutated or "").encode()).hexdigest()}


def collect(session: Path, pristine: Path = ROOT, equivalent: list[dict] | None = None) -> list[dict]:
    """Every counted mutant of the session with its status: killed, survived, not reached,
    timeout, error, equivalent (or pending, when exec was cut short). A mutant marked equivalent
    since it ran is equivalent too, its run kept as ``run_status``."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome

    out = []
    with use_db(str(session), WorkDB.Mode.open) as db:
        done = {item.job_id: result for item, result in db.completed_work_items}
        for item in db.work_items:
            r = done.get(item.job_id)
            text = (r.output or "") if r is not None else ""
            if text in (OUT_OF_SCOPE, NOT_SAMPLED):
                continue
            m = mutant(item, pristine)
            if r is None:
                m["status"] = "pending"
            elif text.startswith(EQUIVALENT_MARK):
                m.update(status="equivalent", reason=text[len(EQUIVALENT_MARK):])
            elif text == NOT_REACHED:
                m["status"] = "not reached"
            elif r.worker_outcome != WorkerOutcome.NORMAL:
                m.update(status="error", detail=text[-400:])
            elif OUTCOME in text:
                m.update(json.loads(text.rsplit(OUTCOME, 1)[1].strip()))
                if m.get("detail") == NOT_REACHED:
                    m["status"] = "not reached"
            else:  # cosmic-ray's own timeout: the harness gave no verdict
                m.update(status="timeout" if text == "timeout" else "error", detail=text[-400:])
            if m["status"] != "equivalent" and (reason := equivalent_reason(equivalent or [], m)) is not None:
                m.update(run_status=m["status"], status="equivalent", reason=reason)
            out.append(m)
    return sorted(out, key=lambda m: (m["file"], m["line"], m["operator"], m["occurrence"]))


STATUSES = ("killed", "survived", "not reached", "timeout", "error", "equivalent", "pending")


def wilson(killed: int, scored: int, z: float = 1.96) -> tuple[float, float] | None:
    """The 95 % Wilson score interval of a proportion: where the score of every mutant in scope
    lies, given a random sample's. It stays inside [0, 1] and is honest for small samples and
    scores near 1, where the normal approximation is neither."""
    if not scored:
        return None
    p, n = killed / scored, scored
    mid, half = p + z * z / (2 * n), z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return round(max(0.0, (mid - half) / (1 + z * z / n)), 4), round(min(1.0, (mid + half) / (1 + z * z / n)), 4)


def figures(mutants: list[dict], sampled: bool = False) -> dict:
    def count(ms):
        c = {s: sum(1 for m in ms if m["status"] == s) for s in STATUSES}
        c["total"] = len(ms)
        scored = c["total"] - c["equivalent"] - c["pending"]
        c["score"] = round(c["killed"] / scored, 4) if scored else None
        if sampled:
            c["score_ci95"] = wilson(c["killed"], scored)
        return c

    def median(status: str | None = None) -> float | None:
        walls = [m["wall_s"] for m in mutants if "wall_s" in m and not m.get("cached")
                 and status in (None, m.get("run_status", m["status"]))]
        return round(statistics.median(walls), 1) if walls else None

    operators = sorted({m.get("operator", "") for m in mutants})
    return {"totals": count(mutants),
            "files": {f: count([m for m in mutants if m["file"] == f]) for f in sorted({m["file"] for m in mutants})},
            "operators": {o: count([m for m in mutants if m.get("operator", "") == o]) for o in operators},
            # a killed mutant stops at its first failure; a survivor runs every scenario that reaches it
            "median_mutant_s": median(), "median_killed_s": median("killed"), "median_survived_s": median("survived"),
            "mutants_run": sum(1 for m in mutants if "wall_s" in m and not m.get("cached")),
            "mutants_cached": sum(1 for m in mutants if m.get("cached"))}


def is_sample(mutants: list[dict], extra: dict) -> bool:
    """Whether the scored mutants are a random sample of those in scope: drawn with ``--limit``, or
    cut short by ``--budget`` (cosmic-ray runs the pending mutants in random order)."""
    return bool(extra.get("sample", {}).get("limit")) or any(m["status"] == "pending" for m in mutants)


def results_name(operators: str, example: str | None = None) -> str:
    """``mutation`` for cosmic-ray's operators (the name docs/mutation.md quotes),
    ``mutation-<operators>`` for the others, ``mutation-<operators>-<example>`` for an example's
    trainer, so that one run never overwrites another's. Also the name of the run's work folder."""
    if example is not None:
        return f"mutation-{operators}-{example}"
    return "mutation" if operators == "core" else f"mutation-{operators}"


def write_results(mutants: list[dict], command: str, extra: dict, results: Path = RESULTS) -> Path:
    """``mutation.json`` (``mutation-<operators>.json``) and, as ``benchmarks/report.py --tables`` does, its
    ``.md`` in ``results``."""
    data = {"command": command, "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            **extra, **figures(mutants, sampled=is_sample(mutants, extra)), "mutants": mutants}
    results.mkdir(parents=True, exist_ok=True)
    sample = extra.get("sample", {})
    out = results / f"{results_name(sample.get('operators', 'core'), sample.get('example'))}.json"
    out.write_text(json.dumps(data, indent=1) + "\n")
    _write_tables(results)
    return out


def killers(results: Path) -> list[list[str]]:
    """[file, removed, added, scenario] of each mutant the last results at ``results`` say was killed:
    the scenario to try first on the same change (line numbers move; the change's text does not).
    Only an order: the kill is run again and must fail again to count."""
    if not results.is_file():
        return []
    try:
        mutants = json.loads(results.read_text()).get("mutants", [])
    except (OSError, ValueError):
        return []
    return [[m["file"], *changed_lines(m["diff"]), m["scenario"]] for m in mutants
            if m.get("status") == "killed" and m.get("scenario") and m.get("diff")]


def killer_first(names: list[str], known: list[list[str]], file: str, change: tuple[str, str]) -> list[str]:
    """``names`` with the scenario that last killed this change of ``file`` first, if it is among them."""
    first = next((k[3] for k in known if k[0] == file and tuple(k[1:3]) == change), None)
    return [first] + [n for n in names if n != first] if first in names else names


def _write_tables(results: Path) -> None:
    """Every table of ``results`` from its JSON, by ``benchmarks/report.py`` of this checkout: the one
    place that renders the results' tables, a script of the repository rather than a module of the
    package, so it is loaded from its file."""
    spec = importlib.util.spec_from_file_location("benchmarks_report", ROOT / "benchmarks" / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    report.write_tables(results)
