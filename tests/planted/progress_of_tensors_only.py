"""Planted bug: the shard progress the trainer reports to the probe counts the tensors' bytes alone,
forgetting what torch.save wraps them in, so "half of the shard written" is reported when about
two fifths of the file is on disk, and a fault aimed at the middle of a write lands early."""
from reference_trainer import checkpoint as ck

ck._record_overhead = lambda dtype: 0

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
