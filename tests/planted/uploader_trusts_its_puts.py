"""Planted bug: the uploader marks a checkpoint durable once every put succeeded, without checking
the objects against the manifest. Content-MD5 only proves that the server got the bytes the
uploader read: a shard damaged on the local disk before the upload goes up as it is, and the
remote tier then holds a durable checkpoint that disagrees with its own manifest. This module is
both the trainer and, through ``UPLOADER_MODULE``, its uploader process."""
import os
import sys

from reference_trainer import remote

remote.RemoteStore.verify = lambda self, name, manifest: None
remote.UPLOADER_MODULE = "tests.planted.uploader_trusts_its_puts"

if __name__ == "__main__":
    if os.environ.get(remote.ENV_ROLE) == "uploader":
        sys.exit(remote.main())
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
