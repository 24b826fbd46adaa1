"""Planted bug: the remote tier's retention deletes a checkpoint's manifest but not its data objects.
The checkpoint stops being durable, as it should, and its shards stay in the bucket for good. This
module is both the trainer and, through ``UPLOADER_MODULE``, its uploader process."""

from reference_trainer import checkpoint as ck
from reference_trainer import remote


def _delete_manifest_only(self, name, files):
    if ck.MANIFEST in files:
        self.s3.delete_object(Bucket=self.bucket, Key=self.key(name, ck.MANIFEST))


remote.RemoteStore.delete = _delete_manifest_only
remote.UPLOADER_MODULE = "tests.planted.remote_delete_keeps_data"

if __name__ == "__main__":
    from tests.planted import run_trainer_or_uploader

    run_trainer_or_uploader()
