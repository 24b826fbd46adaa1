"""What checkpointing costs the reference trainer, at a few model sizes, measured side by side.

For each model size, every round runs (on the same file system, one after another):

* the disk's limit: a file of the checkpoint's size written and fsynced (MB/s);
* training with no checkpoints (the baseline step time);
* training with a synchronous checkpoint every 2 steps: the stall per save (the trainer's
  ``stall_s``), the total save time, and save throughput as a fraction of the fsynced write rate;
* the same with ``dcp.async_save``: the stall left to training;
* a restart: the synchronous run stops (with a save) after 8 of its 12 steps and is relaunched:
  load time (``load_s``) and restart time, from the launch of ``torchrun`` to the first new step.

Sizes and configurations alternate within each round so drift hits them alike; the figures are
medians over rounds (and over every save of a round).

    python benchmarks/checkpoint_overhead.py --rounds 3   # writes benchmarks/results/checkpoint_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ckpt_chaos.check.history import trainer_events, trajectory_records  # noqa: E402
from ckpt_chaos.env.launcher import run_to_end  # noqa: E402
from ckpt_chaos.run.runner import trainer_args  # noqa: E402

SIZES = {"small": {"d_model": 64, "n_layers": 2}, "medium": {"d_model": 128, "n_layers": 4},
         "large": {"d_model": 256, "n_layers": 4}}
BASE = {"max_steps": 12, "dataset_size": 128, "global_batch": 16, "grad_accum": 2, "keep_last": 2}


def fsync_write_mb_s(directory: Path, nbytes: int) -> float:
    """Write and fsync ``nbytes`` in 1 MiB blocks: the rate a durable save cannot beat here."""
    path = directory / "bandwidth.probe"
    block = os.urandom(1 << 20)
    started = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(max(1, nbytes >> 20)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - started
    path.unlink()
    return max(1, nbytes >> 20) * (1 << 20) / 1e6 / elapsed


def train(work: Path, cfg: dict) -> tuple[float, list[dict]]:
    started = time.time()
    rc = run_to_end(work, 2, trainer_args({**cfg, "run_dir": str(work)}), timeout=900)
    if rc != 0:
        raise SystemExit(f"training failed (exit {rc}); see {work / 'torchrun.log'}")
    return started, trajectory_records(work)


def one_size(tmp: Path, name: str, size: dict, round_no: int) -> dict:
    cfg = {**BASE, **size}
    base = tmp / f"{name}-{round_no}"
    _, plain = train(base / "plain", {**cfg, "ckpt_every_steps": 0})
    # Stopped (with a save) after 8 of its 12 steps, so that a relaunch has steps left to restart into.
    stop = {"stop_after_microbatches": 8 * BASE["grad_accum"]}
    _, synced = train(base / "sync", {**cfg, "ckpt_every_steps": 2, **stop})
    _, _ = train(base / "async", {**cfg, "ckpt_every_steps": 2, "async_save": True})
    saves = trainer_events(base / "sync", "saved")
    async_saves = trainer_events(base / "async", "saved")
    nbytes = statistics.median(e["bytes"] for e in trainer_events(base / "sync", "committed"))
    disk = fsync_write_mb_s(base, int(nbytes))
    # Restart: relaunch the synchronous run; it resumes from its step-8 checkpoint.
    launched, records = train(base / "sync", {**cfg, "ckpt_every_steps": 2})
    first_new = min(r["t"] for r in records if r["t"] > launched)
    load = [e["load_s"] for e in trainer_events(base / "sync", "loaded")]
    total = statistics.median(e["total_s"] for e in saves)
    return {
        "checkpoint_mb": nbytes / 1e6,
        "step_s_no_ckpt": statistics.median(r["step_time_s"] for r in plain),
        # The loop's own cost: training wall time per step with saves vs without.
        "loop_s_per_step_no_ckpt": (plain[-1]["t"] - plain[0]["t"]) / (len(plain) - 1),
        "loop_s_per_step_sync": (synced[-1]["t"] - synced[0]["t"]) / (len(synced) - 1),
        "stall_sync_s": statistics.median(e["stall_s"] for e in saves),
        "stall_async_s": statistics.median(e["stall_s"] for e in async_saves),
        "save_total_s": total,
        "save_mb_s": nbytes / 1e6 / total,
        "fsync_write_mb_s": disk,
        "load_s": load[-1] if load else None,
        "restart_s": first_new - launched,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "checkpoint_overhead.json"))
    args = ap.parse_args()
    sizes = args.sizes.split(",")
    rows: dict[str, list[dict]] = {s: [] for s in sizes}
    with tempfile.TemporaryDirectory(prefix="ckpt-chaos-overhead-", dir=Path(__file__).resolve().parent.parent) as tmp:
        for r in range(args.rounds):
            for name in sizes:
                rows[name].append(one_size(Path(tmp), name, SIZES[name], r))
                m = rows[name][-1]
                print(f"round {r + 1}/{args.rounds} {name}: {m['checkpoint_mb']:.1f} MB, stall sync "
                      f"{m['stall_sync_s']:.3f} s / async {m['stall_async_s']:.3f} s, save {m['save_mb_s']:.0f} MB/s "
                      f"of {m['fsync_write_mb_s']:.0f} MB/s fsynced, load {m['load_s']:.3f} s, restart "
                      f"{m['restart_s']:.1f} s", flush=True)
    out = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "rounds": args.rounds,
           "sizes": {}}
    for name, runs in rows.items():
        med = {k: statistics.median(run[k] for run in runs if run[k] is not None) for k in runs[0]}
        med["save_fraction_of_fsync_bw"] = med["save_mb_s"] / med["fsync_write_mb_s"]
        med["loop_overhead_sync"] = med["loop_s_per_step_sync"] / med["loop_s_per_step_no_ckpt"]
        out["sizes"][name] = {"config": SIZES[name], **med}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
