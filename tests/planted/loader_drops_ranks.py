"""Planted bug: each rank keeps its own data-loader position (the samples *it* consumed), and on a
world-size change the job rebuilds the global position from the ranks that remain. What the
dropped ranks had consumed is discarded: after a shrink samples are seen twice, after a grow
samples are skipped. At an unchanged world size it round-trips exactly, so only topology
scenarios catch it."""
from reference_trainer.data import GlobalBatchSampler


def _state_dict(self) -> dict:
    return {"consumed_by_this_rank": self.consumed * self.local // self.per_micro}


def _load_state_dict(self, state: dict) -> None:
    self.consumed = int(state["consumed_by_this_rank"]) * self.per_micro // self.local


GlobalBatchSampler.state_dict = _state_dict
GlobalBatchSampler.load_state_dict = _load_state_dict

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
