"""The harness never leaves processes behind: Ctrl-C mid-scenario kills everything it started."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.helpers import REPO, processes_started_by, start_cli

pytestmark = pytest.mark.slow


@pytest.mark.nightly
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


# One scenario's probe server closes, the next one's opens, the harness is stopped and continued
# (Ctrl-Z, fg), then two ranks connect to the new server: each event must reach the new server.
STOPPED_BETWEEN_SERVERS = """
import json, os, signal, socket, subprocess
from ckpt_chaos.run.controller import ProbeServer
seen = []
old = ProbeServer(lambda event: seen.append("old"))
old.close()
new = ProbeServer(lambda event: seen.append("new"))
subprocess.Popen(["sh", "-c", f"for i in 1 2 3 4 5 6 7 8; do sleep 0.5; kill -CONT {os.getpid()} || exit; done"],
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
os.kill(os.getpid(), signal.SIGSTOP)
for rank in (0, 1):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(new.address)
        f = s.makefile("rwb", buffering=0)
        f.write(json.dumps({"rank": rank, "pid": 0, "point": "train.start", "t": 0}).encode() + b"\\n")
        f.readline()
new.close()
print(*seen)
"""


def test_a_closed_probe_server_takes_no_rank_of_the_next_one_after_a_stop():
    out = subprocess.run([sys.executable, "-c", STOPPED_BETWEEN_SERVERS], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["new", "new"], out.stdout + out.stderr
