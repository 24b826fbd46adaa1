"""Planted bug: RNG streams are not carried across a resume (left out of what is restored).

Each rank reseeds from the config seed instead, as many trainers do; dropout masks after the
resume differ from the uninterrupted run's.
"""
from reference_trainer import state

state.restore_rank_rng = lambda ts, rng: state.seed_rank_rng(ts.cfg.seed, ts.rank)

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
