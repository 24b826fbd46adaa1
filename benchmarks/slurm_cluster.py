"""What a private Slurm cluster costs: start, a job's start, a requeue's restart, stop.

Each round starts a fresh 2-node cluster (``ckpt_chaos.env.slurm.SlurmCluster``) and times:

* ``start_s``: from the constructor to every node idle (config, daemons, registration);
* ``first_submit_to_start_s``: from calling ``sbatch`` right after start to the later of the two
  tasks' first line (a 2-node job, one ``srun`` task per node; each task stamps ``date +%s.%N``):
  what a harness's first launch sees;
* ``requeue_to_restart_s``: from calling ``scontrol requeue`` to the later of the two tasks of
  the restarted run (the old run's tasks killed, the credential wait, scheduling, launch);
* ``submit_to_start_s``: the same as the first, for a second job once the first is cancelled and
  both nodes are idle again (a cluster that has been up a while);
* ``stop_s``: ``close()``, with that job still running (cancel, daemons stopped, state removed).

``--trainer-rounds N`` (default 3) times the reference trainer on a fresh 2-node cluster, one rank
per node, against a local ``torchrun --standalone`` launch of the same job in the same round:

* ``trainer_submit_to_first_step_s``: from ``sbatch`` to the end of the job's first optimizer step
  (its first trajectory record's time); ``local_launch_to_first_step_s``: the same from starting
  ``torchrun --standalone`` here (not the harness's warm agent: torch is imported afresh, as on each
  Slurm node), and their ratio;
* ``trainer_requeue_to_first_new_step_s``: from ``scontrol requeue`` once the step-4 checkpoint is
  committed, to the end of the first step of the requeued run (SIGTERM and the emergency save,
  KillWait, the credential wait, scheduling, torch's import, the resume's load, one step).

``--default-rounds N`` adds N rounds whose requeue runs under Slurm's own cred_expire (120 s) and
sched_interval (60 s), to show what the cluster's settings save. Figures are medians.

    python benchmarks/slurm_cluster.py --rounds 5   # writes benchmarks/results/slurm_cluster.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from ckpt_chaos.env.slurm import SlurmCluster, SlurmConfig, auth_method, missing, version

JOB = """#!/bin/bash
srun bash -c 'f="SEEN/run${SLURM_RESTART_COUNT:-0}-task$SLURM_NODEID"; date +%s.%N > "$f.tmp" && mv "$f.tmp" "$f"; \
  exec sleep 600'
"""
KEYS = ("start_s", "first_submit_to_start_s", "requeue_to_restart_s", "submit_to_start_s", "stop_s")
TRAINER_KEYS = ("trainer_submit_to_first_step_s", "local_launch_to_first_step_s", "trainer_requeue_to_first_new_step_s")
# the reference trainer's job: slow enough (step_delay_s) that the requeue lands mid-run
TRAINER = {"max_steps": 60, "ckpt_every_steps": 4, "dataset_size": 96, "global_batch": 16, "grad_accum": 2,
           "collective_timeout_s": 15, "step_delay_s": 0.3}


def _first(path: Path, pick, timeout: float) -> dict:
    """The first JSON line of ``path`` that ``pick`` accepts, waiting for it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line being written
                if pick(rec):
                    return rec
        time.sleep(0.02)
    raise SystemExit(f"nothing in {path} within {timeout:.0f}s")


def trainer_round(work: Path) -> dict:
    from ckpt_chaos.env.launcher import launch, worker_pythonpath

    def args(run: Path) -> list[str]:
        return [f"--{k.replace('_', '-')}={v}" for k, v in {**TRAINER, "run_dir": str(run)}.items()]

    run, local = work / "run", work / "local"
    run.mkdir(parents=True)
    with SlurmCluster(work / "slurm", SlurmConfig(nodes=2)) as c:
        t = time.time()
        job = c.submit_torchrun(run, 2, 1, "reference_trainer", args(run), {"PYTHONPATH": worker_pythonpath()})
        first = _first(run / "trajectory.jsonl", lambda r: True, 120)["t"] - t
        _first(run / "events.jsonl", lambda r: r.get("event") == "committed" and r.get("name") == "step_00000004", 120)
        t = time.time()
        c.scontrol("requeue", str(job.job_id))
        again = _first(run / "trajectory.jsonl", lambda r: r.get("attempt") == 1, 120)["t"] - t
        job.kill()
    t = time.time()
    j = launch(local, 2, args(local), launcher="torchrun")  # what the job runs on each node, without Slurm
    try:
        local_first = _first(local / "trajectory.jsonl", lambda r: True, 120)["t"] - t
    finally:
        j.kill()
    return {"trainer_submit_to_first_step_s": first, "local_launch_to_first_step_s": local_first,
            "trainer_requeue_to_first_new_step_s": again}


def _stamps(seen: Path, run: int, timeout: float) -> list[float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = sorted(seen.glob(f"run{run}-task[0-9]"))
        if len(files) == 2:
            return [float(f.read_text()) for f in files]
        time.sleep(0.02)
    raise SystemExit(f"run {run} of the job did not start on both nodes within {timeout:.0f}s (see {seen.parent})")


def one_round(work: Path, config: SlurmConfig, requeue_timeout: float) -> dict:
    seen = work / "seen"
    seen.mkdir(parents=True)
    t0 = time.monotonic()
    c = SlurmCluster(work / "slurm", config)
    try:
        c.start()
        start_s = time.monotonic() - t0
        t = time.time()
        job = c.sbatch(JOB.replace("SEEN", str(seen)), "--requeue", "--nodes=2", "--ntasks-per-node=1", cwd=work)
        first_s = max(_stamps(seen, 0, 60)) - t
        t = time.time()
        c.scontrol("requeue", str(job))
        requeue_s = max(_stamps(seen, 1, requeue_timeout)) - t
        c.scancel(str(job))
        deadline = time.monotonic() + 60
        while (c.jobs() or not c.all_idle()) and time.monotonic() < deadline:
            time.sleep(0.05)
        (seen2 := work / "seen2").mkdir()
        t = time.time()
        c.sbatch(JOB.replace("SEEN", str(seen2)), "--nodes=2", "--ntasks-per-node=1", cwd=work)
        submit_s = max(_stamps(seen2, 0, 60)) - t
    finally:
        t1 = time.monotonic()
        c.close()
        stop_s = time.monotonic() - t1
    return {"start_s": start_s, "first_submit_to_start_s": first_s, "requeue_to_restart_s": requeue_s,
            "submit_to_start_s": submit_s, "stop_s": stop_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--default-rounds", type=int, default=0,
                    help="rounds with Slurm's default cred_expire and sched_interval (each takes over 2 minutes)")
    ap.add_argument("--trainer-rounds", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "slurm_cluster.json"))
    args = ap.parse_args()
    if why := missing():
        raise SystemExit(f"cannot run a Slurm cluster here: {why}")
    configs = {"tuned": SlurmConfig(nodes=2)}
    if args.default_rounds:
        configs["slurm_defaults"] = SlurmConfig(nodes=2, cred_expire_s=120, sched_interval_s=60)
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory(prefix="ckpt-chaos-bench-slurm-") as tmp:
        for r in range(max(args.rounds, args.default_rounds)):
            for name, config in configs.items():
                if r >= (args.rounds if name == "tuned" else args.default_rounds):
                    continue
                runs[name].append(one_round(Path(tmp) / f"{name}-{r}", config,
                                            requeue_timeout=60 if name == "tuned" else 300))
                print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs[name][-1].items()),
                      flush=True)
        trainer = []
        for r in range(args.trainer_rounds):
            trainer.append(trainer_round(Path(tmp) / f"trainer-{r}"))
            print(f"trainer round {r + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in trainer[-1].items()), flush=True)
    out = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": platform.node(),
           "cpus": os.cpu_count(), "slurm": version(), "auth": auth_method(), "nodes": 2,
           "rounds": {name: len(rs) for name, rs in runs.items()},
           "configs": {name: {k: v for k, v in vars(c).items() if k not in ("extra", "start_timeout_s")}
                       for name, c in configs.items()},
           "runs": runs,
           "median": {name: {k: statistics.median(x[k] for x in rs) for k in KEYS} for name, rs in runs.items()},
           "trainer": {"config": TRAINER, "runs": trainer,
                       "median": {k: statistics.median(x[k] for x in trainer) for k in TRAINER_KEYS} if trainer else {},
                       "ratio_submit_to_local": statistics.median(
                           x["trainer_submit_to_first_step_s"] / x["local_launch_to_first_step_s"] for x in trainer)
                       if trainer else None}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"\n{'config':<15}" + "".join(f"{k:>25}" for k in KEYS))
    for name, m in out["median"].items():
        print(f"{name:<15}" + "".join(f"{m[k]:>25.2f}" for k in KEYS))
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
