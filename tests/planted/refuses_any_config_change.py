"""Planted bug: the resume refuses any difference between the checkpoint's configuration and the
run's (only the paths may differ), so an operator cannot change the checkpoint cadence, retention
or save mode of a job without starting it from scratch."""
from reference_trainer import train

_PATHS = {"run_dir", "ckpt_dir"}
train.resume_mismatches = lambda saved, current: [
    f"{k}: checkpoint has {saved.get(k)!r}, this run has {v!r}"
    for k, v in current.to_dict().items() if k not in _PATHS and saved.get(k) != v]

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
