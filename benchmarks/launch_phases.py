"""Where a launch's time goes, torchrun against the forking agent, as ratios to ``import torch``.

Each round runs, for each launcher, the same two launches of the reference trainer (2 ranks):
a fresh launch, killed (SIGKILL, every process) once its step-4 checkpoint is committed, and the
relaunch that resumes from it and trains to the end. ``benchmarks/timed_trainer.py`` stamps the
borders of each rank's phases; the table gives rank 0's, medians over the rounds:

* ``launcher``: from the launch call to the rank's process existing (torchrun: its interpreter, its
  import of torch, its rendezvous, the worker's exec; agent: handing a spare the launch, the fork);
* ``imports``: from the process's creation to torch and the trainer imported;
* ``process group``: ``init_distributed`` (store, gloo);
* ``model``: ``build_state`` (model, FSDP2 sharding, optimizer, data loader);
* ``resume``: choosing (and on the relaunch, loading) a checkpoint;
* ``first step``: from there to the end of the first optimizer step;
* ``to first step``: launch call to the end of the first (new) step, the sum of the above;
* ``teardown``: from the last rank returning from training to the launcher's exit (relaunch).

Launchers run round-robin so that drift of the machine hits all alike: ``torchrun``; ``agent``
(a spare started and warm before the first launch, as in a suite, and the one started during it
for the relaunch); ``agent-cold`` (no spare ready: the agent is started at the launch call).
The floor, ``python -c "import torch"``, is measured in every round.

    python benchmarks/launch_phases.py --rounds 5   # writes benchmarks/results/launch_phases.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ckpt_chaos.check.history import trainer_events
from ckpt_chaos.env import launcher
from ckpt_chaos.run.runner import trainer_args

ROOT = Path(__file__).resolve().parent.parent
os.chdir(ROOT)  # the ranks find benchmarks.timed_trainer from the current directory

TRAINER = {"max_steps": 8, "warmup_steps": 1, "ckpt_every_steps": 2, "dataset_size": 96, "global_batch": 16,
           "grad_accum": 2, "collective_timeout_s": 60}
MODULE = "benchmarks.timed_trainer"
LAUNCHERS = ("torchrun", "agent", "agent-cold")
PHASES = ("launcher", "imports", "process group", "model", "resume", "first step", "to first step")


def import_torch_s() -> float:
    t = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.monotonic() - t


def _marks(run_dir: Path, rank: int = 0) -> dict:
    newest = max(run_dir.glob(f"timing-rank{rank}-*.json"), key=lambda p: p.stat().st_mtime)
    marks = json.loads(newest.read_text())
    newest.unlink()
    return marks


def phases(t0: float, m: dict) -> dict:
    return {"launcher": m["created"] - t0, "imports": m["imported"] - m["created"],
            "process group": m["pg.end"] - m["pg.begin"], "model": m["model.end"] - m["model.begin"],
            "resume": m["resume.end"] - m["resume.begin"], "first step": m["step.end"] - m["resume.end"],
            "to first step": m["step.end"] - t0}


def _launch(run_dir: Path, mode: str):
    if mode == "agent-cold":
        launcher.close_spares()
    t0 = time.time()
    job = launcher.launch(run_dir, 2, trainer_args({**TRAINER, "run_dir": str(run_dir)}), module=MODULE,
                          launcher="torchrun" if mode == "torchrun" else "agent")
    return t0, job


def one_round(work: Path, mode: str) -> dict:
    run_dir = work / f"{mode}-{time.time_ns()}"
    if mode == "agent":
        launcher.prewarm(MODULE, wait=True)
    t0, job = _launch(run_dir, mode)
    try:
        deadline = time.monotonic() + 300
        while not any(e.get("name") == "step_00000004" for e in trainer_events(run_dir, "committed")):
            if job.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{mode}: the first launch ended before its step-4 checkpoint; "
                                 f"see {run_dir / 'torchrun.log'}")
            time.sleep(0.01)
    finally:
        t_kill = time.monotonic()
        job.kill()
        kill_s = time.monotonic() - t_kill
    first = phases(t0, _marks(run_dir))
    t1, job = _launch(run_dir, mode)
    try:
        rc = job.wait(300)
        t_exit = time.time()
    finally:
        job.kill()
    if rc != 0:
        raise SystemExit(f"{mode}: the relaunch failed (exit {rc}); see {run_dir / 'torchrun.log'}")
    marks = [_marks(run_dir, r) for r in (0, 1)]
    again = phases(t1, marks[0])
    again["teardown"] = t_exit - max(m["train.end"] for m in marks)
    return {"first": first, "relaunch": again, "kill_s": kill_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "launch_phases.json"))
    args = ap.parse_args()
    floor: list[float] = []
    runs: dict[str, list[dict]] = {m: [] for m in LAUNCHERS}
    with tempfile.TemporaryDirectory(prefix="ckpt-chaos-launch-") as tmp:
        for r in range(args.rounds):
            floor.append(import_torch_s())
            for mode in LAUNCHERS:
                runs[mode].append(one_round(Path(tmp), mode))
                x = runs[mode][-1]
                print(f"round {r + 1}/{args.rounds} {mode:<10} import torch {floor[-1]:.2f} s, first step "
                      f"{x['first']['to first step']:.2f} s, relaunch to first new step "
                      f"{x['relaunch']['to first step']:.2f} s", flush=True)
    launcher.close_spares()
    torch_s = statistics.median(floor)
    out = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "rounds": args.rounds,
           "import_torch_s": torch_s, "launchers": {}}
    for mode, rs in runs.items():
        entry = {}
        for launch in ("first", "relaunch"):
            med = {k: statistics.median(x[launch][k] for x in rs) for k in rs[0][launch]}
            entry[launch] = {k: {"s": v, "x_import_torch": v / torch_s} for k, v in med.items()}
        entry["kill_s"] = statistics.median(x["kill_s"] for x in rs)
        out["launchers"][mode] = entry
    base = out["launchers"]["torchrun"]
    out["agent_over_torchrun"] = {
        mode: {launch: out["launchers"][mode][launch]["to first step"]["s"] / base[launch]["to first step"]["s"]
               for launch in ("first", "relaunch")} for mode in LAUNCHERS if mode != "torchrun"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["agent_over_torchrun"], indent=1))


if __name__ == "__main__":
    main()
