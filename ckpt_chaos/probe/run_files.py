"""The run folder contract: the names of the files a run leaves in its folder, who writes each and
who reads it.

A run folder (``reports/.../<scenario>/``, and the golden run's beside it, ``golden/``) holds what
the trainer wrote, what the harness saw, and what the judge read it by. Each name is declared once
here, so that a writer and its readers cannot drift apart; ``layout.py`` beside this is the
contract of the checkpoint folder inside it. Plain names, no imports: the trainer side (the probe
layer, a trainer that writes its own logs) reads them as cheaply as the harness.
"""

from __future__ import annotations

TRAJECTORY = "trajectory.jsonl"
"""One JSON object per optimizer step (loss, digests of the parameters and the optimizer), from
rank 0. Written by the trainer (``reference_trainer/train.py``; for a ``[command]`` trainer, the
probe layer's recorder, ``probe/auto_recorder.py``); read by the trajectory checks
(``check/trajectory.py``, ``check/history.py``, ``check/evidence.py``), the golden-run comparison
(``run/command.py``) and the plots (``report/plots.py``)."""

EVENTS = "events.jsonl"
"""The trainer's own events, one JSON object per line (committed, save_failed, ckpt_rejected,
stopped, exit...). Written by the trainer and its uploader (``reference_trainer/``; the probe
layer's recorder writes a ``[command]`` trainer's exit); read by ``check/history.py`` and
``check/trajectory.py``."""

FINAL_STATE = "final_state.json"
"""Digests of the model and optimizer state at the trainer's last step. Written by the reference
trainer at its end; read by ``check/history.py``."""

HISTORY = "history.jsonl"
"""The harness's history of the run: launches, probe events, faults fired, heals and exits, one
record per line (``check/history.py``'s records). Written by the runner (``run/runner.py``,
through ``check.history.History``); read by ``check/history.py`` and ``report/plots.py``."""

FILES = "files.jsonl"
"""A ``[command]`` run's file events, from the fanotify recorder, one JSON object per line.
Written by ``env/fileevents.py``; read by ``check/evidence.py`` and ``report/plots.py``."""

PROBE_LOG = "probe.jsonl"
"""The golden run's probe events, one per line. Written by ``run/command.py`` for a ``[command]``
trainer's golden run; read by it (the fault plan) and by ``check/evidence.py``."""

PLANNED = "planned.json"
"""The probe points a ``[command]`` trainer's golden run reached, as faults can be planned on
(``probe/follow.py``'s plan). Written and copied into each run folder by ``run/command.py``."""

TORCHRUN_LOG = "torchrun.log"
"""The job's standard output and error (torchrun's and every rank's). Written by the launcher
(``env/launcher.py``); read by ``run/runner.py`` and ``run/command.py`` (a golden run's failure,
a native crash) and by ``check/history.py``."""

GOLDEN = "golden.json"
"""What the golden run ran (trainer module and configuration, or command) and at what world size;
for a ``[command]`` trainer, with the digests found unstable across two golden runs. Written by ``run/runner.py`` and
``run/command.py`` in the golden folder; read by ``check/trajectory.py`` and ``run/command.py``
(whether a cached golden run is there)."""

SCENARIO = "scenario.toml"
"""The scenario as it ran, in TOML. Written by ``run/runner.py``; read by the subcommands that judge
a stored run again (``subcommands/stored.py``) and by ``report/plots.py``."""

RESULT = "result.json"
"""The run's verdict, checks and timings. Written by ``run/runner.py`` and, with the tool's stamp,
by ``report/results.py``."""

LISTING = "files.json"
"""The golden run's checkpoint folder as it ended (path -> size), in the golden folder. Written by
``run/command.py`` for a ``[command]`` trainer; read by it (the plan of ``file.write`` fractions)
and by ``check/evidence.py``."""
