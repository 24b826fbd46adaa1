"""Planted bug (storage): shards are renamed into place without ever being fsynced.

DCP is told not to fsync (``sync_files=False``, a common speed-up) and the commit skips its own
fsync of the files, so `rename` + directory fsync make a checkpoint *name* durable whose *data*
is still only in the page cache. A power cut after the commit leaves step_N with empty files.
"""
from reference_trainer import checkpoint as ck

_fsync_path = ck.fsync_path


def _fsync_all_but_the_checkpoint_files(path):
    if ck.TMP_PREFIX in str(path):  # the files of a save in progress, and their directory
        return
    _fsync_path(path)


class _NoSyncWriter(ck.ProbedWriter):
    def __init__(self, path, *args, **kwargs):
        super().__init__(path, *args, **{**kwargs, "sync_files": False})


ck.fsync_path = _fsync_all_but_the_checkpoint_files
ck.ProbedWriter = _NoSyncWriter
ck.FileSystemWriter = _NoSyncWriter

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
