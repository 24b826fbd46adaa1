"""Planted bug: the load hashes what it reads only for checkpoints of the format this trainer
writes; an older checkpoint's shards are read unchecked, so after an upgrade a flipped bit in one
is loaded as if intact."""
from reference_trainer import checkpoint as ck

_reader = ck.CheckpointManager.reader


def _reader_of_own_format(self, choice):
    if choice.manifest.get("format") != ck.FORMAT:
        return ck.VerifyingReader(choice.path, None, self.rank, self.world_size)
    return _reader(self, choice)


ck.CheckpointManager.reader = _reader_of_own_format

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
