"""Planted bug: the emergency checkpoint of a preemption is saved inside a bare ``try``, so a save
that fails under on_save_failure = stop is swallowed and the job exits 0, as if it had stopped
cleanly with its checkpoint."""
from reference_trainer import train

_save_and_exit = train.Trainer.save_and_exit


def _swallowed(self, reason):
    save = self.ckpt.save

    def quiet(*args, **kwargs):
        try:
            return save(*args, **kwargs)
        except Exception:
            return False

    self.ckpt.save = quiet
    try:
        return _save_and_exit(self, reason)
    finally:
        self.ckpt.save = save


train.Trainer.save_and_exit = _swallowed

if __name__ == "__main__":
    from tests.planted import run_trainer_or_uploader

    run_trainer_or_uploader()
