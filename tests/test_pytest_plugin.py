"""The pytest plugin stays out of projects that do not ask for it, and in those that do, reports
scenarios as items with markers, readable JUnit checks and expected failures.

Each test runs pytest in a child process, with ckpt-chaos installed as it is here (the ``pytest11``
entry point of the venv, this checkout first on the path).
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CATALOGUE = ROOT / "ckpt_chaos" / "scenarios"

# A small scenario: the node is lost at the end of step 6 and the relaunch resumes from step 4.
QUICK = """
description = "the node is lost at step 6 and the relaunch resumes from step 4"
world_size = 2
trainer_module = "{module}"
[trainer]
max_steps = 8
ckpt_every_steps = 4
dataset_size = 96
global_batch = 16
grad_accum = 2
[[faults]]
kind = "kill"
target = "node:0"
when = {{ point = "step.end", rank = 0, step = 6 }}
[expect]
resume_from = "step_00000004"
{known}
"""


def pytest_in(cwd: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    # The outer run's pytest variables (xdist worker, addopts) are not the inner project's.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_an_unrelated_project_with_a_scenarios_folder_is_left_alone(tmp_path):
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "config.toml").write_text('[server]\nport = 8080\nhost = "localhost"\n')
    (tmp_path / "test_mine.py").write_text("def test_mine():\n    assert sum([1, 2]) == 3\n")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "unrelated"\nversion = "1"\n')
    assert "--chaos" in pytest_in(tmp_path, "--help").stdout, "the plugin is not installed: the test proves nothing"
    collected = pytest_in(tmp_path, "--collect-only", "-q")
    assert collected.returncode == 0, collected.stdout + collected.stderr
    assert [line for line in collected.stdout.splitlines() if "::" in line] == ["test_mine.py::test_mine"]
    ran = pytest_in(tmp_path, "-rA")
    assert ran.returncode == 0 and "1 passed" in ran.stdout, ran.stdout + ran.stderr
    assert "error" not in (ran.stdout + ran.stderr).lower()
    markers = pytest_in(tmp_path, "--markers").stdout
    assert "@pytest.mark.kill" not in markers and "@pytest.mark.chaos" not in markers


@pytest.mark.nightly  # make test: the ini-option test collects scenarios as items
def test_with_chaos_the_catalogue_is_collected_with_markers_to_select_by():
    out = pytest_in(ROOT, "--chaos", "--collect-only", "-q", str(CATALOGUE), "-m", "kill and mid_write")
    names = [line for line in out.stdout.splitlines() if "::" in line]
    assert out.returncode == 0 and names and all(".toml::" in n for n in names), out.stdout + out.stderr
    assert any(n.endswith("::kill-rank1-mid-shard-write") for n in names)
    assert not any("preempt-mid-accumulation" in n for n in names)  # not a kill
    assert not any("kill-node-mid-training" in n for n in names)  # not mid_write
    markers = pytest_in(ROOT, "--chaos", "--markers").stdout
    assert "@pytest.mark.kill:" in markers and "@pytest.mark.storage:" in markers


def test_an_invalid_scenario_is_a_collection_error_naming_file_and_key(tmp_path):
    bad = tmp_path / "chaos" / "bad.toml"
    bad.parent.mkdir()
    bad.write_text(QUICK.format(module="reference_trainer", known="").replace('kind = "kill"', 'kind = "explode"'))
    out = pytest_in(tmp_path, "--chaos", "--collect-only", "-q", "chaos")
    assert out.returncode != 0
    assert f"{bad}: faults[0].kind: unknown fault kind 'explode'" in out.stdout + out.stderr


def test_the_ini_option_makes_only_its_folders_scenarios(tmp_path):
    (tmp_path / "chaos").mkdir()
    (tmp_path / "chaos" / "lose-node.toml").write_text(QUICK.format(module="reference_trainer", known=""))
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "config.toml").write_text("port = 8080\n")
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\nchaos_scenarios = ["chaos"]\n')
    out = pytest_in(tmp_path, "--collect-only", "-q", ".", "-m", "process and kill")
    names = [line for line in out.stdout.splitlines() if "::" in line]
    assert out.returncode == 0 and names == ["chaos/lose-node.toml::lose-node"], out.stdout + out.stderr


@pytest.fixture(scope="module")
def three_scenarios(tmp_path_factory, golden_root):
    """One pytest run over three small scenarios: one that passes, a planted bug declared as a known
    failure of the check it fails, and the correct trainer with the same declaration (fixed)."""
    from ckpt_chaos.scenario import load
    from tests.helpers import golden_of_the_reference

    tmp = tmp_path_factory.mktemp("plugin")
    chaos = tmp / "chaos"
    chaos.mkdir()
    (chaos / "passes.toml").write_text(QUICK.format(module="reference_trainer", known=""))
    (chaos / "known-bug.toml").write_text(QUICK.format(module="tests.planted.loader_not_restored",
                                                       known='known_failure = "trajectory"'))
    golden_of_the_reference(load(chaos / "known-bug.toml"), golden_root)  # the planted bug is the resume's
    (chaos / "bug-fixed.toml").write_text(QUICK.format(module="reference_trainer",
                                                       known='known_failure = "trajectory"'))
    junit = tmp / "junit.xml"
    out = pytest_in(tmp, "--chaos", "chaos", "-rA", f"--junitxml={junit}", "--chaos-out", str(tmp / "runs"),
                    "--chaos-golden", str(golden_root), timeout=900)
    cases = {c.get("name"): c for c in ET.parse(junit).iter("testcase")}
    return out, cases


def evidence(case: ET.Element) -> str:
    """A testcase's whole failure report and the end of its run's torchrun.log, for an assertion's
    message: pytest cuts the ``message`` attribute to 500 characters, which can leave out the failing
    check's line, and CI keeps nothing of the run directory."""
    failure = case.find("failure")
    report = failure.text if failure is not None else "(no <failure> element)"
    run_dir = {p.get("name"): p.get("value") for p in case.iter("property")}.get("run_dir")
    log = Path(run_dir) / "torchrun.log" if run_dir else None
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-60:]) if log and log.is_file() else "(none)"
    return f"{report}\n--- end of {log}:\n{tail}"


@pytest.mark.nightly  # make test: the report tests read each check's text
@pytest.mark.slow
def test_junit_carries_each_check_as_readable_text(three_scenarios):
    out, cases = three_scenarios
    props = {p.get("name"): p.get("value") for p in cases["passes"].iter("property")}
    assert props["verdict"] == "pass", evidence(cases["passes"])
    assert props["check trajectory"].startswith("pass: ") and "bit for bit" in props["check trajectory"]
    assert props["check resume_from"] == "pass: launch 1 resumed from step_00000004"
    assert Path(props["run_dir"]).is_dir()
    assert not any(v.startswith(("{", "[")) for v in props.values()), props  # no repr of a dict or list


@pytest.mark.slow
def test_a_known_failure_is_an_xfail_naming_the_check(three_scenarios):
    out, cases = three_scenarios
    skipped = cases["known-bug"].find("skipped")
    assert skipped is not None and skipped.get("type") == "pytest.xfail", out.stdout[-3000:]
    assert skipped.get("message").startswith("known failure: trajectory: trajectory diverges at step 5")
    assert "XFAIL chaos/known-bug.toml::known-bug - known failure: trajectory" in out.stdout


@pytest.mark.slow
def test_a_known_failure_that_passes_fails_as_xpass_strict(three_scenarios):
    out, cases = three_scenarios
    failure = cases["bug-fixed"].find("failure")
    assert failure is not None, out.stdout[-3000:]
    assert failure.get("message").startswith("[XPASS(strict)] scenario bug-fixed: known failure passed: "
                                              "trajectory did not fail"), evidence(cases["bug-fixed"])
    assert "remove expect.known_failure from" in failure.get("message")
    assert out.returncode == 1 and "1 failed, 1 passed, 1 xfailed" in out.stdout, out.stdout[-3000:]
