"""Planted bug: the restore from the remote tier tries only the newest durable checkpoint; when its
download fails the job starts from scratch although older durable checkpoints are there."""
from reference_trainer import remote

_durable = remote.RemoteStore.durable
remote.RemoteStore.durable = lambda self: _durable(self)[:1]

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
