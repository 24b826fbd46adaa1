"""Planted bug (Slurm): SIGTERM is not handled, so a preemption's grace period is wasted.

The trainer installs no handler: the notice kills it where it stands, nothing is saved, and the
requeued job resumes from the last cadence checkpoint, losing the work since.
"""
import signal

from reference_trainer import train

train._on_sigterm = signal.SIG_DFL

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
