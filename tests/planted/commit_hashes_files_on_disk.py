"""Planted bug: the commit sizes and hashes the files as they are on disk instead of taking what the
ranks wrote, so bytes another writer added between the write and the commit become part of a
checkpoint that validates."""
from reference_trainer import checkpoint

_commit = checkpoint.CheckpointManager._commit


def _commit_from_disk(self, name, written, progress, loss, digests):
    return _commit(self, name, None, progress, loss, digests)


checkpoint.CheckpointManager._commit = _commit_from_disk

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
