"""The file evidence follows the save idioms trainers use, judged through the real harness on a
DeepSpeed-style trainer (tests/trainers/deepspeed_style.py, 2 ranks under torchrun) on faultfs, where
fanotify sees opens and closes but no renames: every rank writes its ``rankR_state.pt`` under a
temporary name with ``os.open``/``os.write``/``os.fsync``/``os.close``, renames it into place, and rank 0
then moves the ``latest`` pointer the same way. Rank 1 is SIGKILLed half-way through step 8's file.

Expected verdicts, from what the trainer's code does:

* the correct save (rank 0 with a fixed temporary name, ``rank0_state.pt.tmp`` and ``latest.tmp``,
  rank 1 with one named by its pid: both idioms in one run): ``latest`` still names ``global_step4``
  when the kill lands, both of its files whole, so the relaunch resumes from it:
  ``resumed_newest@1``, ``no_torn_read@1`` and ``committed_valid`` pass. The killed writer's
  temporary file, half written, is left in ``global_step8``, which the relaunch saves again; its
  loader opens ``rankR_state.pt`` by name and never reads it: reported as a stray, not a failure;
* written in place with the pointer moved first: ``latest`` names ``global_step8`` while rank 1's
  file there is half written; the relaunch's rank 1 loads it and dies, writing nothing, so the job
  ends counting that torn file complete: ``no_torn_read@1`` and ``committed_valid`` fail, the torn
  file named, although the launch that tore it was not the last.

Needs root and /dev/fuse (faultfs); skipped with the reason without them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_chaos.env.storage import Storage, StorageSpec, missing
from ckpt_chaos.run.runner import run_scenario
from ckpt_chaos.scenario import load
from tests.helpers import REPO

NO_FAULTFS = missing("host", faultfs=True)
needs_faultfs = pytest.mark.skipif(NO_FAULTFS is not None, reason=f"cannot mount faultfs here: {NO_FAULTFS}")

TRAINER = REPO / "tests" / "trainers" / "deepspeed_style.py"
RANK1 = "checkpoints/global_step8/rank1_state.pt"


def scenario(tmp_path, *options: str):
    argv = ", ".join(f'"{a}"' for a in (str(TRAINER), "--ckpt-dir", "{ckpt_dir}", *options))
    path = tmp_path / "deepspeed-style-kill-rank1-mid-write.toml"
    path.write_text(f"""
description = "rank 1 is SIGKILLed half-way through writing step 8's rank1_state.pt"
world_size = 2
[command]
argv = [{argv}]
key = ["{TRAINER}"]
complete = {{ pointer = "latest" }}
save_every = 4
[[faults]]
kind = "kill"
target = "rank:1"
when = {{ point = "faultfs.write", rank = 1, path = "{RANK1}", min_fraction = 0.5 }}
""")
    return load(path)


def checks(tmp_path, golden_root, *options: str) -> tuple[dict[str, tuple[str, str]], int]:
    """The run's checks, and how many bytes of rank 1's file the kill left (half the golden run's)."""
    r = run_scenario(scenario(tmp_path, *options), tmp_path / "out", golden_root)
    out = {c["name"]: (c["verdict"], c["detail"]) for c in r.checks}
    assert out["fault_0_fired"][0] == "pass", (r.reason, out)
    size = json.loads((Path(r.run_dir) / "golden" / "planned.json").read_text())["sizes"][RANK1]
    return out, -(-size // 2)


_WRITER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
os.write(fd, b"x" * 1000)
if sys.argv[2] == "close":
    os.close(fd)
print("written", flush=True)
time.sleep(60)
"""


@needs_faultfs
@pytest.mark.parametrize("how", ["close", "killed"])
def test_faultfs_says_a_file_was_closed_by_its_writers_death_not_by_the_writer(tmp_path, how):
    """A writer killed with its file open never closes it: the kernel does as the process ends, and
    faultfs says so (``exited``), so that a writer killed by anything, not only a held fault, leaves
    its file torn in the evidence."""
    from ckpt_chaos.env.storage import FAULTFS_POINTS
    from ckpt_chaos.run.controller import ProbeServer

    events = []
    with ProbeServer(events.append) as server, Storage(tmp_path, StorageSpec(faultfs=True)) as st:
        st.client.call("report", controller=server.address, points=list(FAULTFS_POINTS), prefix="checkpoints")
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(st.ckpt / "w.bin"), how], stdout=subprocess.PIPE,
                                env={**os.environ, "CKPT_CHAOS_CONTROLLER": server.address, "RANK": "0"})
        assert proc.stdout.readline() == b"written\n"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        proc.stdout.close()
    [done] = [e["info"] for e in events if e["point"] == "faultfs.done"]
    assert done["bytes"] == 1000 and done.get("exited", False) == (how == "killed"), done


@pytest.mark.slow
@needs_faultfs
def test_an_atomic_save_on_faultfs_resumes_from_the_pointer_without_a_false_alarm(tmp_path, golden_root):
    c, half = checks(tmp_path, golden_root, "--tmp", "fixed,pid")
    for name in ("resumed_newest@1", "no_torn_read@1", "committed_valid"):
        assert c[name][0] == "pass", (name, c[name][1])
    assert "checkpoints/global_step4" in c["resumed_newest@1"][1]
    # the killed writer's temporary file is still in global_step8, which the relaunch saved again
    detail = c["committed_valid"][1]
    assert re.search(rf"stray .*checkpoints/global_step8/\.rank1_state\.pt\.tmp\d+: {half} of \d+ bytes written "
                     r"\(the golden run's checkpoints/global_step8/rank1_state\.pt\), never completed, by launch 0",
                     detail), detail


@pytest.mark.slow
@needs_faultfs
def test_a_torn_file_an_earlier_launch_left_in_a_complete_checkpoint_fails_committed_valid(tmp_path, golden_root):
    c, half = checks(tmp_path, golden_root, "--tmp", "none", "--pointer-first")
    verdict, detail = c["no_torn_read@1"]
    assert verdict == "fail" and f"{RANK1}: {half} of " in detail, (verdict, detail)
    verdict, detail = c["committed_valid"]
    assert verdict == "fail" and f"{RANK1}: {half} of " in detail and "never completed, by launch 0" in detail, \
        (verdict, detail)
