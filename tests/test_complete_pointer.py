"""``command.complete``: a glob in the checkpoint folder, or the one checkpoint a pointer file names
(DeepSpeed's ``latest`` holding ``global_step8``; Megatron's ``latest_checkpointed_iteration.txt``
holding ``8`` for ``iter_0000008``). Loading, its errors, and ``complete()`` / ``pointer()`` on
checkpoint folders laid out by hand; nothing is launched."""

from __future__ import annotations

import tomllib

import pytest

from ckpt_chaos.run.command import complete, pointer
from ckpt_chaos.scenario import ScenarioError, from_dict, load

DEEPSPEED = {"pointer": "latest"}
MEGATRON = {"pointer": "latest_checkpointed_iteration.txt", "format": "iter_{:07d}"}


def scenario(complete_: object, source: str = "chaos/ds.toml"):
    return from_dict({"world_size": 2, "command": {"argv": ["train.py", "--save", "{ckpt_dir}"],
                                                   "complete": complete_, "save_every": 4}}, source, "ds")


def test_the_forms_load_and_round_trip(tmp_path):
    assert scenario("step_*").command.complete == "step_*"
    assert scenario(DEEPSPEED).command.complete == DEEPSPEED
    assert scenario(MEGATRON).command.complete == MEGATRON
    f = tmp_path / "megatron.toml"
    f.write_text('[command]\nargv = ["pretrain_gpt.py"]\n'
                 'complete = { pointer = "latest_checkpointed_iteration.txt", format = "iter_{:07d}" }\n')
    s = load(f)
    assert s.command.complete == MEGATRON
    again = from_dict(tomllib.loads(s.to_toml()), "again.toml", "again")
    assert again.command.complete == MEGATRON


@pytest.mark.parametrize("value, key, says", [
    ({"pointer": "latest", "fmt": "x"}, "command.complete.fmt", "unknown key; allowed keys: pointer, format"),
    ({"format": "iter_{:07d}"}, "command.complete.pointer", "missing; name the file in ckpt_dir"),
    ({"pointer": "../latest"}, "command.complete.pointer", "'../latest' is not one file inside ckpt_dir"),
    ({"pointer": "/abs/latest"}, "command.complete.pointer", "is not one file inside ckpt_dir"),
    ({"pointer": "latest*"}, "command.complete.pointer", "without wildcards"),
    ({"pointer": 8}, "command.complete.pointer", "8 is not one file"),
    ({"pointer": "latest", "format": "iter"}, "command.complete.format", "has 0 replacement field(s)"),
    ({"pointer": "latest", "format": "iter_{n}"}, "command.complete.format", "{n}; write a template with one {}"),
    ({"pointer": "latest", "format": "{}_{}"}, "command.complete.format", "has 2 replacement field(s)"),
    ({"pointer": "latest", "format": "iter_{:s}"}, "command.complete.format", "Unknown format code 's'"),
    ({"pointer": "latest", "format": "../{}"}, "command.complete.format", "makes '../8', which is not inside"),
    ({"pointer": "latest", "format": 7}, "command.complete.format", "wrong type int"),
    ("", "command.complete", "'' is not a glob inside ckpt_dir"),
    ("/ckpt/step_*", "command.complete", "is not a glob inside ckpt_dir"),
    (3, "command.complete", "wrong type int"),
])
def test_a_bad_complete_names_file_key_and_fix(value, key, says):
    with pytest.raises(ScenarioError) as e:
        scenario(value)
    msg = str(e.value)
    assert msg.startswith(f"chaos/ds.toml: {key}: ") and says in msg, msg
    assert "e.g." in msg or "expected" in msg  # the fix


def deepspeed_layout(run):
    ckpt = run / "checkpoints"
    for tag in ("global_step4", "global_step8"):
        (ckpt / tag).mkdir(parents=True)
        (ckpt / tag / "mp_rank_00_model_states.pt").write_bytes(b"m" * 100)
        (ckpt / tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"o" * 50)
    (ckpt / "latest").write_text("global_step8\n")
    return ckpt


def test_deepspeed_latest_names_the_one_complete_checkpoint(tmp_path):
    ckpt = deepspeed_layout(tmp_path)
    s = scenario(DEEPSPEED)
    got = complete(s, tmp_path)
    assert list(got) == ["checkpoints/global_step8"]  # not global_step4, although it is there too
    assert got["checkpoints/global_step8"]["size"] == 150
    assert got["checkpoints/global_step8"]["mtime_ns"] == (ckpt / "global_step8").stat().st_mtime_ns
    assert got["checkpoints/global_step8"]["via"] == "checkpoints/latest"
    assert pointer(s, tmp_path) == {"file": "checkpoints/latest", "content": "global_step8",
                                    "checkpoint": "checkpoints/global_step8", "problem": None}
    # the same folder under a glob: every match, the entries as they always were
    assert set(complete(scenario("global_step*"), tmp_path)) == {"checkpoints/global_step4", "checkpoints/global_step8"}
    assert all(set(v) == {"size", "mtime_ns"} for v in complete(scenario("global_step*"), tmp_path).values())
    assert pointer(scenario("global_step*"), tmp_path) is None


def test_megatron_iteration_number_formatted_into_the_folder(tmp_path):
    ckpt = tmp_path / "checkpoints"
    for it in (4, 8):
        (ckpt / f"iter_{it:07d}" / "mp_rank_00").mkdir(parents=True)
        (ckpt / f"iter_{it:07d}" / "mp_rank_00" / "model_optim_rng.pt").write_bytes(b"x" * it)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("8")
    s = scenario(MEGATRON)
    got = complete(s, tmp_path)
    assert got == {"checkpoints/iter_0000008": {"size": 8, "mtime_ns": (ckpt / "iter_0000008").stat().st_mtime_ns,
                                                "via": "checkpoints/latest_checkpointed_iteration.txt"}}
    (ckpt / "latest_checkpointed_iteration.txt").write_text("release\n")  # not a number: nothing complete
    assert complete(s, tmp_path) == {}
    assert pointer(s, tmp_path)["problem"] == ("checkpoints/latest_checkpointed_iteration.txt holds 'release', "
                                               "not the number format 'iter_{:07d}' takes")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("12\n")
    assert complete(s, tmp_path) == {}
    assert "names 'iter_0000012', which does not exist (a dangling pointer)" in pointer(s, tmp_path)["problem"]


@pytest.mark.parametrize("content, problem", [
    (None, "checkpoints/latest does not exist"),
    ("", "checkpoints/latest is empty"),
    ("  \n", "checkpoints/latest is empty"),
    ("global_step12\n", "checkpoints/latest names 'global_step12', which does not exist (a dangling pointer)"),
    ("glob\x00\x00\x00", "checkpoints/latest is garbled"),  # a torn write: zeros after what was written
    ("global_step4\nglobal_step8\n", "checkpoints/latest is garbled"),
    ("../../elsewhere", "names '../../elsewhere', which is not inside the checkpoint folder checkpoints"),
    (".", "names '.', which is not inside the checkpoint folder"),
])
def test_a_missing_empty_garbled_or_dangling_pointer_means_nothing_is_complete(tmp_path, content, problem):
    ckpt = deepspeed_layout(tmp_path)
    if content is None:
        (ckpt / "latest").unlink()
    else:
        (ckpt / "latest").write_text(content)
    s = scenario(DEEPSPEED)
    assert complete(s, tmp_path) == {}
    p = pointer(s, tmp_path)
    assert p["checkpoint"] is None and p["file"] == "checkpoints/latest"
    assert problem in p["problem"], p
    assert p["content"] == (None if content is None else content.strip())


def test_a_pointer_in_another_checkpoint_folder_and_to_a_file(tmp_path):
    (tmp_path / "out" / "ckpts").mkdir(parents=True)
    (tmp_path / "out" / "ckpts" / "model_8.pt").write_bytes(b"abc")
    (tmp_path / "out" / "latest.txt").write_text("ckpts/model_8.pt")
    s = from_dict({"command": {"argv": ["t.py"], "ckpt_dir": "out", "complete": {"pointer": "latest.txt"}}},
                  "x.toml", "x")
    got = complete(s, tmp_path)
    assert list(got) == ["out/ckpts/model_8.pt"] and got["out/ckpts/model_8.pt"]["size"] == 3
    assert got["out/ckpts/model_8.pt"]["via"] == "out/latest.txt"
