"""Aiming a fault at a ``[command]`` trainer: a trigger's filters are taken wherever its point carries
what they filter, and a scenario file that does not load stops only what asks for it."""

from __future__ import annotations

import json
import subprocess
import sys

from ckpt_chaos.scenario import from_dict

GOOD = """\
description = "a scenario whose trainer is not installed here: skipped before anything runs"
[command]
argv = ["train.py"]
requires = ["ckpt_chaos_no_such_module"]
"""
BAD = GOOD.replace('argv = ["train.py"]', 'argv = ["train.py"]\nsave_every = "four"')


def cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckpt_chaos.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_a_path_on_a_ckpt_metadata_trigger_is_taken():
    # the layer reports DCP's .metadata rename with its path (probe/auto_files.py), as the loader now knows
    s = from_dict({"command": {"argv": ["train.py"]},
                   "faults": [{"kind": "kill", "when": {"point": "ckpt.metadata", "rank": 0,
                                                        "path": "checkpoints/step_8/.metadata"}}]}, "s.toml", "s")
    assert s.faults[0].when.path == "checkpoints/step_8/.metadata"


def folder(tmp_path):
    chaos = tmp_path / "chaos"
    chaos.mkdir()
    (chaos / "good.toml").write_text(GOOD)
    (chaos / "bad.toml").write_text(BAD)
    return chaos


BAD_ERROR = "bad.toml: command.save_every: wrong type str ('four'); expected int | None"


def test_an_invalid_file_does_not_stop_another_scenario_named(tmp_path):
    chaos = folder(tmp_path)
    out = cli("list", "--json", "--scenarios", str(chaos), "good", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert [s["name"] for s in json.loads(out.stdout)] == ["good"]
    assert f"ckpt-chaos list: bad not loaded: {chaos}/{BAD_ERROR}" in out.stderr, out.stderr
    out = cli("run", "--json", "--scenarios", str(chaos), "good", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    [row] = json.loads(out.stdout)["results"]
    assert (row["scenario"], row["verdict"]) == ("good", "skipped") and "ckpt_chaos_no_such_module" in row["reason"]
    assert f"ckpt-chaos run: bad not loaded: {chaos}/{BAD_ERROR}" in out.stderr, out.stderr


def test_the_invalid_file_named_or_in_the_suite_asked_for_exits_2_with_its_error(tmp_path):
    chaos = folder(tmp_path)
    out = cli("run", "--scenarios", str(chaos), "bad", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip() == f"ckpt-chaos run: {chaos}/{BAD_ERROR}", out.stderr
    out = cli("list", "--scenarios", str(chaos), cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == (f"ckpt-chaos list: 1 scenario file(s) of the folders selected do not load: "
                                  f"{chaos}/{BAD_ERROR}"), out.stderr
    assert not (tmp_path / "out").exists()
