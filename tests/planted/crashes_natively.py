"""Not a checkpointing bug: rank 0 dies of a native crash (SIGSEGV, as torch/gloo did once in CI) at
the start of its first save, in the first launch of a chaos run only (golden runs are left alone), on
the first ``CKPT_CHAOS_TEST_CRASHES`` chaos runs of the test that sets it (counted in a file).
``CKPT_CHAOS_TEST_CRASH_ATTEMPT=1``: in the relaunch instead, after the scenario's fault fired.
``CKPT_CHAOS_TEST_CRASH_SIGNAL``: the signal's name (SIGSEGV by default; SIGABRT as gloo at exit)."""
import os
import signal
from pathlib import Path

from ckpt_chaos import probe
from reference_trainer import checkpoint

_save = checkpoint.CheckpointManager.save


def save(self, *args, **kwargs):
    counter = Path(os.environ.get("CKPT_CHAOS_TEST_CRASH_COUNTER", "/nonexistent/counter"))
    attempt = os.environ.get("CKPT_CHAOS_ATTEMPT", "0") == os.environ.get("CKPT_CHAOS_TEST_CRASH_ATTEMPT", "0")
    if self.rank == 0 and probe.active() and attempt and counter.parent.is_dir():
        done = int(counter.read_text()) if counter.exists() else 0
        if done < int(os.environ.get("CKPT_CHAOS_TEST_CRASHES", "0")):
            counter.write_text(str(done + 1))
            os.kill(os.getpid(), getattr(signal, os.environ.get("CKPT_CHAOS_TEST_CRASH_SIGNAL", "SIGSEGV")))
    return _save(self, *args, **kwargs)


checkpoint.CheckpointManager.save = save

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
