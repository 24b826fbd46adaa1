"""Planted bug: the resume refuses a changed learning rate, the one change anyone ever tried, and
silently accepts a change of any other field that shapes the trajectory (the seed, the batch, the
model's size): the relaunch loads the checkpoint and trains on as another run.
"""
from reference_trainer import train

_resume_mismatches = train.resume_mismatches


def _only_lr(saved, current):
    return [m for m in _resume_mismatches(saved, current) if m.startswith("lr:")]


train.resume_mismatches = _only_lr

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
