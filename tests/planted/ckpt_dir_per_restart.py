"""Planted bug (Slurm): the checkpoint directory is keyed on the job's restart count.

``checkpoints-restart-$SLURM_RESTART_COUNT`` looks tidy, one folder per run; a requeued run then
finds an empty folder and trains from scratch, whatever the run before it saved.
"""
import os
from pathlib import Path

from reference_trainer.config import TrainConfig

TrainConfig.checkpoint_dir = property(
    lambda self: Path(self.run_dir) / f"checkpoints-restart-{os.environ.get('SLURM_RESTART_COUNT', '0')}")

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
