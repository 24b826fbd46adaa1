"""Planted bug (storage): a save that hits ENOSPC (or any I/O error) logs nothing and commits.

The error from ``dcp.save`` is swallowed, so the manifest is written over whatever partial files
are there, the directory is renamed into place and `latest` moves to it: a torn checkpoint that
the trainer itself reports as committed.
"""
import torch.distributed.checkpoint as dcp

_save = dcp.save


def _save_ignoring_errors(*args, **kwargs):
    try:
        return _save(*args, **kwargs)
    except BaseException:  # noqa: BLE001 - the bug: DCP's CheckpointException is swallowed
        return None


dcp.save = _save_ignoring_errors

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
