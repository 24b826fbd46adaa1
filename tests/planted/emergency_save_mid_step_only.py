"""Planted bug: the emergency save on SIGTERM is written only when a step is part-way through its
micro-batches ("at a step boundary the cadence checkpoint has it"). At a boundary that is not a
cadence step, every step since the last checkpoint is lost.
"""
from reference_trainer import train

_save_and_exit = train.Trainer.save_and_exit


def _save_and_exit_mid_step_only(self, reason):
    p = self.ts.progress
    if p.micro == 0:
        self.ckpt.wait()
        self.ckpt.last_saved = (p.step, p.micro)  # taken for the checkpoint already at this position
    return _save_and_exit(self, reason)


train.Trainer.save_and_exit = _save_and_exit_mid_step_only

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
