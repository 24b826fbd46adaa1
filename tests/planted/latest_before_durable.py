"""Planted bug (c): the `latest` pointer moves to the new checkpoint before it is durable.

A crash between the pointer update and the rename leaves `latest` naming a checkpoint that
does not exist (or is torn); a loader that trusts `latest` would fail or load garbage.
"""
from reference_trainer import checkpoint as ck

_commit = ck.CheckpointManager._commit


def _commit_latest_first(self, name, *args, **kwargs):
    ck.write_durably(self.root / ck.LATEST, name.encode())
    return _commit(self, name, *args, **kwargs)


ck.CheckpointManager._commit = _commit_latest_first

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
