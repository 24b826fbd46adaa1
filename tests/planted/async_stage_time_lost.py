"""Planted bug: a resumed job's asynchronous saves leave the copy out of their breakdown (their
staging timer's callback raises on the staging thread, where nothing reports it), so a run's save
overhead looks smaller after every restart. A fresh start's saves, the golden run's, report it."""
import os

from reference_trainer import checkpoint

_finish_async = checkpoint.CheckpointManager._finish_async


def _finish_without_stage_time(self) -> None:
    if os.environ.get("CKPT_CHAOS_ATTEMPT", "0") != "0":
        self.pending.phases.pop("stage_s", None)
    _finish_async(self)


checkpoint.CheckpointManager._finish_async = _finish_without_stage_time

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
