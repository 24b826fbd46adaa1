"""The automatic probe layer: the probe's points, and a trajectory, from a trainer that never calls
the probe (a Lightning, Accelerate or plain PyTorch script, unmodified).

The harness puts ``ckpt_chaos/probe/site`` on the job's ``PYTHONPATH``; its ``sitecustomize`` calls
``install()`` in every process that has a controller address in its environment, before the
trainer's first line. ``install()`` never imports torch: it patches the standard library's file
operations at once and patches torch's modules when the trainer imports them (an import hook), so
a launcher process (torchrun, ``accelerate launch``) pays nothing it would not pay anyway.

What it reports, as probe points (``ckpt_chaos.probe.point``, so triggers and faults work as they do
for the reference trainer):

* ``step.begin`` / ``step.end`` from the optimizer's global step hooks, numbered by the optimizer's
  own ``state[p]["step"]`` (so a resumed run counts on from where its checkpoint was), else counted;
  a step that only creates the optimizer's state (DCP's ``get_state_dict`` before a load: zero
  learning rate, no backward) is no step, and its increment of the count is taken off until a load
  replaces the state; the checks hold the numbering to the trainer's own (``check/evidence.py``);
  ``microstep.end`` after each backward;
* ``ckpt.stage`` when a save starts (``torch.distributed.checkpoint.save``, ``torch.save`` into a
  watched directory), ``load.begin`` / ``load.end`` around ``dcp.load`` and ``torch.load`` of a
  watched path (a load that raised ends with ``failed``: a trainer that falls back on an error);
* DCP's shard files (``*.distcp``) as ``ckpt.shard.write`` (with ``bytes`` and, where the size is
  known, ``fraction``) and ``ckpt.shard.done``; its ``.metadata`` rename as ``ckpt.metadata``;
* any other file written in a watched directory through Python (``open``; ``torch.save``, which
  is made to write through a Python stream; ``os.open``, ``os.write`` and ``os.close``, as
  DeepSpeed's writer does, ``via = "os.write"``) as ``file.write`` / ``file.done`` (bytes that
  native code wrote through such a file's descriptor, as numpy's ``tofile`` does, counted from the
  file's size: ``native``; a file closed short of the golden run's: ``short``); and
  ``file.fsync``, ``file.rename``, ``file.remove``, ``file.rmtree``, ``file.copy`` (a copy is made
  in chunks, so ``file.write`` fires inside it too).

A write is cut at every tenth of the file's planned size (the size of the same file in the golden
run, ``CKPT_CHAOS_PLANNED``), flushed, and reported there: a fault at ``min_fraction = 0.5`` finds
exactly half of the file's bytes on disk. Without a planned size, a write is reported every MiB.
The same file in the golden run is found through its renames (``probe/follow.py``): a temporary
file is planned at the size of the file it becomes, and its points carry that file's names
(``aliases``), so a trigger on the final name fires on the temporary file's writes.

Each process says which patches took (``probe.armed``, sent before its first point and again when
an import arms more), so the harness can tell a point that cannot fire from one that did not; and
which release of each framework it patched (``versions``), with a line for each outside the range
the layer supports (``unsupported``; ``probe/versions.py``), which the run's result carries.

The recorder writes one line per optimizer step of rank 0 to ``RUN_DIR/trajectory.jsonl``: the step,
the loss of each backward of the step (float bits, ``float.hex``), the learning rate, the ids of
the samples each backward trained on (the batch a data loader delivered last before it), and every
``CKPT_CHAOS_DIGEST_EVERY`` steps digests of the optimizer's parameters and state; at exit, ``RUN_DIR/events.jsonl`` gets the
last step's digests. ``ckpt_chaos.record(...)`` adds what the layer cannot see.

The layer is in modules by concern: ``auto_state`` (the settings, the one state ``_s`` and the
replaced functions ``_orig`` every part shares, reporting), ``auto_files`` (the standard library's
file operations), ``auto_torch`` (torch, DCP and the frameworks, with the import hook) and
``auto_recorder`` (the trajectory); this module installs them and holds the harness's side.
"""

from __future__ import annotations

import json
import os
import sys

from ckpt_chaos import probe
from ckpt_chaos.probe import follow
from ckpt_chaos.probe.auto_files import _patch_files
from ckpt_chaos.probe.auto_recorder import _at_exit
from ckpt_chaos.probe.auto_state import (ENV_DIGEST_EVERY, ENV_DIRS, ENV_PLANNED, ENV_RUN_DIR, ENV_STEP_POINTS,
                                         STEP_POINTS, _orig, _s)
from ckpt_chaos.probe.auto_torch import _AFTER_IMPORT, _AfterImport, _found


# ---- installation --------------------------------------------------------------------------------------

def install() -> None:
    """Arm the layer in this process (idempotent). Does nothing without a controller address."""
    if _s.installed or not os.environ.get(probe.ENV_CONTROLLER):
        return
    _s.installed = True
    configure()
    _patch_files()
    for name, then in _AFTER_IMPORT.items():
        if name in sys.modules:
            _found(sys.modules[name])
            then(sys.modules[name])
    sys.meta_path.insert(0, _AfterImport())
    import atexit

    atexit.register(_at_exit)


def configure() -> None:
    """Read the launch's settings from the environment: where to report, what to watch, the plan."""
    _s.pid = os.getpid()
    _s.dirs = tuple(os.path.abspath(d) for d in os.environ.get(ENV_DIRS, "").split(os.pathsep) if d)
    _s.run_dir = os.path.abspath(os.environ[ENV_RUN_DIR]) if os.environ.get(ENV_RUN_DIR) else ""
    _s.digest_every = int(os.environ.get(ENV_DIGEST_EVERY, "0") or 0)
    _s.step_points = (frozenset(p for p in os.environ[ENV_STEP_POINTS].split(",") if p)
                      if ENV_STEP_POINTS in os.environ else frozenset(STEP_POINTS))
    _s.attempt = int(os.environ.get(probe.ENV_ATTEMPT, "0")) + int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    planned = os.environ.get(ENV_PLANNED)
    if planned and os.path.isfile(planned):
        with _orig["open"](planned) as f:
            _s.follow = follow.Follower(json.load(f))


# ---- the harness's side ----------------------------------------------------------------------------------

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")


def environment(controller: str, run_dir, watch, planned=None, digest_every: int = 0,
                pythonpath: str | None = None, step_points=None) -> dict[str, str]:
    """The variables that arm the layer in every Python process of a job: ``watch``, the directories
    whose files are reported (the checkpoint directory, the trainer's temporary folders); ``planned``,
    a JSON file of file sizes from the golden run; ``pythonpath``, the job's own, put after ours;
    ``step_points``, the per-step points the controller needs (default: all)."""
    rest = os.environ.get("PYTHONPATH", "") if pythonpath is None else pythonpath
    return {probe.ENV_CONTROLLER: controller, ENV_RUN_DIR: os.fspath(run_dir),
            ENV_DIRS: os.pathsep.join(os.fspath(w) for w in watch),
            **({ENV_PLANNED: os.fspath(planned)} if planned else {}),
            ENV_DIGEST_EVERY: str(digest_every),
            **({ENV_STEP_POINTS: ",".join(sorted(step_points))} if step_points is not None else {}),
            "PYTHONPATH": os.pathsep.join(p for p in (SITE_DIR, rest) if p)}


def planned_sizes(events) -> dict[str, int]:
    """File sizes from a run's ``file.done`` / ``ckpt.shard.done`` / ``faultfs.done`` events, under each
    name a file had (a temporary name, then the one it was renamed to): ``follow.plan``'s ``sizes``."""
    return follow.plan(events)["sizes"]


planned_size = follow.planned_size  # by exact path, else by a glob key that matches it
