"""Planted bug: only the model is restored; AdamW's moments and step counts start from zero."""
from torch.distributed.checkpoint.state_dict import set_model_state_dict

from reference_trainer import state

state.restore_model_and_optimizer = lambda ts, model_sd, optim_sd: set_model_state_dict(ts.model, model_sd)

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
