"""Following a file through the renames of the golden run (ckpt_chaos/probe/follow.py): the plan made
of a synthetic golden probe.jsonl, the run's side that finds each file again under a new random
name, the generator firing on the final name, and the refusal of a trigger nothing can reach (no
processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt_chaos.probe import follow
from ckpt_chaos.run import command
from ckpt_chaos.run.triggers import Generator
from ckpt_chaos.scenario import Fault, ScenarioError, Trigger, load


def ev(point: str, rank: int = 0, **info) -> dict:
    return {"point": point, "rank": rank, "info": info}


def safetensors_save(step: int, tmp: str, size: int, opt_tmp: str | None = None, opt_size: int = 0) -> list[dict]:
    """What faultfs reports of safetensors' writer saving ``model.safetensors`` (and, with ``opt_tmp``,
    a larger ``optimizer.safetensors`` first) into ``checkpoints/step_N``: a temporary file beside it,
    renamed into place before it is closed."""
    d = f"checkpoints/step_{step}"
    out = []
    for name, t, n in ([("optimizer.safetensors", opt_tmp, opt_size)] if opt_tmp else []) + [
            ("model.safetensors", tmp, size)]:
        out += [ev("faultfs.write", path=f"{d}/{t}", offset=0, bytes=1 << 20)] if n > 1 << 20 else []
        out += [ev("faultfs.rename", path=f"{d}/{name}", src=f"{d}/{t}"),
                ev("faultfs.done", path=f"{d}/{name}", bytes=n, size=n, opened=f"{d}/{t}")]
    return out


# ---- the plan ---------------------------------------------------------------------------------------

def test_a_temporary_file_is_planned_under_its_final_name_and_keyed_by_its_masked_name_and_ordinal():
    events = (safetensors_save(4, ".tmpYwRTPf", 2_000_000, ".tmpAb12Cd", 5_000_000)
              + safetensors_save(8, ".tmpQ9xZ0k", 2_000_001, ".tmp7h3JkL", 5_000_001))
    p = follow.plan(events)
    assert p["sizes"]["checkpoints/step_8/model.safetensors"] == 2_000_001
    assert p["sizes"]["checkpoints/step_8/.tmpQ9xZ0k"] == 2_000_001
    assert {"checkpoints", "step_4", "step_8", "model", "optimizer", "safetensors"} <= set(p["vocab"])
    assert not any(w.startswith("tmp") for w in p["vocab"])  # the random names are not words to keep
    same = p["files"]["faultfs"]["0"]["checkpoints/step_8/.*"]  # two random names, in the order written
    assert same == [{"names": ["checkpoints/step_8/.tmp7h3JkL", "checkpoints/step_8/optimizer.safetensors"],
                     "size": 5_000_001},
                    {"names": ["checkpoints/step_8/.tmpQ9xZ0k", "checkpoints/step_8/model.safetensors"],
                     "size": 2_000_001}]


def fsspec_save(step: int, tmp: str) -> list[dict]:
    """What the probe layer reports of Fabric's save through fsspec with TMPDIR = tmp: ``mkstemp``
    makes the file (an empty os.open'd file, closed), fsspec opens it by name, writes it and renames it
    into the checkpoint folder."""
    return [ev("file.done", path=f"tmp/{tmp}", bytes=0, via="os.write"),
            ev("file.write", path=f"tmp/{tmp}", bytes=19187, fraction=1.0, via="open"),
            ev("file.done", path=f"tmp/{tmp}", bytes=19187, via="open"),
            ev("file.rename", path=f"checkpoints/step_{step}.ckpt", src=f"tmp/{tmp}", call="rename")]


def test_a_mkstemp_file_written_again_by_name_and_renamed_keeps_no_random_word_and_is_found_again():
    """The empty file mkstemp left is written over by the file fsspec writes under its name: it is no
    file kept, so its random name is no word of the vocabulary, and the run's file of the same ordinal,
    under other random names, carries the final name."""
    events = [ev("file.done", path="tmp/264zj2k8", bytes=4, via="os.write"),
              ev("file.remove", path="tmp/264zj2k8", call="unlink"),
              *fsspec_save(4, "tmpaake04wa"), *fsspec_save(8, "tmpzudyyrd7")]
    p = follow.plan(events)
    assert p["vocab"] == ["checkpoints", "ckpt", "step_4", "step_8"], p["vocab"]
    run = follow.Follower(json.loads(json.dumps(p)))
    opened = [run.open("file", 0, f"tmp/{name}") for name in
              ("u34oe1e6", "tmp0zo4vvhs", "tmp0zo4vvhs", "tmpv9t26fae", "tmpv9t26fae")]
    assert opened[4] == (19187, ["tmp/tmpzudyyrd7", "checkpoints/step_8.ckpt"]), opened
    assert follow.matches({"path": "tmp/tmpv9t26fae", "aliases": opened[4][1]}, "checkpoints/step_8.ckpt")


def test_a_run_finds_each_temporary_file_again_under_new_random_names_with_its_own_size():
    golden = follow.plan(safetensors_save(8, ".tmpQ9xZ0k", 2_000_001, ".tmp7h3JkL", 5_000_001))
    run = follow.Follower(json.loads(json.dumps(golden)))  # as planned.json carries it
    # the optimizer's (larger) file is written first: the second temporary file is the model's, and is
    # cut at tenths of the model's size, not of the largest file a glob would match
    assert run.open("faultfs", 0, "checkpoints/step_8/.tmpNEW111") == (
        5_000_001, ["checkpoints/step_8/.tmp7h3JkL", "checkpoints/step_8/optimizer.safetensors"])
    assert run.open("faultfs", 0, "checkpoints/step_8/.tmpNEW222") == (
        2_000_001, ["checkpoints/step_8/.tmpQ9xZ0k", "checkpoints/step_8/model.safetensors"])
    assert run.open("faultfs", 0, "checkpoints/step_8/.tmpNEW333") == (None, [])  # the golden run had two
    # another rank, another layer, a relaunch (which the golden run does not mirror): not these files
    assert run.open("faultfs", 1, "checkpoints/step_8/.tmpNEW444") == (None, [])
    assert run.open("file", 0, "checkpoints/step_8/.tmpNEW555") == (None, [])
    assert run.open("faultfs", 0, "checkpoints/step_8/.tmpNEW666", launch=1) == (None, [])
    # a stable name is its own key, and keeps its exact size on a relaunch too
    assert run.open("faultfs", 0, "checkpoints/step_8/model.safetensors", launch=1) == (2_000_001, [])


def test_a_staging_folder_renamed_into_place_takes_its_files_with_it():
    events = [ev("file.done", path="checkpoints/.stage-1a2b3c/model.pt", bytes=300),
              ev("file.done", path="checkpoints/.stage-1a2b3c/optim.pt", bytes=600),
              ev("file.rename", path="checkpoints/step_8", src="checkpoints/.stage-1a2b3c")]
    p = follow.plan(events)
    run = follow.Follower(p)
    assert run.open("file", 0, "checkpoints/.stage-9f8e7d/model.pt") == (
        300, ["checkpoints/.stage-1a2b3c/model.pt", "checkpoints/step_8/model.pt"])
    assert run.open("file", 0, "checkpoints/.stage-9f8e7d/optim.pt")[0] == 600


def test_a_file_staged_in_tmpdir_and_moved_is_followed_and_a_reused_temporary_name_by_its_ordinal():
    events = [ev("file.done", path="tmp/tmpk3j_x8a1", bytes=7000),  # fsspec's mkstemp in TMPDIR
              ev("file.rename", path="checkpoints/epoch=0-step=4.ckpt", src="tmp/tmpk3j_x8a1"),
              ev("file.done", path="tmp/tmp0p_q2zz9", bytes=7100),
              ev("file.rename", path="checkpoints/epoch=0-step=8.ckpt", src="tmp/tmp0p_q2zz9"),
              ev("file.done", path="ckpt/latest.tmp", bytes=10),  # one fixed temporary name, twice
              ev("file.rename", path="ckpt/latest", src="ckpt/latest.tmp"),
              ev("file.remove", path="ckpt/latest"),
              ev("file.done", path="ckpt/latest.tmp", bytes=12),
              ev("file.rename", path="ckpt/latest", src="ckpt/latest.tmp")]
    run = follow.Follower(follow.plan(events))
    assert run.open("file", 0, "tmp/tmpzz_9a8b7") == (7000, ["tmp/tmpk3j_x8a1", "checkpoints/epoch=0-step=4.ckpt"])
    assert run.open("file", 0, "tmp/tmpyy_1c2d3")[1][-1] == "checkpoints/epoch=0-step=8.ckpt"
    assert run.open("file", 0, "ckpt/latest.tmp") == (10, ["ckpt/latest"])
    assert run.open("file", 0, "ckpt/latest.tmp") == (12, ["ckpt/latest"])


def test_an_older_flat_plan_still_plans_by_path_and_by_glob():
    run = follow.Follower({"ckpt/a.pt": 100, "ckpt/b*": 7})
    assert run.open("file", 0, "ckpt/a.pt") == (100, [])
    assert run.open("file", 0, "ckpt/b-1") == (7, [])


def test_the_generator_fires_a_trigger_on_the_final_name_at_the_temporary_files_fraction():
    g = Generator([Fault(kind="kill", when=Trigger(point="faultfs.write", rank=0, min_fraction=0.5,
                                                   path="checkpoints/step_8/model.safetensors"))])
    optimizer = {"path": "checkpoints/step_8/.tmpNEW111", "fraction": 0.5,
                 "aliases": ["checkpoints/step_8/.tmp7h3JkL", "checkpoints/step_8/optimizer.safetensors"]}
    model = {"path": "checkpoints/step_8/.tmpNEW222",
             "aliases": ["checkpoints/step_8/.tmpQ9xZ0k", "checkpoints/step_8/model.safetensors"]}
    assert g.observe({"point": "faultfs.write", "rank": 0, "info": optimizer}) == []
    assert g.observe({"point": "faultfs.write", "rank": 0, "info": {**model, "fraction": 0.4}}) == []
    assert [i for i, _ in g.observe({"point": "faultfs.write", "rank": 0, "info": {**model, "fraction": 0.5}})] == [0]


# ---- the refusal before the run ----------------------------------------------------------------------

SCENARIO = """
description = "t"
world_size = 2
[command]
argv = ["{{python}}", "train.py", "--ckpt-dir", "{{ckpt_dir}}"]
launcher = "self"
[[faults]]
kind = "kill"
target = "rank:0"
when = {when}
"""
ARMED = ev("probe.armed", points=["file.write", "file.done", "file.fsync", "file.rename", "ckpt.stage",
                                  "load.begin", "step.begin"])


def refusal(tmp_path: Path, when: str, events: list[dict], listing: dict | None = None) -> str | None:
    scenario = tmp_path / "s.toml"
    scenario.write_text(SCENARIO.format(when=when))
    golden = tmp_path / "golden"
    golden.mkdir(exist_ok=True)
    (golden / command.PROBE_LOG).write_text("".join(json.dumps(e) + "\n" for e in [ARMED, *events]))
    if listing is not None:
        (golden / command.LISTING).write_text(json.dumps(listing))
    try:
        command.check_triggers(load(scenario), golden)
    except ScenarioError as e:
        assert "\n" not in str(e)  # one paragraph
        return str(e)
    return None


ACCELERATE = [ev("ckpt.stage", name="step_8", path="checkpoints/step_8"),
              ev("file.done", path="checkpoints/step_8/optimizer.bin", bytes=8831),
              ev("faultfs.write", path="checkpoints/step_8/.tmpAb12Cd", offset=0, bytes=1 << 20),
              ev("faultfs.rename", path="checkpoints/step_8/model.safetensors", src="checkpoints/step_8/.tmpAb12Cd"),
              ev("faultfs.done", path="checkpoints/step_8/model.safetensors", bytes=1 << 21,
                 opened="checkpoints/step_8/.tmpAb12Cd"),
              ev("faultfs.fsync", path="checkpoints/step_8/optimizer.bin")]


def test_a_faultfs_write_on_the_final_name_is_accepted(tmp_path):
    when = '{ point = "faultfs.write", rank = 0, path = "checkpoints/step_8/model.safetensors", min_fraction = 0.5 }'
    assert refusal(tmp_path, when, ACCELERATE) is None


def test_a_file_write_on_a_native_writers_file_is_refused_saying_to_aim_at_faultfs(tmp_path):
    without_faultfs = [e for e in ACCELERATE if not e["point"].startswith("faultfs.")]
    when = '{ point = "file.write", rank = 0, path = "checkpoints/step_8/model.safetensors" }'
    msg = refusal(tmp_path, when, without_faultfs, listing={"checkpoints/step_8/model.safetensors": 1 << 21,
                                                            "checkpoints/step_8/optimizer.bin": 8831})
    assert msg.startswith(f"{tmp_path / 's.toml'}: faults[0].when.path: no file.write of rank 0 of the "
                          "fault-free run matches 'checkpoints/step_8/model.safetensors': "), msg
    assert ("checkpoints/step_8/model.safetensors is written by a native writer the layer does not see: aim at "
            "faultfs.write") in msg
    assert "the paths it reported: checkpoints/step_8/optimizer.bin" in msg


def test_a_file_write_trigger_on_a_file_only_native_code_wrote_is_refused(tmp_path):
    events = [ev("file.done", path="checkpoints/step_8/model.f32", bytes=75268, native=True, python_bytes=0),
              ev("file.done", path="checkpoints/step_8/index.json", bytes=15307)]
    msg = refusal(tmp_path, '{ point = "file.write", rank = 0, path = "checkpoints/step_8/model.f32" }', events)
    assert msg is not None and ("checkpoints/step_8/model.f32 is written by a native writer the layer does not "
                                "see: aim at faultfs.write") in msg, msg
    assert refusal(tmp_path, '{ point = "file.done", rank = 0, path = "checkpoints/step_8/model.f32" }',
                   events) is None


def test_a_file_staged_outside_the_watched_folders_is_refused_saying_to_set_tmpdir(tmp_path):
    # Lightning through fsspec: mkstemp in /tmp, then a move; the layer sees only the rename into place
    events = [ev("ckpt.stage", name="epoch=0-step=8.ckpt", path="checkpoints/epoch=0-step=8.ckpt"),
              ev("file.done", path="checkpoints/hparams.yaml", bytes=10),
              ev("file.rename", path="checkpoints/epoch=0-step=8.ckpt", src="/tmp/tmpk3j_x8a1")]
    msg = refusal(tmp_path, '{ point = "file.write", rank = 0, path = "checkpoints/epoch=0-step=8.ckpt" }', events)
    assert ("checkpoints/epoch=0-step=8.ckpt is staged outside the watched folders, as /tmp/tmpk3j_x8a1, and "
            'renamed into place (set TMPDIR = "{run_dir}/tmp" in command.env and add "tmp" to command.watch)') in msg


def test_a_point_that_does_not_follow_renames_says_the_temporary_name_it_reports(tmp_path):
    events = [ev("file.done", path="checkpoints/step_8.pt.tmp", bytes=100),
              ev("file.fsync", path="checkpoints/step_8.pt.tmp"),
              ev("file.rename", path="checkpoints/step_8.pt", src="checkpoints/step_8.pt.tmp")]
    msg = refusal(tmp_path, '{ point = "file.fsync", rank = 0, path = "checkpoints/step_8.pt" }', events)
    assert ("checkpoints/step_8.pt is written under a temporary name, checkpoints/step_8.pt.tmp, and renamed to "
            "checkpoints/step_8.pt: file.fsync reports it as checkpoints/step_8.pt.tmp") in msg, msg
    # a write point follows the rename: the same path is accepted there
    assert refusal(tmp_path, '{ point = "file.write", rank = 0, path = "checkpoints/step_8.pt" }', events) is None


@pytest.mark.parametrize("when,expect", [
    ('{ point = "ckpt.stage", path = "checkpoints/step_9" }',
     "no ckpt.stage of the fault-free run matches 'checkpoints/step_9'; the paths it reported: checkpoints/step_8; "
     "aim at one of them"),
    ('{ point = "load.begin", path = "checkpoints/step_8" }', "'load.begin' never happened in the fault-free run"),
    ('{ point = "file.write", rank = 1, path = "checkpoints/step_8/optimizer.bin" }',
     "checkpoints/step_8/optimizer.bin is reported by rank 0 only (set when.rank to it)"),
    ('{ point = "faultfs.write", path = "checkpoints/step_8/optimizer.safetensors" }',
     "the paths it reported: checkpoints/step_8/.tmpAb12Cd (renamed to checkpoints/step_8/model.safetensors)"),
])
def test_every_kind_of_point_is_refused_when_the_golden_run_never_reaches_it(tmp_path, when, expect):
    msg = refusal(tmp_path, when, ACCELERATE)
    assert msg is not None and expect in msg, msg


RENAME_BEFORE_CLOSE = r"""
import os, sys
d = sys.argv[1]
with open(os.path.join(d, "step_8.pt.tmp"), "wb") as f:  # Python's open(), renamed before it is closed
    f.write(b"p" * 5000)
    f.flush()
    os.fsync(f.fileno())
    os.replace(os.path.join(d, "step_8.pt.tmp"), os.path.join(d, "step_8.pt"))
fd = os.open(os.path.join(d, "rank1.pt.tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"d" * 3000)
os.fsync(fd)
os.replace(os.path.join(d, "rank1.pt.tmp"), os.path.join(d, "rank1.pt"))
os.close(fd)
"""


def test_a_file_renamed_before_it_is_closed_is_done_under_its_new_name_and_a_write_trigger_on_it_accepted(
        tmp_path):
    """The probe layer follows a rename of a file it has open: its file.done names where the file is
    (and where it was opened, ``opened``), so the golden run's file keeps both names and a file.write
    trigger on the final name is no native writer's file."""
    import os
    import subprocess
    import sys

    from ckpt_chaos.probe import auto
    from ckpt_chaos.run.controller import ProbeServer
    from tests.helpers import REPO

    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    events: list[dict] = []
    with ProbeServer(events.append) as server:
        env = {**os.environ, "RANK": "0",
               **auto.environment(server.address, tmp_path, [ckpt], pythonpath=str(REPO))}
        out = subprocess.run([sys.executable, "-c", RENAME_BEFORE_CLOSE, str(ckpt)], env=env, capture_output=True,
                             text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    done = {e["info"]["path"]: e["info"] for e in events if e["point"] == "file.done"}
    assert done["checkpoints/step_8.pt"] == {"path": "checkpoints/step_8.pt", "bytes": 5000, "via": "open",
                                             "opened": "checkpoints/step_8.pt.tmp"}, done
    assert done["checkpoints/rank1.pt"]["opened"] == "checkpoints/rank1.pt.tmp", done
    assert [e["info"]["path"] for e in events if e["point"] == "file.fsync"] == [
        "checkpoints/step_8.pt.tmp", "checkpoints/rank1.pt.tmp"]  # fsynced before the renames
    names = {f["names"][-1]: f["names"] for f in follow.files(events)}
    assert names["checkpoints/step_8.pt"] == ["checkpoints/step_8.pt.tmp", "checkpoints/step_8.pt"]
    assert names["checkpoints/rank1.pt"] == ["checkpoints/rank1.pt.tmp", "checkpoints/rank1.pt"]
    probe_events = [{k: e[k] for k in ("point", "rank", "info")} for e in events]
    for path in ("checkpoints/step_8.pt", "checkpoints/rank1.pt"):
        when = f'{{ point = "file.write", rank = 0, path = "{path}", min_fraction = 0.5 }}'
        assert refusal(tmp_path, when, probe_events) is None


def test_a_file_write_trigger_on_a_file_python_wrote_only_the_header_of_is_refused_as_native(tmp_path):
    """np.save on a Python file writes its 128-byte header through it and the array through the
    descriptor: file.write reports from a tenth of the file, which Python's bytes never reach, so a
    trigger on it could never fire; a file whose Python bytes reach a tenth is reported."""
    events = [ev("file.done", path="checkpoints/step_8.npy.tmp", bytes=13984, native=True, python_bytes=128),
              ev("file.rename", path="checkpoints/step_8.npy", src="checkpoints/step_8.npy.tmp"),
              ev("file.done", path="checkpoints/mixed.bin", bytes=10000, native=True, python_bytes=1000)]
    msg = refusal(tmp_path, '{ point = "file.write", rank = 0, path = "checkpoints/step_8.npy", min_fraction = 0.5 }',
                  events)
    assert msg is not None and ("checkpoints/step_8.npy is written by a native writer the layer does not see: aim at "
                                "faultfs.write (Python wrote 128 of its 13984 bytes") in msg, msg
    assert refusal(tmp_path, '{ point = "file.write", rank = 0, path = "checkpoints/mixed.bin" }', events) is None
