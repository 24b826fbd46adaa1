"""Checkpoint stall on healthy, fault-layered and slow storage, measured side by side.

Each configuration trains the reference trainer (2 ranks, torchrun, 12 steps, a checkpoint
every 2 steps) with its checkpoint directory on:

* ``tmpfs``: a tmpfs, bind-mounted (the baseline);
* ``faultfs``: faultfs over the same kind of tmpfs, no rule armed (the fault layer's own cost);
* ``slow-sync``: faultfs with every write slowed (bandwidth cap + latency), synchronous saves;
* ``slow-async``: the same slow storage, ``dcp.async_save``.

Configurations run round-robin, ``--rounds`` times, so drift of the machine hits all of them
alike; the figures are medians over every save of every round (the trainer's own ``stall_s``:
how long training waited; ``total_s``: until the checkpoint was committed). Needs root and FUSE.

    python benchmarks/storage_stall.py --rounds 3   # writes benchmarks/results/storage_stall.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

from ckpt_chaos.check.history import trainer_events
from ckpt_chaos.env.launcher import run_to_end
from ckpt_chaos.run.runner import trainer_args
from ckpt_chaos.env.storage import Storage, StorageSpec, missing

TRAINER = {"max_steps": 12, "ckpt_every_steps": 2, "dataset_size": 96, "global_batch": 16, "grad_accum": 2,
           "d_model": 128, "n_layers": 4, "keep_last": 2}
SLOW = {"latency_ms": 2.0, "bandwidth_mb_s": 16.0}
CONFIGS = {
    "tmpfs": (StorageSpec(fs="tmpfs", size_mb=256), None, False),
    "faultfs": (StorageSpec(fs="tmpfs", size_mb=256, faultfs=True), None, False),
    "slow-sync": (StorageSpec(fs="tmpfs", size_mb=256, faultfs=True), SLOW, False),
    "slow-async": (StorageSpec(fs="tmpfs", size_mb=256, faultfs=True), SLOW, True),
}


def one_run(work: Path, name: str) -> list[dict]:
    spec, slow, asynchronous = CONFIGS[name]
    run_dir = work / f"{name}-{time.time_ns()}"
    with Storage(run_dir, spec) as storage:
        if slow:
            storage.client.call("arm", rule={"call": "write", "errno": 0, "delay_s": slow["latency_ms"] / 1000,
                                             "bytes_per_s": slow["bandwidth_mb_s"] * (1 << 20)})
        cfg = {**TRAINER, "run_dir": str(run_dir), "async_save": asynchronous}
        rc = run_to_end(run_dir, 2, trainer_args(cfg), timeout=300)
    if rc != 0:
        raise SystemExit(f"{name}: the trainer failed (exit {rc}); see {run_dir}/torchrun.log")
    sizes = {e["name"]: e["bytes"] for e in trainer_events(run_dir, "committed")}
    return [{**e, "bytes": sizes.get(e["name"])} for e in trainer_events(run_dir, "saved")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "storage_stall.json"))
    args = ap.parse_args()
    why = missing("tmpfs", faultfs=True)
    if why:
        raise SystemExit(f"cannot run the storage benchmark here: {why}")
    saves: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="ckpt-chaos-bench-") as tmp:
        for r in range(args.rounds):
            for name in CONFIGS:
                saves[name] += one_run(Path(tmp), name)
                print(f"round {r + 1}/{args.rounds} {name}: {len(saves[name])} saves so far", flush=True)
    rows = {}
    for name, events in saves.items():
        rows[name] = {"saves": len(events), "bytes": events[0].get("bytes"),
                      "stall_s_median": statistics.median(e["stall_s"] for e in events),
                      "total_s_median": statistics.median(e["total_s"] for e in events)}
    base = rows["tmpfs"]
    for row in rows.values():
        row["stall_vs_tmpfs"] = row["stall_s_median"] / base["stall_s_median"]
        row["total_vs_tmpfs"] = row["total_s_median"] / base["total_s_median"]
    out = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": platform.node(),
           "cpus": __import__("os").cpu_count(), "rounds": args.rounds, "trainer": TRAINER, "slow": SLOW,
           "results": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"\n{'storage':<12} {'saves':>5} {'stall s':>9} {'x tmpfs':>8} {'commit s':>9} {'x tmpfs':>8}")
    for name, row in rows.items():
        print(f"{name:<12} {row['saves']:>5} {row['stall_s_median']:>9.3f} {row['stall_vs_tmpfs']:>8.2f} "
              f"{row['total_s_median']:>9.3f} {row['total_vs_tmpfs']:>8.2f}")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
