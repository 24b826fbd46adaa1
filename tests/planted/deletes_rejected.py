"""Planted bug: a checkpoint rejected on load is deleted instead of being moved aside with its
reason. The resume goes on from an older one, so every check of the resume passes; but a rejection
caused by a transient read error destroys a good checkpoint for good, and a corrupt one leaves
nothing to look at.
"""
from reference_trainer import checkpoint as ck


def _delete_instead(self, path, reason):
    ck.remove_tree(path)


ck.CheckpointManager._quarantine = _delete_instead

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
