"""Planted bug: nothing removes an uploader's staging once that uploader is gone, so the hard links
of an upload cut short by a dead uploader keep the checkpoint's bytes on disk after retention deleted
it, for the rest of the job and after. This module is both the trainer and, through
``UPLOADER_MODULE``, its uploader process."""
from reference_trainer import remote

remote.sweep_staging = lambda root: None
remote.UPLOADER_MODULE = "tests.planted.uploader_keeps_stale_staging"

if __name__ == "__main__":
    from tests.planted import run_trainer_or_uploader

    run_trainer_or_uploader()
