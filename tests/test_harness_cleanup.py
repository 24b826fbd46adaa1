"""The harness never leaves processes behind: Ctrl-C mid-scenario kills everything it started."""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from tests.helpers import start_cli

pytestmark = pytest.mark.slow


def processes_mentioning(text: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(text in part for part in p.info["cmdline"] or []):
                out.append(p)
        except psutil.Error:
            pass
    return out


def test_ctrl_c_mid_scenario_kills_every_process_and_exits_130(tmp_path):
    reports = tmp_path / "reports"
    cli = start_cli(tmp_path, "kill-node-mid-training", reports=reports)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(processes_mentioning(str(reports))) < 2:
            time.sleep(0.2)  # torchrun and its workers carry the run directory on their command line
        assert processes_mentioning(str(reports)), "the scenario never started"
        cli.send_signal(signal.SIGINT)
        out, _ = cli.communicate(timeout=60)
    finally:
        cli.kill()
    assert cli.returncode == 130, out
    assert "interrupted" in out
    left = processes_mentioning(str(tmp_path))
    assert not left, f"left behind: {[p.pid for p in left]}"
