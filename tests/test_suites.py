"""The suites: ``full`` holds every scenario (nightly), whatever its file says; ``default`` is what
CI runs."""

from __future__ import annotations

import json
from pathlib import Path

from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.scenario import FULL_SUITE, Scenario, catalogue
from tests.test_cli import cli

CATALOGUE = catalogue(builtin_scenarios())
DEFAULT = [s for s in CATALOGUE if "default" in s.suites]
REGRESSIONS = builtin_scenarios() / "regressions"


def _in_regressions(s: Scenario) -> bool:
    return Path(s.source).resolve().is_relative_to(REGRESSIONS)


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
