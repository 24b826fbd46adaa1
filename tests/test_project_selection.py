"""In a project, ``ckpt-chaos list`` and ``run`` take the project's scenario folders only
(``--scenarios DIR``, else ``[tool.ckpt-chaos] scenarios``); the built-in catalogue only when asked
(``--builtin``, ``builtin = true``, or a built-in scenario named). A project's scenario without
``suites`` is not in the built-in ``default`` suite. Nothing is run: the selection is read from
``list --json`` and from the function ``run`` selects with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_chaos import cli
from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.scenario import load
from tests.test_pytest_plugin import QUICK

ROOT = Path(__file__).resolve().parents[1]
BUILTIN_DEFAULT = sorted(s.name for s in (load(p) for p in builtin_scenarios().rglob("*.toml"))
                         if "default" in s.suites)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project with two scenario folders, its pyproject naming one; the current directory."""
    for folder, name in (("chaos", "mine-a"), ("chaos", "mine-b"), ("more", "other-c")):
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / f"{name}.toml").write_text(QUICK.format(module="reference_trainer", known=""))
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "p"\n[tool.ckpt-chaos]\nscenarios = ["chaos"]\n')
    monkeypatch.chdir(tmp_path)
    cli._project.cache_clear()
    yield tmp_path
    cli._project.cache_clear()


def select(*argv: str) -> list[str]:
    """The names ``ckpt-chaos run|list ARGV`` selects, in order."""
    return [s.name for s in cli._select(cli.parser().parse_args(list(argv)))]


def listed(capsys, *argv: str) -> dict[str, dict]:
    assert cli.main(["list", "--json", *argv]) == 0
    return {s["name"]: s for s in json.loads(capsys.readouterr().out)}


def test_a_project_lists_and_runs_its_own_folders_only(project, capsys):
    found = listed(capsys)
    assert sorted(found) == ["mine-a", "mine-b"]
    # without a suites key a project's scenario is in full only, never in the built-in default suite
    assert all(s["suites"] == ["full"] for s in found.values())
    assert select("run") == ["mine-a", "mine-b"]
    assert cli._suite_name(cli.parser().parse_args(["run"])) == "project"
    assert select("run", "--suite", "default") == []  # nothing of the project's, nothing built in
    assert select("run", "-k", "mine-b") == ["mine-b"]


def test_scenarios_option_replaces_the_project_folders(project, capsys):
    assert sorted(listed(capsys, "--scenarios", "more")) == ["other-c"]
    assert select("run", "--scenarios", "more") == ["other-c"]
    assert select("run", "--scenarios", "more", "--scenarios", "chaos") == ["mine-a", "mine-b", "other-c"]
    # a scenario named on the command line is still found in the project's folders
    assert select("run", "--scenarios", "more", "mine-a") == ["mine-a"]


def test_the_builtin_catalogue_only_when_asked(project, capsys):
    assert len(listed(capsys, "--builtin")) == 2 + len(list(builtin_scenarios().rglob("*.toml")))
    # run --builtin: every scenario of the project's, and the built-in catalogue's default suite
    assert select("run", "--builtin") == sorted(["mine-a", "mine-b", *BUILTIN_DEFAULT])
    assert select("run", "--builtin", "--suite", "default") == BUILTIN_DEFAULT
    # a built-in scenario named is found without --builtin: naming it asks for it
    assert select("run", "kill-rank1-mid-shard-write", "mine-a") == ["kill-rank1-mid-shard-write", "mine-a"]
    assert cli._suite_name(cli.parser().parse_args(["run", "mine-a"])) == "custom"


def test_builtin_key_of_the_project(project, capsys):
    py = project / "pyproject.toml"
    py.write_text('[tool.ckpt-chaos]\nscenarios = ["chaos"]\nbuiltin = true\n')
    cli._project.cache_clear()
    assert select("run") == sorted(["mine-a", "mine-b", *BUILTIN_DEFAULT])
    py.write_text('[tool.ckpt-chaos]\nscenarios = ["chaos"]\nbuiltin = false\n')
    cli._project.cache_clear()
    assert cli.main(["run", "kill-rank1-mid-shard-write"]) == 2  # never offered, unless --builtin
    assert "kill-rank1-mid-shard-write: no scenario of that name" in capsys.readouterr().err
    assert select("run", "--builtin", "kill-rank1-mid-shard-write") == ["kill-rank1-mid-shard-write"]
    py.write_text('[tool.ckpt-chaos]\nbuiltin = "yes"\n')
    cli._project.cache_clear()
    assert cli.main(["list"]) == 2
    err = capsys.readouterr().err
    assert f"{py}: tool.ckpt-chaos.builtin: expected true or false" in err and "--builtin" in err


def test_outside_a_project_the_builtin_catalogue_as_before(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli._project.cache_clear()
    try:
        assert select("run") == BUILTIN_DEFAULT
        assert cli._suite_name(cli.parser().parse_args(["run"])) == "default"
        assert len(select("list")) == len(list(builtin_scenarios().rglob("*.toml")))
        # make chaos-examples: --suite examples over the examples' folders, nothing built in
        examples = [a for d in ("plain_ddp", "lightning", "accelerate")
                    for a in ("--scenarios", str(ROOT / "examples" / d / "scenarios"))]
        files = [load(p) for d in ("plain_ddp", "lightning", "accelerate")
                 for p in (ROOT / "examples" / d / "scenarios").glob("*.toml")]
        assert select("run", "--suite", "examples", *examples) == sorted(s.name for s in files
                                                                        if "examples" in s.suites)
        assert len(files) >= 15
    finally:
        cli._project.cache_clear()


def test_a_name_twice_is_an_error_only_where_both_folders_are_taken(project, capsys):
    (project / "chaos" / "kill-rank1-mid-shard-write.toml").write_text(QUICK.format(module="reference_trainer",
                                                                                     known=""))
    assert "kill-rank1-mid-shard-write" in listed(capsys)  # the project's; the built-in one is not taken
    assert select("run", "kill-rank1-mid-shard-write") == ["kill-rank1-mid-shard-write"]
    assert str(cli._select(cli.parser().parse_args(["run", "kill-rank1-mid-shard-write"]))[0].source) == \
        str(project / "chaos" / "kill-rank1-mid-shard-write.toml")
    assert cli.main(["list", "--builtin"]) == 2
    assert "names must be unique" in capsys.readouterr().err


def test_missing_scenarios_folder_and_empty_selection_are_usage_errors(project, capsys):
    assert cli.main(["list", "--scenarios", "nowhere"]) == 2
    assert "--scenarios nowhere: not a folder" in capsys.readouterr().err
    assert cli.main(["run", "-k", "nothing-matches"]) == 2
    err = capsys.readouterr().err
    assert "no scenario selected from the scenario folders" in err and "--builtin" in err


def test_the_installed_command_in_a_project_directory(project):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-m", "ckpt_chaos.cli", "list", "--json"], cwd=project / "more",
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert [s["name"] for s in json.loads(out.stdout)] == ["mine-a", "mine-b"]  # the pyproject above counts
