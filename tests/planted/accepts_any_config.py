"""Planted bug: the resume never compares the checkpoint's configuration with the run's, so a
relaunch with a learning rate changed by mistake loads the checkpoint and trains on with it."""
from reference_trainer import train

train.resume_mismatches = lambda saved, current: []

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
