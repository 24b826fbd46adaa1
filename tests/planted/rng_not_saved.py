"""Planted bug (a): the RNG streams are left out of the checkpoint (torchtitan has a TODO for it).

On resume each rank reseeds from (seed, step, rank), as a trainer without saved RNG state does;
the dropout masks after the resume differ from the uninterrupted run's.
"""
from reference_trainer import state

state.rank_state = lambda ts: {"rng": None, "loader": ts.loader.state_dict()}

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
