"""Planted bug: the shard's planned size is counted twice, so the probe reports each tenth of the
write late: a kill aimed half-way through the file lands once it is all written."""
from reference_trainer import checkpoint as ck

_init = ck._HashingFileSystem.__init__


def _planned_twice(self, planned, *args, **kwargs):
    _init(self, planned * 2, *args, **kwargs)


ck._HashingFileSystem.__init__ = _planned_twice

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
