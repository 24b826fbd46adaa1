"""Planted bug: the uploader stages a checkpoint by hard links only, as if every file system had
them, so on one without (some network and FUSE file systems) every upload is abandoned: the job
trains on with nothing durable, and a lost disk takes everything. This module is both the trainer
and, through ``UPLOADER_MODULE``, its uploader process."""
import os
import shutil

from reference_trainer import checkpoint as ck
from reference_trainer import remote


def _stage_by_links_only(self, name: str):
    src, staged = self.root / name, self.root / (remote.UPLOAD_PREFIX + name)
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    manifest = ck.read_manifest(src)
    for file in list(manifest["files"]) + [ck.MANIFEST]:
        os.link(src / file, staged / file)
    return staged, manifest


remote.Uploader.stage = _stage_by_links_only
remote.UPLOADER_MODULE = "tests.planted.staging_needs_hard_links"

if __name__ == "__main__":
    from tests.planted import run_trainer_or_uploader

    run_trainer_or_uploader()
