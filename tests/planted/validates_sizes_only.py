"""Planted bug: the resume validates a checkpoint by its files' presence and sizes only, never by
their checksums (a "fast" start-up), so a shard with flipped bits is loaded as if intact."""
from ckpt_chaos.probe import layout
from reference_trainer import checkpoint as ck

ck.choose_resume = lambda root, verify_checksums=True, read_later=None: layout.choose_resume(root, False)
ck.CheckpointManager.reader = lambda self, choice: ck.VerifyingReader(choice.path, None, self.rank, self.world_size)

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
