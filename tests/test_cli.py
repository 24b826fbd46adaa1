"""The command line's conventions: --version, --help, --json, --junitxml, exit codes, bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ckpt_chaos import __version__
from tests.test_pytest_plugin import QUICK

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ["list", "run", "check", "ckpts", "report", "cadence", "explore", "audit"]


def cli(*args: str, cwd: Path, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "COLUMNS": "80", **env}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "ckpt_chaos.cli", *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=timeout)


def test_version(tmp_path):
    out = cli("--version", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == f"ckpt-chaos {__version__}"


def test_help_names_every_command_on_one_line_with_exit_codes_and_environment(tmp_path):
    out = cli("--help", cwd=tmp_path)
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    block = lines[lines.index("commands:") + 2:]
    block = block[:block.index("")]
    assert [line.split()[0] for line in block] == COMMANDS, block  # no line wrapped into a second one
    assert all(re.match(r"^    \w+ +\w", line) for line in block), block
    for text in ("exit status:", "  2    bad input", "CKPT_CHAOS_OUT", "CKPT_CHAOS_CACHE", "[tool.ckpt-chaos]"):
        assert text in out.stdout


def test_list_json_is_the_only_thing_on_stdout(tmp_path):
    out = cli("list", "--json", "--suite", "findings", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    cut = next(s for s in found if s["name"] == "docker-cut-node-from-store")
    assert cut["known_failure"] == "no_hang" and "docker" in cut["labels"] and Path(cut["file"]).is_file()


def test_a_malformed_scenario_exits_2_naming_file_and_key_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(QUICK.format(module="reference_trainer", known="").replace("max_steps = 8", "max_steps = 'many'"))
    out = cli("run", str(bad), "--out", str(tmp_path / "out"), "--json", cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [f"ckpt-chaos run: {bad}: trainer.max_steps: wrong type str ('many'); "
                                               "expected int"]
    assert not (tmp_path / "out").exists()


def test_a_name_in_two_scenario_folders_is_an_error_naming_both_files(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "kill-rank1-mid-shard-write.toml").write_text(QUICK.format(module="reference_trainer", known=""))
    (tmp_path / "pyproject.toml").write_text('[tool.ckpt-chaos]\nscenarios = ["mine"]\n')
    out = cli("list", "--builtin", cwd=tmp_path)  # the project's folder and the built-in catalogue, both taken
    assert out.returncode == 2
    assert str(mine / "kill-rank1-mid-shard-write.toml") in out.stderr
    assert str(ROOT / "ckpt_chaos" / "scenarios" / "process" / "kill-rank1-mid-shard-write.toml") in out.stderr


def test_a_project_table_with_an_unknown_key_exits_2(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.ckpt-chaos]\nscenario = ["mine"]\n')
    out = cli("list", cwd=tmp_path)
    assert out.returncode == 2 and "tool.ckpt-chaos.scenario: unknown key" in out.stderr


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory, golden_root):
    """``ckpt-chaos run --json --junitxml`` over a passing scenario and a known failure, from a project
    directory whose own pyproject names its scenario folder; output under the current directory."""
    project = tmp_path_factory.mktemp("project")
    (project / "chaos").mkdir()
    (project / "chaos" / "lose-node.toml").write_text(QUICK.format(module="reference_trainer", known=""))
    (project / "chaos" / "known-bug.toml").write_text(QUICK.format(module="tests.planted.rng_not_saved",
                                                                   known='known_failure = "trajectory"'))
    (project / "pyproject.toml").write_text('[tool.ckpt-chaos]\nscenarios = ["chaos"]\n')
    out = cli("run", "lose-node", "known-bug", "--json", "--junitxml", "junit.xml", "--golden-dir",
              str(golden_root), cwd=project, timeout=900)
    return project, out


# Nightly: --json and --junitxml of a suite with a known failure. make test holds JUnit through test_pytest_plugin and known failures through the catalogue's.
@pytest.mark.nightly
@pytest.mark.slow
def test_run_json_and_junit_with_a_known_failure(suite_run):
    project, out = suite_run
    assert out.returncode == 0, out.stderr[-3000:]  # an expected failure does not fail the suite
    data = json.loads(out.stdout)  # stdout holds the JSON and nothing else
    assert data["schema_version"] == 1 and data["tool_version"] == __version__ and data["exit_status"] == 0
    verdicts = {r["scenario"]: r["verdict"] for r in data["results"]}
    assert verdicts == {"lose-node": "pass", "known-bug": "xfail"}
    assert Path(data["out"]).parent == project / "reports" / "custom"
    assert (project / "reports" / "custom" / "latest" / "results.json").is_file()
    stored = json.loads((project / "reports" / "custom" / "latest" / "lose-node" / "result.json").read_text())
    assert stored["schema_version"] == 1 and stored["tool_version"] == __version__
    assert stored["trainer_module"] == "reference_trainer"
    rev = stored["trainer_revision"]  # this checkout is a git work tree
    assert re.fullmatch(r"[0-9a-f]{40}", rev["commit"]) and isinstance(rev["dirty"], bool)
    cases = {c.get("name"): c for c in ET.parse(project / "junit.xml").iter("testcase")}
    assert cases["known-bug"].find("skipped").get("type") == "pytest.xfail"
    assert cases["known-bug"].find("skipped").get("message").startswith("known failure: trajectory:")
    assert "pass  trajectory: 8 steps identical to the golden run" in cases["lose-node"].find("system-out").text
    assert "XFAIL known-bug" in out.stderr


@pytest.mark.slow
def test_check_json_rechecks_a_stored_run(reference_mid_write):
    run_dir = reference_mid_write.run_dir  # the session's run, read only: check writes nothing
    out = cli("check", str(run_dir), "--json", cwd=run_dir)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["verdict"] == "pass" and data["schema_version"] == 1 and data["exit_status"] == 0
    assert {c["name"]: c["verdict"] for c in data["checks"]} == \
        {c["name"]: c["verdict"] for c in reference_mid_write.row["checks"]}
    text = cli("check", str(run_dir), cwd=run_dir)
    assert text.stdout.splitlines()[-1] == "verdict: pass"


def test_check_of_a_damaged_history_names_the_file_and_line(tmp_path):
    from ckpt_chaos.config import builtin_scenarios

    run = tmp_path / "run"
    run.mkdir()
    (run / "scenario.toml").write_text((builtin_scenarios() / "process" / "kill-rank1-mid-shard-write.toml").read_text())
    (run / "history.jsonl").write_text('{"source": "harness", "kind": "launch", "t": 1.0}\n')
    out = subprocess.run([sys.executable, "-m", "ckpt_chaos.cli", "check", str(run)], capture_output=True, text=True)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "history.jsonl:1" in out.stderr and "Traceback" not in out.stderr, out.stderr
