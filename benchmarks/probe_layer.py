"""What the automatic probe layer costs an unmodified trainer, and how precisely it places a fault.

Cost: each example trainer (the plain DDP loop under torchrun, Lightning with its own launching,
Accelerate under ``accelerate launch``; 2 ranks) trains ``--steps`` steps without the layer, with it
as a chaos run has it when no trigger names a per-step point (file and save points answered by a
controller, the trajectory recorded, state digests around saves and at exit as a scenario's
``[command]`` has them by default), and with every per-step point sent too (as in a golden run, or a scenario
that triggers on steps), in turn within each round, the order rotating. A step timer
(``benchmarks/step_timer``, loaded the same way in every arm) takes the time of every optimizer
step in rank 0; a run's step time is the mean interval between steps after ``--warmup`` steps (the
digest steps included), and the table gives medians over the rounds and the ratio with / without.

CPU: the same layer's work per step, in one process training the plain loop's model (no collective
to hide it behind), with the layer switched on and off every 500 steps in turn (its optimizer hooks
and its backward wrapper), 40 times: the median extra time per step, with no state digests and
with a digest every 4 steps.

Precision: the plain DDP loop is SIGKILLed at ``file.write`` of its step-8 checkpoint with
``min_fraction`` f (0.1 to 0.9; the size planned from a fault-free run), and the bytes on disk are
compared with f of the planned size. The same for faultfs, the fallback for writers Python cannot
see: a process saves a 1 MiB tensor with safetensors (its Rust writer: a temporary file, sized
first, then renamed) onto a faultfs mount and is SIGKILLed at ``faultfs.write`` with
``min_fraction`` f; the bytes it wrote are the prefix of the file that equals a fault-free save.

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

from ckpt_chaos.env.launcher import worker_pythonpath
from ckpt_chaos.probe import auto
from ckpt_chaos.run.controller import ProbeServer
from ckpt_chaos.scenario import Command

ROOT = Path(__file__).resolve().parent.parent
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
TIMER = ROOT / "benchmarks" / "step_timer"
DIGEST_EVERY = Command().digest_every  # a scenario's [command] default


def _env(run_dir: Path, server: ProbeServer | None, planned: Path | None = None, step_points=None,
         times: Path | None = None) -> dict[str, str]:
    path = worker_pythonpath("ckpt_chaos")
    if times is not None:
        path = os.pathsep.join((str(TIMER), path))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    if times is not None:
        env["CKPT_CHAOS_STEP_TIMES"] = str(times)
    if server is not None:
        env.update(auto.environment(server.address, run_dir, [run_dir / "ckpt"], planned=planned,
                                    digest_every=DIGEST_EVERY, pythonpath=path, step_points=step_points))
    return env


def train(cmd: list[str], steps: int, layer: bool, save_every: int = 100000, planned: Path | None = None,
          on_event=None, step_points=None, times: Path | None = None) -> tuple[float, Path, list[dict]]:
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
            p = subprocess.run(argv, cwd=ROOT, env=_env(run_dir, server, planned, step_points, times),
                               capture_output=True, text=True)
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
        if times is not None:
            for f in times.glob("*.json"):
                f.unlink()
    raise SystemExit(f"{' '.join(argv)} failed twice ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")


def step_time(times: Path, steps: int, warmup: int) -> tuple[float, float]:
    """Mean and median step interval of rank 0 (the process that stepped ``steps`` times and records)."""
    runs = [json.loads(f.read_text()) for f in times.glob("*.json")]
    ranked = [r for r in runs if len(r["ns"]) == steps]
    rank0 = next((r for r in ranked if r["rank"] in ("0", None)), ranked[0] if ranked else None)
    if rank0 is None:
        raise SystemExit(f"no process timed {steps} steps in {times}: {[len(r['ns']) for r in runs]}")
    gaps = [(b - a) / 1e9 for a, b in zip(rank0["ns"][warmup:], rank0["ns"][warmup + 1:])]
    return statistics.fmean(gaps), statistics.median(gaps)


def cost(rounds: int, steps: int, warmup: int) -> dict:
    out = {}
    modes = list(MODES)
    for name, cmd in TRAINERS.items():
        per = {mode: [] for mode in MODES}
        med = {mode: [] for mode in MODES}
        for r in range(rounds):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
                times = Path(tempfile.mkdtemp(prefix="cc-times-"))
                _, run_dir, _ = train(cmd, steps, mode != "off", step_points=MODES[mode], times=times)
                mean, median = step_time(times, steps, warmup)
                shutil.rmtree(run_dir, ignore_errors=True)
                shutil.rmtree(times, ignore_errors=True)
                per[mode].append(mean)
                med[mode].append(median)
                print(f"round {r + 1}/{rounds} {name:22s} layer {mode:22s} step {mean * 1e3:.3f} ms "
                      f"(median {median * 1e3:.3f} ms)", flush=True)
        m = {mode: statistics.median(v) for mode, v in per.items()}
        out[name] = {"step_s_without": m["off"], "step_s_with": m["on"], "ratio": m["on"] / m["off"],
                     "step_s_every_point": m["on, every step point"],
                     "ratio_every_point": m["on, every step point"] / m["off"],
                     "ratio_median_step": statistics.median(med["on"]) / statistics.median(med["off"]),
                     "rounds": per, "rounds_median_step": med}
    return out


_CPU = r"""
import os, statistics, sys, tempfile, time
run = tempfile.mkdtemp(prefix="cc-cpu-")
os.environ.update({"CKPT_CHAOS_CONTROLLER": "unused: no point is sent", "CKPT_CHAOS_RUN_DIR": run, "RANK": "0",
                   "CKPT_CHAOS_DIGEST_EVERY": sys.argv[1], "CKPT_CHAOS_STEP_POINTS": "",
                   "CKPT_CHAOS_AUTO_DIRS": os.path.join(run, "ckpt")})
import torch
import torch.optim.optimizer as optimizer
from torch import nn
bare = torch.autograd.backward
from ckpt_chaos.probe import auto
auto.install()
hooks = (dict(optimizer._global_optimizer_pre_hooks), dict(optimizer._global_optimizer_post_hooks))
probed = torch.autograd.backward

def layer(on):
    for live, mine in zip((optimizer._global_optimizer_pre_hooks, optimizer._global_optimizer_post_hooks), hooks):
        live.clear()
        if on:
            live.update(mine)
    torch.autograd.backward = probed if on else bare

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))  # the plain loop's
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
x, y = torch.randn(8, 16), torch.randn(8, 1)

def step():
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()

for _ in range(300):
    step()
times = {True: [], False: []}
for r in range(40):
    for on in (r % 2 == 0, r % 2 == 1):
        layer(on)
        t = time.perf_counter()
        for _ in range(500):
            step()
        times[on].append((time.perf_counter() - t) / 500)
print(statistics.median(times[False]), statistics.median(times[True]))
"""


def cpu() -> dict:
    out = {}
    for every in (0, 4):
        p = subprocess.run([PY, "-c", _CPU, str(every)], cwd=ROOT, capture_output=True, text=True, check=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": worker_pythonpath("ckpt_chaos")})
        off, on = map(float, p.stdout.split())
        out[f"digest_every_{every}"] = {"step_s_without": off, "step_s_with": on, "extra_s": on - off}
        print(f"one process, digest every {every}: {off * 1e6:.1f} us -> {on * 1e6:.1f} us per step", flush=True)
    return out


_SAFETENSORS = r"""
import sys, torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(0)
save_file({"w": torch.rand(1 << 18, generator=g)}, sys.argv[1])
"""


def precision_faultfs() -> dict:
    from ckpt_chaos.env.storage import FAULTFS_POINTS, Storage, StorageSpec

    def save(events: list, on_event=None, planned=None) -> tuple[bytes, dict]:
        root = Path(tempfile.mkdtemp(prefix="cc-ffs-"))
        try:
            def answer(e):
                events.append(e)
                return on_event(e) if on_event else None

            with ProbeServer(answer) as server, Storage(root, StorageSpec(faultfs=True)) as st:
                st.client.call("report", controller=server.address, points=list(FAULTFS_POINTS),
                               prefix="checkpoints", planned=planned)
                subprocess.run([PY, "-c", _SAFETENSORS, str(st.ckpt / "model.safetensors")], cwd=ROOT,
                               env={**os.environ, "CKPT_CHAOS_CONTROLLER": server.address,
                                    "PYTHONPATH": worker_pythonpath("ckpt_chaos")})
                files = {p.name: p.read_bytes() for p in st.view.iterdir()}
            return files.get("model.safetensors", b""), files
        finally:
            shutil.rmtree(root, ignore_errors=True)

    golden_events: list = []
    whole, _ = save(golden_events)
    plan = auto.planned_sizes(golden_events)
    glob = "checkpoints/.tmp*"
    size = max(v for k, v in plan.items() if k.startswith("checkpoints/.tmp"))
    rows = []
    for f in FRACTIONS:
        hit: list = []

        def kill(e, f=f, hit=hit):
            if not hit and e["point"] == "faultfs.write" and e["info"].get("fraction", 0) >= f:
                hit.append(e)
                os.kill(e["pid"], signal.SIGKILL)

        _, files = save([], kill, {glob: size})
        torn = next((b for n, b in files.items() if n.startswith(".tmp")), b"")
        same = next((i for i, (a, b) in enumerate(zip(torn, whole)) if a != b), min(len(torn), len(whole)))
        rows.append({"fraction": f, "planned_bytes": size, "on_disk_bytes": same, "landed": same / size})
        print(f"faultfs: kill at {f:.1f} of {size} B: {same} B written", flush=True)
    return {"file": "model.safetensors (safetensors' temporary file)", "rows": rows}


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
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "probe_layer.json")
    args = ap.parse_args()
    result = {"command": f"python benchmarks/probe_layer.py --rounds {args.rounds} --steps {args.steps} "
                         f"--warmup {args.warmup}",
              "cpus": os.cpu_count(), "digest_every": DIGEST_EVERY, "python": platform.python_version(),
              "cost": cost(args.rounds, args.steps, args.warmup), "cpu": cpu(), "precision": precision(),
              "precision_faultfs": precision_faultfs()}
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
