"""Planted bug: after a resume the wall-clock checkpoint cadence never comes due again, as when the
timer is restored from the checkpoint's wall-clock creation time into a monotonic clock. A job
that crashes twice loses everything the relaunch trained."""
from reference_trainer import train

_resume = train.Trainer.resume


def _resume_and_lose_the_timer(self):
    _resume(self)
    if self.ts.progress.step:
        self.cfg.ckpt_every_seconds = 1e9


train.Trainer.resume = _resume_and_lose_the_timer

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
