"""Planted bug: the uploader marks a checkpoint durable (puts manifest.json) before its objects.

A link cut or an uploader killed mid-upload then leaves a remote checkpoint that claims to be
durable while objects are missing: a node that lost its disk would restore a torn checkpoint.
This module is both the trainer (``-m`` under torchrun) and, through ``UPLOADER_MODULE``, its
uploader process.
"""

from reference_trainer import remote

_put_all = remote.Uploader._put_all


def _manifest_first(self, name, path, manifest):
    self.store.mark_durable(name, path / remote.ck.MANIFEST)
    return _put_all(self, name, path, manifest)


remote.Uploader._put_all = _manifest_first
remote.UPLOADER_MODULE = "tests.planted.uploader_marks_durable_early"

if __name__ == "__main__":
    from tests.planted import run_trainer_or_uploader

    run_trainer_or_uploader()
