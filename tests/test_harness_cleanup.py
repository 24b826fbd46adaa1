"""The harness never leaves processes behind: Ctrl-C mid-scenario kills everything it started."""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from tests.helpers import processes_started_by, start_cli

pytestmark = pytest.mark.slow


def test_ctrl_c_mid_scenario_kills_every_process_and_exits_130(tmp_path):
    reports = tmp_path / "reports"
    cli = start_cli(tmp_path, "kill-node-mid-training", reports=reports)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(reports.glob("*/*/kill-node-mid-training/trajectory.jsonl")):
            time.sleep(0.2)  # rank 0 writes its first step there
        assert list(reports.glob("*/*/kill-node-mid-training/trajectory.jsonl")), "the scenario never trained"
        started = processes_started_by(tmp_path)
        assert len(started) >= 4, [p.cmdline() for p in started]  # the CLI, a launcher, two ranks
        cli.send_signal(signal.SIGINT)
        out, _ = cli.communicate(timeout=60)
    finally:
        cli.kill()
    assert cli.returncode == 130, out
    assert "interrupted" in out
    psutil.wait_procs(started, timeout=10)  # the warm spare agents leave as their parent's pipe closes
    left = processes_started_by(tmp_path)
    assert not left, f"left behind: {[(p.pid, p.cmdline()) for p in left]}"
