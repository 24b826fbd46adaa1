"""Deterministic synthetic tokens, served through torchdata's StatefulDataLoader.

The job consumes one global stream of samples: position k of the stream is sample
``perm(epoch)[k % dataset_size]`` with ``epoch = k // dataset_size``. An optimizer step takes
``global_batch`` consecutive positions; micro-batch ``a`` of that step is split into contiguous
slices, one per rank. So the samples seen by the whole job, and their order, do not depend on
the world size.

The sampler's state is one number, ``consumed``: positions of the global stream that the whole
job has taken. It is the same on every rank, which gives the rule for a world-size change: every
new rank restores the saved loader state (they are all equal) and re-slices the stream from the
same global position with its new rank and world size. No sample is skipped or seen twice.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from .config import TrainConfig


class SyntheticTokens(Dataset):
    """Sample i is a fixed, learnable token sequence: an affine recurrence with seeded noise."""

    def __init__(self, cfg: TrainConfig):
        self.size, self.seq_len, self.vocab, self.seed = cfg.dataset_size, cfg.seq_len, cfg.vocab_size, cfg.seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        start = torch.randint(self.vocab, (1,), generator=g)
        noise = torch.randint(self.vocab, (self.seq_len,), generator=g)
        keep = torch.rand(self.seq_len, generator=g) > 0.1
        # The recurrence runs on Python ints: per-element tensor indexing cost a rank more time
        # than its forward and backward passes.
        noise_l, keep_l = noise.tolist(), keep.tolist()
        seq = [int(start)]
        for t in range(1, self.seq_len):
            seq.append((seq[-1] * 5 + 3) % self.vocab if keep_l[t] else noise_l[t])
        return {"id": torch.tensor(i), "tokens": torch.tensor(seq, dtype=torch.long)}


class GlobalBatchSampler:
    """Yields this rank's micro-batches (lists of sample ids) from the job's global stream."""

    def __init__(self, cfg: TrainConfig, rank: int, world_size: int):
        self.size, self.seed = cfg.dataset_size, cfg.seed
        self.per_micro = cfg.global_batch // cfg.grad_accum  # whole job, one micro-step
        self.local = self.per_micro // world_size
        self.offset = rank * self.local
        self.consumed = 0  # stream positions taken by the whole job
        self._perms: dict[int, torch.Tensor] = {}

    def _sample(self, k: int) -> int:
        epoch = k // self.size
        if epoch not in self._perms:
            g = torch.Generator().manual_seed(self.seed + 7919 * epoch)
            self._perms = {epoch: torch.randperm(self.size, generator=g)}
        return int(self._perms[epoch][k % self.size])

    def epoch(self) -> int:
        return self.consumed // self.size

    def __iter__(self):
        while True:
            start = self.consumed + self.offset
            ids = [self._sample(k) for k in range(start, start + self.local)]
            self.consumed += self.per_micro
            yield ids

    # torchdata's Stateful protocol: the loader saves and restores these with its own state.
    def state_dict(self) -> dict:
        return {"consumed": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        self.consumed = int(state["consumed"])


def build_loader(cfg: TrainConfig, rank: int, world_size: int) -> tuple[StatefulDataLoader, GlobalBatchSampler]:
    sampler = GlobalBatchSampler(cfg, rank, world_size)
    # num_workers=0: the sampler position is exactly what the training loop consumed.
    # A private generator: creating an iterator draws a base seed from the loader's generator,
    # and drawing it from the global one would shift the dropout stream on every resume.
    loader = StatefulDataLoader(SyntheticTokens(cfg), batch_sampler=sampler, num_workers=0,
                                generator=torch.Generator().manual_seed(cfg.seed))
    return loader, sampler
