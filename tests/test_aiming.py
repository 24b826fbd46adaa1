"""Aiming a fault at a ``[command]`` trainer: a trigger's filters are taken wherever its point carries
what they filter, and a scenario file that does not load stops only what asks for it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from ckpt_chaos.env.storage import missing
from ckpt_chaos.faults.process import wait_gone
from ckpt_chaos.scenario import from_dict

NO_FAULTFS = missing("host", faultfs=True)

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


# ---- between a file's truncation and its first byte ---------------------------------------------------

# A pointer rewritten in place, as a trainer that opens `latest` with "w" does: the open empties it, then
# its one write puts the new name in.
_IN_PLACE = """
import sys
with open(sys.argv[1], "w") as f:
    f.write("step_8")
"""


@pytest.mark.skipif(NO_FAULTFS is not None, reason=f"cannot mount faultfs here: {NO_FAULTFS}")
def test_a_kill_at_faultfs_truncate_leaves_a_file_rewritten_in_place_empty(tmp_path):
    from ckpt_chaos.env.storage import Storage, StorageSpec
    from ckpt_chaos.run.controller import ProbeServer

    hits = []

    def kill_at_truncate(e):
        if e["point"] == "faultfs.truncate" and not hits:
            hits.append(e)
            os.kill(e["pid"], signal.SIGKILL)
            wait_gone([e["pid"]], timeout=5)

    with ProbeServer(kill_at_truncate) as server, Storage(tmp_path, StorageSpec(faultfs=True)) as st:
        (st.ckpt / "latest").write_text("step_4")  # the harness's own write: not reported
        st.client.call("report", controller=server.address, points=["faultfs.truncate"], prefix="checkpoints")
        writer = subprocess.Popen([sys.executable, "-c", _IN_PLACE, str(st.ckpt / "latest")],
                                  env={**os.environ, "CKPT_CHAOS_CONTROLLER": server.address, "RANK": "0"})
        writer.wait(30)
        left = (st.view / "latest").read_bytes()
    assert writer.returncode == -signal.SIGKILL
    assert [(h["info"]["path"], h["info"]["before"], h["info"]["length"], h["rank"]) for h in hits] == [
        ("checkpoints/latest", 6, 0, 0)]
    assert left == b"", left  # emptied, and no byte of the new content in


def test_a_trigger_at_faultfs_truncate_is_aimed_by_path():
    s = from_dict({"command": {"argv": ["train.py"], "complete": {"pointer": "latest"}},
                   "faults": [{"kind": "kill", "target": "rank:0",
                               "when": {"point": "faultfs.truncate", "rank": 0, "path": "checkpoints/latest"}}]},
                  "s.toml", "s")
    assert s.storage_spec().faultfs  # a trigger on a point of faultfs mounts it
