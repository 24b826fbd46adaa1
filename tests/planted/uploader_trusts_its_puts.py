"""Planted bug: the uploader marks a checkpoint durable once every put succeeded, without checking
the objects against the manifest. Content-MD5 only proves that the server got the bytes the
uploader read: a shard damaged on the local disk before the upload goes up as it is, and the
remote tier then holds a durable checkpoint that disagrees with its own manifest. This module is
both the trainer and, through ``UPLOADER_MODULE``, its uploader process."""

from reference_trainer import remote

remote.RemoteStore.verify = lambda self, name, manifest: None
remote.UPLOADER_MODULE = "tests.planted.uploader_trusts_its_puts"

if __name__ == "__main__":
    from tests.planted import run_trainer_or_uploader

    run_trainer_or_uploader()
