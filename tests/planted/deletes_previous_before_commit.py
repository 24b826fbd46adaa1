"""Planted bug (d): "make room first": rank 0 deletes the previous checkpoints before the new
save is written and committed. A crash during that save leaves no valid checkpoint at all.
"""
from reference_trainer import checkpoint as ck

_save = ck.CheckpointManager.save


def _save_after_making_room(self, ts, reason, *args, **kwargs):
    if self.rank == 0:
        for old in ck.list_checkpoints(self.root):
            ck.remove_tree(old)
    return _save(self, ts, reason, *args, **kwargs)


ck.CheckpointManager.save = _save_after_making_room

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
