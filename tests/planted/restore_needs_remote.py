"""Planted bug: the restore lets an unreachable remote tier stop the start, although the node's
local disk holds a checkpoint to resume from (the store is listed outside the guard)."""
from reference_trainer import remote

_restore_newer = remote.restore_newer


def _listing_first(cfg, root, local_newest, log):
    remote.store_from_config(cfg).durable()
    return _restore_newer(cfg, root, local_newest, log)


remote.restore_newer = _listing_first

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
