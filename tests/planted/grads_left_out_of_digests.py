"""Planted bug: the trainer's state digests leave the gradients out, so a mid-step checkpoint's
accumulated gradients are never compared between what was saved and what was loaded."""
from reference_trainer import checkpoint, state, train

_digests = state.component_digests


def _without_grads(ts):
    out = _digests(ts)
    if out is not None:
        out.pop("grads", None)
    return out


checkpoint.component_digests = train.component_digests = _without_grads

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
