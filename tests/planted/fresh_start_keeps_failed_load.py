"""Planted bug: after a load that failed verification part-way, with nothing else to load, the trainer
starts afresh on the state it already has, which holds the tensors the failed load copied in,
instead of building the model and optimizer anew.
"""
from reference_trainer import train

_build_state = train.build_state
_built = []


def _build_state_once(*args, **kwargs):
    if not _built:
        _built.append(_build_state(*args, **kwargs))
    return _built[0]


train.build_state = _build_state_once

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
