"""The Lightning and Accelerate examples with one plausible checkpoint bug planted each: the scenario
that should catch it fails, and its failing check names the broken piece.

Both examples already fail their mid-epoch scenario's trajectory check (a known failure: the
framework's own resume is not exact), so each test asserts on a check the unmodified example passes
there (its row in docs/your-trainer.md), and on the raw verdict, before the known failure is applied.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ckpt_chaos.run.runner import run_scenario
from ckpt_chaos.scenario import load
from tests.helpers import REPO

pytestmark = pytest.mark.slow

EXAMPLES = REPO / "examples"


@pytest.fixture(scope="module")
def golden_root(command_golden_root):
    return command_golden_root


def plant(tmp_path: Path, example: str, *edits: tuple[str, str]) -> Path:
    """A copy of ``examples/<example>/train.py`` with ``edits`` (old, new) made: a bug planted in it."""
    text = (EXAMPLES / example / "train.py").read_text()
    for old, new in edits:
        assert text.count(old) == 1, f"the example no longer has {old!r}: update the planted bug"
        text = text.replace(old, new)
    copy = tmp_path / "train.py"
    copy.write_text(text)
    return copy


def run(tmp_path: Path, golden_root: Path, example: str, scenario: str, trainer: Path):
    s = load(EXAMPLES / example / "scenarios" / f"{scenario}.toml")
    script = f"examples/{example}/train.py"
    assert script in s.command.argv
    argv = [str(trainer) if a == script else a for a in s.command.argv]
    s = dataclasses.replace(s, command=dataclasses.replace(s.command, argv=argv, key=[str(trainer)]))
    return run_scenario(s, tmp_path / "out", golden_root)


def checks(result) -> dict[str, tuple[str, str]]:
    return {c["name"]: (c["verdict"], c["detail"]) for c in result.checks}


@pytest.mark.nightly  # make chaos-examples runs Lightning's own xfail
def test_lightning_without_save_last_starts_over_and_the_lost_work_names_it(tmp_path, golden_root):
    # ModelCheckpoint without save_last: the step-N files are written, but no last.ckpt, so the
    # relaunch's --ckpt-path last finds nothing; Lightning warns and trains from step 0 again
    trainer = plant(tmp_path, "lightning", ("save_top_k=-1,\n                                  save_last=True)",
                                            "save_top_k=-1)"))
    r = run(tmp_path, golden_root, "lightning", "lightning-kill-at-mid-epoch-step", trainer)
    assert r.verdict == "fail"
    c = checks(r)
    verdict, detail = c["lost_work@1"]
    assert verdict == "fail", r.checks
    assert detail == "6 step(s) trained again, at most 4 allowed: it went back to step 0 from 6", detail
    verdict, detail = c["resumed_newest@1"]  # what it resumed from: nothing, since last.ckpt never was
    assert verdict == "pass" and detail.startswith("nothing was complete, and the launch started fresh"), detail
    # a fresh start replays the golden run exactly: the lost work is what shows the bug
    assert c["trajectory"][0] == "pass", r.checks
    assert [n for n, (v, _) in c.items() if v in ("fail", "unknown")] == ["lost_work@1"], r.checks


@pytest.mark.nightly  # make chaos-examples runs Accelerate's scenarios
def test_accelerate_skipping_load_state_but_not_the_batches_is_caught_and_named(tmp_path, golden_root):
    # the step and the place in the epoch come from the folder's name, skip_first_batches skips to
    # it, but the state (model, optimizer, LR schedule, RNG) is never loaded
    trainer = plant(tmp_path, "accelerate", ("        accelerator.load_state(str(path))\n", ""))
    r = run(tmp_path, golden_root, "accelerate", "accelerate-kill-at-mid-epoch-step", trainer)
    assert r.verdict == "fail"
    verdict, detail = checks(r)["resumed_newest@1"]
    assert verdict == "fail", r.checks
    assert detail.startswith("it started fresh (") and detail.endswith("although checkpoints/step_4 was complete"), \
        detail
    assert checks(r)["lost_work@1"][0] == "fail", r.checks
