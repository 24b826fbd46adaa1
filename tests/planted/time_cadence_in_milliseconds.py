"""Planted bug: the time cadence reads its clock in milliseconds and compares it with
ckpt_every_seconds, so every step is due and the trainer checkpoints (and stalls) at every step."""
import time
import types

from reference_trainer import train

train.time = types.SimpleNamespace(**{n: getattr(time, n) for n in dir(time) if not n.startswith("_")})
train.time.monotonic = lambda: time.monotonic() * 1000

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
