"""What the automatic probe layer costs an unmodified trainer, and how precisely it places a fault.

Cost: each example trainer (the plain DDP loop under torchrun, Lightning with its own launching,
Accelerate under ``accelerate launch``; 2 ranks) trains ``--short`` and ``--long`` steps without the
layer, with it as a chaos run has it when no trigger names a per-step point (file and save points
answered by a controller, the trajectory recorded, state digests every 4 steps), and with every
per-step point sent too (as in a golden run, or a scenario that triggers on steps), in turn within
each round. Its step time is ``(T(long) - T(short)) / (long - short)``, so the
start-up cancels; the table gives medians over the rounds and the ratio with / without.

Precision: the plain DDP loop is SIGKILLed at ``file.write`` of its step-8 checkpoint with
``min_fraction`` f (0.1 to 0.9; the size planned from a fault-free run), and the bytes on disk are
compared with f of the planned size.

    python benchmarks/probe_layer.py --rounds 3   # writes benchmarks/results/probe_layer.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckpt_chaos.env.launcher import worker_pythonpath  # noqa: E402
from ckpt_chaos.probe import auto  # noqa: E402
from ckpt_chaos.run.controller import ProbeServer  # noqa: E402

PY = sys.executable
TORCHRUN = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
TRAINERS = {
    "plain DDP (torchrun)": [*TORCHRUN, "examples/plain_ddp/train.py"],
    "Lightning": [PY, "examples/lightning/train.py"],
    "Accelerate": [PY, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
                   "1", "--mixed_precision", "no", "--dynamo_backend", "no", "examples/accelerate/train.py"],
}
FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.9)
CKPT = "ckpt/step_00000008.pt.tmp"


MODES = {"off": None, "on": (), "on, every step point": None}  # step points sent to the controller


def _env(run_dir: Path, server: ProbeServer | None, planned: Path | None = None, step_points=None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": worker_pythonpath("ckpt_chaos")}
    if server is not None:
        env.update(auto.environment(server.address, run_dir, [run_dir / "ckpt"], planned=planned, digest_every=4,
                                    pythonpath=env["PYTHONPATH"], step_points=step_points))
    return env


def train(cmd: list[str], steps: int, layer: bool, save_every: int = 100000, planned: Path | None = None,
          on_event=None, step_points=None) -> tuple[float, Path, list[dict]]:
    run_dir = Path(tempfile.mkdtemp(prefix="cc-probe-"))
    events: list[dict] = []

    def answer(e):
        events.append(e)
        return on_event(e) if on_event else None

    argv = [*cmd, "--ckpt-dir", str(run_dir / "ckpt"), "--steps", str(steps), "--save-every", str(save_every)]
    for attempt in (1, 2):
        server = ProbeServer(answer) if layer else None
        try:
            t = time.monotonic()
            p = subprocess.run(argv, cwd=ROOT, env=_env(run_dir, server, planned, step_points), capture_output=True,
                               text=True)
            wall = time.monotonic() - t
        finally:
            if server is not None:
                server.close()
        if p.returncode == 0 or on_event is not None:
            return wall, run_dir, events
        # gloo now and then aborts a rank at exit on a loaded 2-core machine (SIGABRT after training): once more
        print(f"WARNING: {' '.join(argv[-8:])} failed ({p.returncode}), attempt {attempt}:\n{p.stderr[-600:]}",
              file=sys.stderr, flush=True)
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir()
        events.clear()
    raise SystemExit(f"{' '.join(argv)} failed twice ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")


def cost(rounds: int, short: int, long: int) -> dict:
    out = {}
    for name, cmd in TRAINERS.items():
        per = {mode: [] for mode in MODES}
        for r in range(rounds):
            for mode, points in MODES.items():
                walls = {}
                for steps in (short, long):
                    wall, run_dir, _ = train(cmd, steps, mode != "off", step_points=points)
                    shutil.rmtree(run_dir, ignore_errors=True)
                    walls[steps] = wall
                per[mode].append((walls[long] - walls[short]) / (long - short))
                print(f"round {r + 1}/{rounds} {name:22s} layer {mode:22s} step {per[mode][-1] * 1e3:.2f} ms",
                      flush=True)
        med = {mode: statistics.median(v) for mode, v in per.items()}
        out[name] = {"step_s_without": med["off"], "step_s_with": med["on"], "ratio": med["on"] / med["off"],
                     "step_s_every_point": med["on, every step point"],
                     "ratio_every_point": med["on, every step point"] / med["off"], "rounds": per}
    return out


def precision() -> dict:
    cmd = TRAINERS["plain DDP (torchrun)"]
    _, golden, events = train(cmd, 12, True, save_every=4)
    sizes = auto.planned_sizes(events)
    shutil.rmtree(golden, ignore_errors=True)
    plan = Path(tempfile.mkdtemp(prefix="cc-plan-")) / "planned.json"
    plan.write_text(json.dumps(sizes))
    rows = []
    for f in FRACTIONS:
        hit: list[dict] = []

        def kill(e, f=f, hit=hit):
            info = e.get("info", {})
            if not hit and e["point"] == "file.write" and info.get("path") == CKPT and info.get("fraction", 0) >= f:
                hit.append(e)
                os.kill(e["pid"], signal.SIGKILL)

        _, run_dir, _ = train(cmd, 12, True, save_every=4, planned=plan, on_event=kill)
        on_disk = (run_dir / CKPT).stat().st_size if (run_dir / CKPT).exists() else None
        shutil.rmtree(run_dir, ignore_errors=True)
        rows.append({"fraction": f, "planned_bytes": sizes[CKPT], "on_disk_bytes": on_disk,
                     "landed": on_disk / sizes[CKPT] if on_disk is not None else None})
        print(f"kill at {f:.1f} of {sizes[CKPT]} B: {on_disk} B on disk", flush=True)
    return {"file": CKPT, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--short", type=int, default=20)
    ap.add_argument("--long", type=int, default=320)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "probe_layer.json")
    args = ap.parse_args()
    result = {"command": f"python benchmarks/probe_layer.py --rounds {args.rounds} --short {args.short} "
                         f"--long {args.long}",
              "cpus": os.cpu_count(), "python": platform.python_version(),
              "cost": cost(args.rounds, args.short, args.long), "precision": precision()}
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
