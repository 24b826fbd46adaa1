"""The reference trainer with timestamps at the borders of its start-up phases, for launch_phases.py.

``python -m benchmarks.timed_trainer ARGS`` runs ``python -m reference_trainer ARGS`` unchanged
(``--run-dir=DIR`` required), and each rank writes ``RUN_DIR/timing-rank<R>-<pid>.json``: when its process was created, when
torch and the trainer were imported, when the process group, the model and the resume were done,
when its first optimizer step ended, and when training returned. The wrappers only read the clock.
"""

from __future__ import annotations

import json
import os
import sys
import time



def _created() -> float:
    """When this process was created, on time.time()'s clock: its start tick in /proc against
    CLOCK_BOOTTIME now. (psutil's create_time adds the tick to a boot time rounded to the second, which
    shifted the launcher/imports border by up to a second; the two phases' sum was right.)"""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))


MARKS: dict[str, float] = {"created": _created(), "entered": time.time()}

import torch  # noqa: E402,F401

import reference_trainer.__main__ as cli  # noqa: E402
import reference_trainer.train as rt  # noqa: E402

MARKS["imported"] = time.time()


RUN_DIR = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--run-dir=")), ".")


def _save() -> None:
    # after every mark: a rank that is killed has written what it reached
    path = os.path.join(RUN_DIR, f"timing-rank{os.environ.get('RANK', '0')}-{os.getpid()}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(MARKS, fh)
    os.replace(path + ".tmp", path)


def _timed(name: str, fn):
    def wrapper(*args, **kwargs):
        MARKS.setdefault(f"{name}.begin", time.time())
        try:
            return fn(*args, **kwargs)
        finally:
            if f"{name}.end" not in MARKS:
                MARKS[f"{name}.end"] = time.time()
                _save()
    return wrapper


rt.init_distributed = _timed("pg", rt.init_distributed)
rt.build_state = _timed("model", rt.build_state)
rt.Trainer.resume = _timed("resume", rt.Trainer.resume)
rt.Trainer.optimizer_step = _timed("step", rt.Trainer.optimizer_step)
rt.train = _timed("train", rt.train)  # reference_trainer.__main__ imports it late, from .train

if __name__ == "__main__":
    sys.argv[0] = "reference_trainer"
    cli.run_and_exit()
