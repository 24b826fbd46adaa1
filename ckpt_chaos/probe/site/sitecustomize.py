"""Loaded by every Python process of a job under test (the harness puts this folder on PYTHONPATH):
arms the automatic probe layer where a controller listens, then runs the ``sitecustomize`` this one
shadows, if any, as Python would have."""

import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    me = sys.modules.pop("sitecustomize", None)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import sitecustomize  # noqa: F401  (the next one on the path)
    except ImportError:
        if me is not None:
            sys.modules["sitecustomize"] = me
    finally:
        sys.path[:] = saved


if os.environ.get("CKPT_CHAOS_CONTROLLER"):
    try:
        from ckpt_chaos.probe import auto

        auto.install()
    except Exception as e:  # the job runs unprobed, and says why: its faults will not fire
        print(f"ckpt-chaos: the automatic probe layer did not load: {e!r}", file=sys.stderr, flush=True)
_chain()
del _chain
