"""Planted bug: when the disk is too full for another checkpoint, rank 0 "makes room" by deleting
the checkpoints it has before saving, milestones and the best one included. On a disk that stays
full, each save then replaces the one before, and the best checkpoint is gone for good.
"""
import shutil

from reference_trainer import checkpoint as ck

_save = ck.CheckpointManager.save


def _save_making_room(self, ts, reason, *args, **kwargs):
    if self.rank == 0:
        ckpts = ck.list_checkpoints(self.root)
        needed = sum(f.stat().st_size for f in ckpts[0].iterdir()) if ckpts else 0
        if shutil.disk_usage(self.root).free < needed:
            for old in ckpts:
                ck.remove_tree(old)
    return _save(self, ts, reason, *args, **kwargs)


ck.CheckpointManager.save = _save_making_room

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
