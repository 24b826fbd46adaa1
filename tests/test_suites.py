"""The suites: ``full`` holds every scenario (nightly); ``default`` (CI) covers every fault family,
fault kind, check and setup at least once, judged from the scenario files and the code
(ckpt_chaos/check/coverage.py), and holds nothing the rest of it already covers."""

from __future__ import annotations

import ast
import inspect
import json
import sys
from functools import cache
from pathlib import Path

import pytest

from ckpt_chaos.check import coverage
from ckpt_chaos.check.judge import COMMAND, REFERENCE
from ckpt_chaos.check.verdict import Report
from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.faults import KINDS
from ckpt_chaos.scenario import FULL_SUITE, Scenario, catalogue
from tests.test_cli import cli

CATALOGUE = catalogue(builtin_scenarios())
DEFAULT = [s for s in CATALOGUE if "default" in s.suites]
REGRESSIONS = builtin_scenarios() / "regressions"


def _in_regressions(s: Scenario) -> bool:
    return Path(s.source).resolve().is_relative_to(REGRESSIONS)


def _lines(items, full: dict) -> str:
    return "\n".join(f"  {axis} {name}: " + (f"covered in the catalogue by {', '.join(sorted(full[(axis, name)]))}"
                                            if (axis, name) in full else "covered by no scenario of the catalogue")
                     for axis, name in sorted(items))


def _added(node: ast.AST, where: str) -> set[str]:
    """The check names of every ``report.add(...)`` under ``node``, as ``Report.add`` names them."""
    names = set()
    for n in ast.walk(node):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "add"
                and isinstance(n.func.value, ast.Name) and n.func.value.id == "report"):
            continue
        first = n.args[0] if n.args else None
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            raise ValueError(f"{where}:{n.lineno}: report.add whose check name is not a string literal: "
                             "write the name out, so that it can be held to its declaration")
        keys = {k.arg for k in n.keywords}
        names.add(first.value if "at" in keys or "fault" not in keys else f"fault_{first.value}")
    return names


@cache
def _definition(module: str, name: str) -> ast.FunctionDef | None:
    tree = ast.parse(inspect.getsource(sys.modules[module]))
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _made_by(fn) -> set[str]:
    """The checks ``fn`` adds to a report, and the functions of ckpt_chaos it calls by name, at any depth."""
    seen, todo, names = set(), [fn], set()
    while todo:
        f = todo.pop()
        if f in seen or not inspect.isfunction(f) or not f.__module__.startswith("ckpt_chaos"):
            continue
        seen.add(f)
        node = _definition(f.__module__, f.__name__)
        if node is None:  # a lambda or a nested function: no report.add of its own in the catalogue's code
            continue
        names |= _added(node, f"{f.__module__}.{f.__name__}")
        todo += [f.__globals__.get(n.func.id) for n in ast.walk(node)
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    return names


@pytest.mark.parametrize("call,name", [('report.add("x", True, "d")', "x"),
                                       ('report.add("x", True, "d", fault=0)', "fault_x"),
                                       ('report.add("x", True, at=1, fault=0, detail="d")', "x")])
def test_check_names_are_read_from_the_source_as_report_add_names_them(call, name):
    assert _added(ast.parse(call), "t.py") == {name}
    report = Report()
    exec(call, {"report": report})
    assert report.checks[0].check == name


def test_a_check_name_the_source_does_not_spell_out_is_refused():
    with pytest.raises(ValueError, match="t.py:1: report.add whose check name is not a string literal"):
        _added(ast.parse('report.add(f"x{i}", True, "d")'), "t.py")


def test_the_declared_checks_include_the_checkers_and_the_kinds():
    emitted = coverage.emitted_checks()
    assert {"trajectory", "fault_job_failed", "committed_survives", "upload_stall"} <= set(emitted)
    assert {"kind disk_full", "kind errno"} <= set(emitted["fault_surfaced"])
    assert coverage.kind_checks()["corrupt"] == {"fault_detected"}


@pytest.mark.parametrize("table", [REFERENCE, COMMAND], ids=["reference", "command"])
def test_the_checkers_declarations_are_the_checks_its_functions_make(table):
    """Each check of a table is made by the function declared with it, and the judge's functions make no
    check that neither table declares, so none goes without a rule for when it gives a verdict (and
    so unexercised by the suites, unnoticed)."""
    made = {c.run: _made_by(c.run) for c in table}
    assert [c.name for c in table if c.name not in made[c.run]] == []
    assert set().union(*made.values()) - {c.name for c in REFERENCE + COMMAND} == set()
    assert len({c.name for c in table}) == len(table)


def test_no_check_name_has_two_implementations():
    """A name means one check: where both tables declare it, the same function makes it."""
    ref, cmd = {c.name: c.run for c in REFERENCE}, {c.name: c.run for c in COMMAND}
    assert {n: (ref[n].__qualname__, cmd[n].__qualname__) for n in set(ref) & set(cmd) if ref[n] is not cmd[n]} == {}
    assert {"job_completed", "fault_job_failed", "trajectory", "committed_valid", "retention", "config_refused",
            "config_accepted", "resume_from", "lost_work"} <= set(ref) & set(cmd)


@pytest.mark.parametrize("kind", list(KINDS.values()), ids=list(KINDS))
def test_a_kinds_coverage_declares_the_checks_its_exit_and_effect_checks_make(kind):
    made = set().union(*(_made_by(f) for f in (kind.exit_check, kind.effect_check) if f is not None))
    assert set(kind.coverage) == made, (f"kind {kind.name}: its exit and effect checks make {sorted(made)}; "
                                        f"its coverage declares {sorted(kind.coverage)}")


def test_the_catalogue_covers_every_family_kind_check_and_backend():
    full = coverage.coverage(CATALOGUE)
    missing = coverage.universe(CATALOGUE) - set(full)
    assert not missing, "no scenario of the catalogue exercises:\n" + _lines(missing, full)


def test_the_default_suite_covers_every_family_kind_check_and_setup():
    full = coverage.coverage(CATALOGUE)
    missing = coverage.universe(CATALOGUE) - set(coverage.coverage(DEFAULT))
    assert not missing, ("the default suite does not exercise the following; put a scenario that does in it "
                         "(drop `suites = [\"full\"]` from its file):\n" + _lines(missing, full))


def test_every_scenario_of_the_default_suite_covers_something_no_other_one_does():
    """Keeps CI short: a scenario joins default for what it alone exercises there (a regression
    the search found joins it regardless, until it is fixed)."""
    redundant = []
    for s in DEFAULT:
        if _in_regressions(s):
            continue
        rest = set(coverage.coverage([o for o in DEFAULT if o is not s]))
        if coverage.items_of(s) <= rest:
            redundant.append(s.name)
    assert not redundant, ("these default scenarios exercise nothing the rest of the default suite does not: "
                           f"{', '.join(redundant)}; write `suites = [\"full\"]` in their files (the nightly suite)")


def test_every_scenario_is_in_the_full_suite_and_every_regression_in_default():
    assert all(FULL_SUITE in s.suites for s in CATALOGUE)
    assert Scenario(name="x", suites=[]).suites == [FULL_SUITE]
    assert Scenario(name="x").suites == ["default", FULL_SUITE]
    assert [s.name for s in CATALOGUE if _in_regressions(s) and "default" not in s.suites] == []


def test_list_shows_every_scenario_with_its_suites_and_selects_a_suite(tmp_path):
    every = json.loads(cli("list", "--json", cwd=tmp_path).stdout)
    full = json.loads(cli("list", "--json", "--suite", "full", cwd=tmp_path).stdout)
    default = json.loads(cli("list", "--json", "--suite", "default", cwd=tmp_path).stdout)
    assert [s["name"] for s in every] == [s["name"] for s in full] == [s.name for s in CATALOGUE]
    assert [s["name"] for s in default] == [s.name for s in DEFAULT]
    assert all(s["suites"][-1] == FULL_SUITE for s in every)
    text = cli("list", "-k", DEFAULT[0].name, cwd=tmp_path).stdout
    assert text.split()[:2] == [DEFAULT[0].name, "default,full"]
