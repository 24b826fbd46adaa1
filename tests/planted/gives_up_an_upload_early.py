"""Planted bug: the uploader gives a checkpoint up one attempt before upload_retries (an off-by-one
in its retry loop), so a store that would have taken the next attempt loses the checkpoint. This
module is both the trainer and, through ``UPLOADER_MODULE``, its uploader process."""
from reference_trainer import remote

_upload = remote.Uploader._upload


def _one_attempt_fewer(self, name, path, manifest, retries, backoff, started):
    return _upload(self, name, path, manifest, retries - 1, backoff, started)


remote.Uploader._upload = _one_attempt_fewer
remote.UPLOADER_MODULE = "tests.planted.gives_up_an_upload_early"

if __name__ == "__main__":
    from tests.planted import run_trainer_or_uploader

    run_trainer_or_uploader()
