"""Planted bug: after a resume at another world size, rank r restores the random streams (and data
position) saved by rank r % the saved world size, as a trainer does that maps its per-rank state onto
the new ranks by wrapping around: on a grow a new rank goes on with a copy of an old rank's stream
(the same dropout masks as its twin), on a shrink every rank keeps a saved stream where the reference
declares a fresh one. The loss moves by no more than dropout noise, inside the resize tolerance."""
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from reference_trainer import state, train


def _load_checkpoint(ts, path, saved_world_size, has_grads, reader=None):
    rank_key = f"rank{ts.rank % saved_world_size}"  # the reference: its own rank's, else rank0 reseeded
    model_sd, optim_sd = get_state_dict(ts.model, ts.optimizer)
    loaded = {"model": model_sd, "optim": optim_sd, "meta": b"", rank_key: b""}
    if has_grads:
        loaded["grads"] = {name: torch.zeros_like(p) for name, p in ts.model.named_parameters()}
    dcp.load(loaded, checkpoint_id=str(path), storage_reader=reader)
    state.restore_model_and_optimizer(ts, loaded["model"], loaded["optim"])
    state.restore_meta(ts, state._unblob(loaded["meta"]))
    per_rank = state._unblob(loaded[rank_key])
    state.restore_loader(ts, per_rank["loader"])
    state.restore_rank_rng(ts, per_rank["rng"])
    if has_grads:
        for name, p in ts.model.named_parameters():
            p.grad = loaded["grads"][name]


train.load_checkpoint = _load_checkpoint

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
