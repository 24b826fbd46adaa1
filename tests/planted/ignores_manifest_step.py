"""Planted bug: the resume validates a checkpoint's files but never compares the step its manifest
records with the directory's name, so a checkpoint whose manifest belongs to another step (a copy,
a rename by hand, a tool rewriting it) is resumed as if it were what its name says."""
from ckpt_chaos.probe import layout
from reference_trainer import checkpoint as ck

_validate = layout.validate


def _validate_ignoring_step(path, verify_checksums=True, name=None, read_later=None):
    reason = _validate(path, verify_checksums, name, read_later)
    return None if reason and reason.startswith("manifest says step") else reason


layout.validate = _validate_ignoring_step  # choose_resume looks it up in its module
ck.validate = _validate_ignoring_step

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
