"""Planted bug: the data-loader position is not restored; the loader starts its stream again."""
from reference_trainer import state

state.restore_loader = lambda ts, loader_state: None

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
