"""Planted bug (storage): the loader takes the newest checkpoint directory without validating it.

It resumes from whatever ``step_*`` sorts last, so a truncated, bit-flipped or half-deleted
checkpoint is loaded (DCP itself checks no checksums, and neither does this load) instead of falling
back to an older one.
"""
from reference_trainer import checkpoint as ck


def _newest_unvalidated(root, verify_checksums=True, read_later=None):
    found = ck.list_checkpoints(root)
    if not found:
        return ck.ResumeChoice(None, None, [], None)
    return ck.ResumeChoice(found[0], ck.read_manifest(found[0]), [], None)


ck.choose_resume = _newest_unvalidated
ck.CheckpointManager.reader = lambda self, choice: ck.VerifyingReader(choice.path, None, self.rank, self.world_size)

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
