"""Trainers broken on purpose, each a module run as ``python -m tests.planted.NAME``."""
import os
import sys

# the planted trainers are the reference trainer with one function replaced: they declare its profile
from reference_trainer import CKPT_CHAOS_PROFILE  # noqa: F401


def run_trainer_or_uploader() -> None:
    """The ``__main__`` of a planted module that is also its uploader (``remote.UPLOADER_MODULE``
    pointed at it): the uploader process runs the remote tier's main, the ranks the trainer."""
    from reference_trainer import remote

    if os.environ.get(remote.ENV_ROLE) == "uploader":
        sys.exit(remote.main())
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
