"""Planted bug: any error while loading a checkpoint is taken for a corrupt file: an I/O error (a
flaky disk, a node's storage hiccup) rejects a checkpoint that is intact, and the resume falls back
to an older one instead of failing the launch so that a relaunch reads it again."""
from reference_trainer import checkpoint as ck
from reference_trainer import train

train.corrupt_file = lambda error: ck.corrupt_file(error) or f"unreadable on load: {type(error).__name__}"

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
