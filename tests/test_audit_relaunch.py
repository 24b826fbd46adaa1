"""The audit's stop-and-relaunch run (``ckpt_chaos/audit/relaunch.py``): a trainer that starts over on its
relaunch is told so in one line with the fix, before any scenario runs; one that resumes has what it
read, in order, in its profile."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ckpt_chaos.audit.discover import discover
from ckpt_chaos.audit.relaunch import Relaunch, describe, never_resumed, scenario
from tests.helpers import REPO
from tests.test_audit import ARGV, plain_ddp


def test_the_stop_is_the_kill_familys_scenario_between_the_first_two_saves(tmp_path):
    p = discover(plain_ddp(tmp_path))
    g = scenario(p)
    assert g is not None and g.family == "kill" and g.fault == "SIGKILL all"
    assert 'point = "step.begin"' in g.text and "step = 7" in g.text  # between step_4 and step_8


def test_a_relaunch_that_started_over_stops_the_audit_with_the_fix(tmp_path):
    p = discover(plain_ddp(tmp_path))
    over = Relaunch("s", "/runs/s", True, None, 1, [], "no checkpoint file was read; it trained step 1 again")
    why = never_resumed(p, over)
    assert why is not None and why.startswith("the trainer never resumed: stopped after its save of step_00000004.pt")
    assert "trained from step 1 again" in why and "--relaunch-args" in why and why.endswith("/runs/s")
    # resumed, or not known: the audit goes on
    resumed = Relaunch("s", "/runs/s", True, "checkpoints/step_00000004.pt", 5,
                       ["checkpoints/step_00000004.pt"], "it read checkpoints/step_00000004.pt")
    assert never_resumed(p, resumed) is None
    assert never_resumed(p, Relaunch("s", "/runs/s", False, missing="no fanotify record")) is None
    assert describe(resumed) == ["relaunch after a stop: resumed from checkpoints/step_00000004.pt "
                                 "(it read checkpoints/step_00000004.pt)",
                                 "  it read, in order: checkpoints/step_00000004.pt"]


@pytest.mark.slow
@pytest.mark.nightly  # make test: the unit above; the relaunch is an ordinary scenario run
def test_a_trainer_that_never_resumes_is_told_before_the_suite_runs(tmp_path, command_golden_root):
    text = (REPO / ARGV[0]).read_text()
    old = "    last = newest(args.ckpt_dir)\n"
    assert text.count(old) == 1
    copy = tmp_path / "train.py"
    copy.write_text(text.replace(old, "    last = None  # never resumes\n"))
    p = subprocess.run([sys.executable, "-m", "ckpt_chaos.cli", "audit", "--golden-dir", str(command_golden_root),
                        "--out", str(tmp_path / "out"), "--", str(copy), *ARGV[1:]],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert p.returncode == 2, p.stderr[-3000:]
    assert "the trainer never resumed: stopped after its save of step_00000004.pt" in p.stderr
    assert not (tmp_path / "out" / "reports").exists()  # no scenario of the suite ran
