"""Planted bug: after a preemption the uploads are drained for the whole upload_drain_s, as at the
end of training, not for what is left of the grace period: while the uploader retries, rank 0
outlives the grace and is SIGKILLed."""
from reference_trainer import train

_save_and_exit = train.Trainer.save_and_exit


def _drain_as_at_the_end(self, reason):
    rc = _save_and_exit(self, reason)
    self.upload_drain_s = self.cfg.upload_drain_s
    return rc


train.Trainer.save_and_exit = _drain_as_at_the_end

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
