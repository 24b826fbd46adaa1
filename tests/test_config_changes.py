"""A relaunch with changed options (``recovery.changes``) for a ``[command]`` trainer: how the options
reach its command line, the errors of a scenario that gets them wrong, and the check's reading of
its output, without launching; then the plain DDP example, which takes a changed seed without a
word, and a copy of it that refuses one (slow)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ckpt_chaos.check.history import named
from ckpt_chaos.report.results import apply_known_failure
from ckpt_chaos.run.command import argv
from ckpt_chaos.run.runner import run_scenario
from ckpt_chaos.scenario import ScenarioError, from_dict, load
from tests.helpers import REPO
from tests.test_any_trainer import planted

CHANGED_SEED = REPO / "examples" / "plain_ddp" / "scenarios" / "plain-ddp-relaunch-with-changed-seed-is-refused.toml"


def scenario(changes, refused=(), change_argv=None, source="chaos/c.toml"):
    command = {"argv": ["train.py", "--ckpt-dir", "{ckpt_dir}"], "save_every": 4}
    if change_argv is not None:
        command["change_argv"] = change_argv
    return from_dict({"world_size": 2, "command": command,
                      "faults": [{"kind": "kill", "target": "all", "when": {"point": "step.begin", "step": 3}}],
                      "recovery": {"max_restarts": 3, "changes": changes}, "expect": {"refused": list(refused)}},
                     source, "c")


def test_each_change_goes_on_that_relaunchs_command_line_only():
    s = scenario([{"seed": 7, "fast": True}, {}, {"lr": 0.5}])
    at = {n: argv(s, Path("/r"), n, 2)[3:] for n in range(4)}
    assert at == {0: [], 1: ["--seed=7", "--fast=true"], 2: [], 3: ["--lr=0.5"]}
    two_words = scenario([{"seed": 7}], change_argv=["--{key}", "{value}"])
    assert argv(two_words, Path("/r"), 1, 2)[3:] == ["--seed", "7"]


@pytest.mark.parametrize("changes, refused, change_argv, key, says", [
    ([{"seed": [7]}], (), None, "recovery.changes[0].seed", "[7] cannot go on a command line"),
    ([{"seed": 7}], (), ["--seed"], "command.change_argv", "does not name the changed key"),
    ([{"seed": 7}], (), ["--{key}={val}"], "command.change_argv", "unknown placeholder {val}"),
    ([{"seed": 7}], ("lr",), None, "expect.refused", "'lr' is changed by no relaunch"),
])
def test_a_change_a_command_line_cannot_carry_names_file_key_and_fix(changes, refused, change_argv, key, says):
    with pytest.raises(ScenarioError) as e:
        scenario(changes, refused, change_argv)
    assert str(e.value).startswith(f"chaos/c.toml: {key}: ") and says in str(e.value), str(e.value)


def test_an_option_counts_as_named_only_in_what_the_job_printed():
    echo = "/venv/bin/python -m torch.distributed.run train.py --seed 7\n"
    assert named(echo + "rank 0: resumed from step_00000004.pt at step 4\n", ["seed"]) == []
    assert named(echo + "torch.manual_seed(7) was called\n", ["seed"]) == []  # a word, not a piece of one
    assert named(echo + "SystemExit: refusing to resume: seed changed from 0 to 7\n", ["seed", "lr"]) == ["seed"]


@pytest.mark.nightly  # make test: the reference's config-change tests
@pytest.mark.slow
def test_the_example_takes_a_changed_seed_without_a_word_and_the_check_says_so(tmp_path, command_golden_root):
    s = load(CHANGED_SEED)
    r = run_scenario(s, tmp_path, command_golden_root)
    c = {c["name"]: (c["verdict"], c["detail"]) for c in r.checks}
    assert apply_known_failure(r.to_dict(), s.expect.known_failure)["verdict"] == "xfail", r.reason
    verdict, detail = c["config_refused@1"]
    assert verdict == "fail" and "launch 1 changed seed = 7, which a resume must refuse, but it exited with status " \
        "0; it trained steps 5 to 12; its output names none of seed" in detail, detail
    assert c["trajectory"][0] == "fail" and "trained on different samples" in c["trajectory"][1], c["trajectory"]


REFUSES_A_CHANGED_CONFIG = (
    ("    args = parse()\n",
     "    args = parse()\n    config = {'seed': args.seed, 'batch': args.batch, 'samples': args.samples}\n"),
    ("        state = torch.load(last, weights_only=False)\n",
     "        state = torch.load(last, weights_only=False)\n"
     "        changed = [k for k in config if state['config'][k] != config[k]]\n"
     "        if changed:\n"
     "            raise SystemExit(f'refusing to resume from {last.name}: {\", \".join(changed)} changed')\n"),
    ('"step": step, "rng": rngs,', '"step": step, "rng": rngs, "config": config,'),
)


@pytest.mark.slow
@pytest.mark.nightly  # the check's pass; make test holds its fail on the example itself, above
def test_a_copy_that_refuses_a_changed_seed_passes_and_resumes_once_it_is_put_back(tmp_path, command_golden_root):
    copy = tmp_path / "train.py"
    copy.write_text(planted(*REFUSES_A_CHANGED_CONFIG))
    s = load(CHANGED_SEED)
    args = [str(copy) if a == "examples/plain_ddp/train.py" else a for a in s.command.argv]
    s = dataclasses.replace(s, command=dataclasses.replace(s.command, argv=args, key=[str(copy)]),
                            expect=dataclasses.replace(s.expect, known_failure=None))
    r = run_scenario(s, tmp_path / "out", command_golden_root)
    c = {c["name"]: (c["verdict"], c["detail"]) for c in r.checks}
    assert r.verdict == "pass", r.reason
    assert c["config_refused@1"] == ("pass", "launch 1 changed seed = 7 and was refused: it exited 1 naming seed "
                                     "without training a step, its complete checkpoints as they were"), c
    assert c["resumed_newest@2"][0] == "pass" and "step_00000004.pt" in c["resumed_newest@2"][1], c
