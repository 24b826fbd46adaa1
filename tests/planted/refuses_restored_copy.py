"""Planted bug: the resume tells checkpoints apart by name only. A local copy found corrupt while
loading is kept aside, the remote tier's durable copy of the same name is downloaded in its place,
and the resume refuses it as the checkpoint that just failed, so the relaunch exits with an error
although an intact copy was at hand."""
import dataclasses

from reference_trainer import checkpoint as ck

_choose = ck.CheckpointManager.choose


def _by_name_only(self):
    return dataclasses.replace(_choose(self), restored=False)


ck.CheckpointManager.choose = _by_name_only

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
