"""What checkpointing costs the reference trainer, at a few model sizes, measured side by side.

For each model size, every round runs (on the same file system, one after another):

* training with no checkpoints (the baseline step time);
* training with a synchronous checkpoint every 2 steps: the stall per save (the trainer's
  ``stall_s``), the total save time and where it goes (the ``saved`` event's phases), and the save
  set against the disk's limit: a file of the checkpoint's size written and fsynced, measured
  before and after the save runs (``fsync_write_s``);
* the same with ``dcp.async_save``: the stall left to training, the first save's and the median;
* a restart: the synchronous run stops (with a save) after two thirds of its steps and is
  relaunched with the checkpoint's pages dropped from the page cache (``posix_fadvise``
  DONTNEED after the fsync): the resume reads it cold, validation (manifest, sizes, the small
  ``.metadata`` hashed) then ``dcp.load`` (each shard read once and hashed as it is read), set
  against a cold sequential read of a file of the same size written the same way (``cold_read_s``)
  and against a cold read of the checkpoint's own files, a reader thread per file as the ranks
  read them (``cold_read_files_s``), and the restart time, from the launch of ``torchrun`` to the
  first new step.

Saves record no state digests (``record_digests = false``, as in production). Sizes and
configurations alternate within each round so drift hits them alike; the figures are medians
over rounds (and over every save of a round).

    python benchmarks/checkpoint_overhead.py --rounds 3   # writes benchmarks/results/checkpoint_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ckpt_chaos.check.history import trainer_events, trajectory_records
from ckpt_chaos.env.launcher import run_to_end
from ckpt_chaos.run.runner import trainer_args

BASE = {"max_steps": 12, "dataset_size": 128, "global_batch": 16, "grad_accum": 2, "keep_last": 2,
        "record_digests": False}
SIZES = {"small": {"d_model": 64, "n_layers": 2}, "medium": {"d_model": 128, "n_layers": 4},
         "large": {"d_model": 256, "n_layers": 4},
         # ~1.2 GB of checkpoint; few, small steps keep a round in minutes on two CPUs.
         "xl": {"d_model": 1024, "n_layers": 8, "n_heads": 8, "max_steps": 6, "warmup_steps": 1,
                "dataset_size": 64, "global_batch": 4, "grad_accum": 1}}


def fsync_write_s(directory: Path, nbytes: int, keep: bool = False) -> float:
    """Seconds to write ``nbytes`` in 1 MiB blocks and fsync them: what a durable save cannot beat."""
    path = directory / "bandwidth.probe"
    block = os.urandom(1 << 20)
    started = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(nbytes >> 20):
            f.write(block)
        f.write(block[: nbytes & ((1 << 20) - 1)])
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - started
    if not keep:
        path.unlink()
    return elapsed


def drop_cached(path: Path) -> None:
    """Evict a file's (clean, fsynced) pages from the page cache, so that the next read is cold."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cold_read_s(directory: Path, nbytes: int) -> float:
    """Seconds to read back, cold, a file of ``nbytes`` written and fsynced like a checkpoint."""
    fsync_write_s(directory, nbytes, keep=True)
    path = directory / "bandwidth.probe"
    drop_cached(path)
    buf = bytearray(8 << 20)
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    elapsed = time.perf_counter() - started
    path.unlink()
    return elapsed


def cold_read_files_s(files: list[Path]) -> float:
    """Seconds to read ``files`` cold, one reader thread per file at once: how the ranks read a
    checkpoint (each its own shard), so the disk's limit for that access pattern."""
    for f in files:
        drop_cached(f)

    def read(path: Path) -> None:
        buf = bytearray(8 << 20)
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(files)) as pool:
        list(pool.map(read, files))
    elapsed = time.perf_counter() - started
    for f in files:
        drop_cached(f)
    return elapsed


def train(work: Path, cfg: dict) -> tuple[float, list[dict]]:
    started = time.time()
    rc = run_to_end(work, 2, trainer_args({**cfg, "run_dir": str(work)}), timeout=900)
    if rc != 0:
        raise SystemExit(f"training failed (exit {rc}); see {work / 'torchrun.log'}")
    return started, trajectory_records(work)


def one_size(tmp: Path, name: str, size: dict, round_no: int) -> dict:
    cfg = {**BASE, **size}
    steps, every = cfg["max_steps"], 2
    base = tmp / f"{name}-{round_no}"
    _, plain = train(base / "plain", {**cfg, "ckpt_every_steps": 0})
    # Stopped (with a save) after two thirds of its steps, so that a relaunch has steps left to restart into.
    stop = {"stop_after_microbatches": steps * 2 // 3 * cfg["grad_accum"]}
    writes = []
    if name in _BYTES:  # the disk's limit before the save runs too, from the second round on
        writes.append(fsync_write_s(base, _BYTES[name]))
    _, synced = train(base / "sync", {**cfg, "ckpt_every_steps": every, **stop})
    nbytes = statistics.median(e["bytes"] for e in trainer_events(base / "sync", "committed"))
    _BYTES[name] = int(nbytes)
    writes.append(fsync_write_s(base, int(nbytes)))
    _, _ = train(base / "async", {**cfg, "ckpt_every_steps": every, "async_save": True})
    writes.append(fsync_write_s(base, int(nbytes)))
    saves = trainer_events(base / "sync", "saved")
    async_saves = trainer_events(base / "async", "saved")
    # Restart: relaunch the synchronous run from its checkpoint, cold, beside a cold sequential read.
    read = cold_read_s(base, int(nbytes))
    newest = (base / "sync" / "checkpoints" / "latest").read_text().strip()
    read_files = cold_read_files_s(sorted(p for p in (base / "sync" / "checkpoints" / newest).iterdir() if p.is_file()))
    for f in (base / "sync" / "checkpoints").rglob("*"):
        if f.is_file():
            drop_cached(f)
    launched, records = train(base / "sync", {**cfg, "ckpt_every_steps": every})
    first_new = min(r["t"] for r in records if r["t"] > launched)
    loaded = trainer_events(base / "sync", "loaded")[-1]
    total = statistics.median(e["total_s"] for e in saves)
    write = statistics.median(writes)
    phases = {k: statistics.median(e["phases"].get(k, 0.0) for e in saves) for k in saves[0].get("phases", {})}
    return {
        "checkpoint_mb": nbytes / 1e6,
        "step_s_no_ckpt": statistics.median(r["step_time_s"] for r in plain),
        # The loop's own cost: training wall time per step with saves vs without.
        "loop_s_per_step_no_ckpt": (plain[-1]["t"] - plain[0]["t"]) / (len(plain) - 1),
        "loop_s_per_step_sync": (synced[-1]["t"] - synced[0]["t"]) / (len(synced) - 1),
        "stall_sync_s": statistics.median(e["stall_s"] for e in saves),
        "stall_async_s": statistics.median(e["stall_s"] for e in async_saves),
        "stall_async_first_s": async_saves[0]["stall_s"],
        "stall_async_max_s": max(e["stall_s"] for e in async_saves),
        "save_total_s": total,
        "save_mb_s": nbytes / 1e6 / total,
        "fsync_write_s": write,
        "fsync_write_mb_s": nbytes / 1e6 / write,
        "save_phases_s": phases,
        "load_s": loaded["load_s"],
        "validate_s": loaded.get("choose_s"),
        "cold_read_s": read,
        "cold_read_files_s": read_files,
        "restart_s": first_new - launched,
    }


_BYTES: dict[str, int] = {}  # checkpoint size per model size, from the first round


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
                print(f"round {r + 1}/{args.rounds} {name}: {m['checkpoint_mb']:.1f} MB, save "
                      f"{m['save_total_s']:.3f} s against an fsynced write's {m['fsync_write_s']:.3f} s, async stall "
                      f"{m['stall_async_s']:.3f} s (first {m['stall_async_first_s']:.3f} s), validate + load "
                      f"{m['validate_s']:.3f} + {m['load_s']:.3f} s against a cold read's {m['cold_read_s']:.3f} s "
                      f"({m['cold_read_files_s']:.3f} s for its own files, a thread each), "
                      f"restart {m['restart_s']:.1f} s", flush=True)
    out = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "rounds": args.rounds,
           "sizes": {}}
    for name, runs in rows.items():
        med = {k: statistics.median(run[k] for run in runs if run[k] is not None)
               for k in runs[0] if not isinstance(runs[0][k], dict)}
        med["save_phases_s"] = {k: statistics.median(run["save_phases_s"].get(k, 0.0) for run in runs)
                                for k in runs[0]["save_phases_s"]}
        # Ratios per round (both sides measured in that round), then their median.
        ratio = {"save_fraction_of_fsync_bw": lambda r: r["fsync_write_s"] / r["save_total_s"],
                 "async_stall_fraction_of_sync_save": lambda r: r["stall_async_s"] / r["save_total_s"],
                 "async_first_stall_fraction_of_sync_save": lambda r: r["stall_async_first_s"] / r["save_total_s"],
                 "load_fraction_of_cold_read_bw": lambda r: r["cold_read_s"] / (r["validate_s"] + r["load_s"]),
                 "load_fraction_of_cold_files_read_bw":
                     lambda r: r["cold_read_files_s"] / (r["validate_s"] + r["load_s"])}
        med.update({k: statistics.median(f(run) for run in runs) for k, f in ratio.items()})
        med["loop_overhead_sync"] = med["loop_s_per_step_sync"] / med["loop_s_per_step_no_ckpt"]
        out["sizes"][name] = {"config": SIZES[name], **med}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
