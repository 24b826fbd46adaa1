"""Planted bug: a checkpoint committed when its async save is collected is never handed to the
uploader (the hand-off was written into the synchronous save path only). With async saves nothing
reaches the remote tier, and a node that loses its disk has nothing to restore."""
from reference_trainer import checkpoint as ck

_finish_async = ck.CheckpointManager._finish_async


def _finish_async_without_upload(self):
    uploads, self.uploads = self.uploads, None
    try:
        return _finish_async(self)
    finally:
        self.uploads = uploads


ck.CheckpointManager._finish_async = _finish_async_without_upload

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
