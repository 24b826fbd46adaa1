"""The remote tier's costs, measured side by side: the fault proxy on the upload link, and the
training stall that background uploads cause.

* Upload throughput: the trainer's own upload path (``RemoteStore.put_file``: Content-MD5,
  checksum metadata) puts a checkpoint-sized set of files (10.7 MB in 3 objects, the sizes of the
  d_model 128 / 4-layer checkpoint of ``storage_stall.py``) to moto's S3 server directly and
  through the fault proxy with no toxic, alternating, ``--uploads`` times per round.
* Training stall: the reference trainer (2 ranks, torchrun, 16 steps, a 10.7 MB checkpoint every
  2 steps) with the remote tier off and on, alternating; the figures are the median step time,
  the median step time of the steps right after a checkpoint, and the wall time.

Every figure is a median over ``--rounds`` rounds; ratios are taken within the same run.

    python benchmarks/remote_upload.py --rounds 5   # writes benchmarks/results/remote_upload.json
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

from ckpt_chaos.check.history import trainer_events, trajectory_records
from ckpt_chaos.env.launcher import run_to_end
from ckpt_chaos.env.objectstore import RemoteTier
from ckpt_chaos.probe.layout import checksum_file
from ckpt_chaos.run.runner import trainer_args
from reference_trainer.remote import RemoteStore

FILES = {"__0_0.distcp": 5_300_000, "__1_0.distcp": 5_300_000, ".metadata": 100_000}
TRAINER = {"max_steps": 16, "ckpt_every_steps": 2, "dataset_size": 128, "global_batch": 16, "grad_accum": 2,
           "d_model": 128, "n_layers": 4, "keep_last": 2}


def upload_round(tier: RemoteTier, src: Path, uploads: int, round_no: int) -> dict[str, float]:
    """MB/s of ``uploads`` checkpoint uploads, direct and through the proxy, alternating."""
    total = sum(FILES.values())
    stores = {"direct": RemoteStore(tier.url, tier.s3.endpoint), "proxy": RemoteStore(tier.url, tier.endpoint)}
    seconds = {k: [] for k in stores}
    checksums = {f: checksum_file(src / f) for f in FILES}
    for i in range(uploads):
        for how, store in stores.items():
            name = f"step_{round_no * 1000 + i:08d}"
            started = time.perf_counter()
            for f in FILES:
                store.put_file(name, src / f, checksums[f])
            seconds[how].append(time.perf_counter() - started)
            store.delete(name, list(FILES))
    return {how: total / 1e6 / statistics.median(s) for how, s in seconds.items()}


def training_run(work: Path, tier: RemoteTier | None) -> dict[str, float]:
    cfg = {**TRAINER, "run_dir": str(work)}
    env = {}
    if tier is not None:
        prefix = f"bench/{work.name}"
        cfg.update(remote_url=tier.s3.url(prefix), remote_endpoint=tier.endpoint, upload_drain_s=60)
        env = tier.env
    started = time.perf_counter()
    rc = run_to_end(work, 2, trainer_args(cfg), timeout=600, env=env)
    wall = time.perf_counter() - started
    if rc != 0:
        raise SystemExit(f"training run failed (exit {rc}); see {work / 'torchrun.log'}")
    records = trajectory_records(work)
    steps = [r["step_time_s"] for r in records]
    # The step after a save is where a save, or a hand-off to the uploader, would show up.
    after = [r["step_time_s"] for r in records if r["step"] > 1 and (r["step"] - 1) % TRAINER["ckpt_every_steps"] == 0]
    uploaded = trainer_events(work, "uploaded")
    queued = trainer_events(work, "upload_queued")
    return {"step_s": statistics.median(steps), "step_after_save_s": statistics.median(after), "wall_s": wall,
            "handoff_s": sum(e["stall_s"] for e in queued), "uploads": len(uploaded),
            "upload_s": statistics.median([e["seconds"] for e in uploaded]) if uploaded else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--uploads", type=int, default=5, help="uploads per configuration and round")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "remote_upload.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ckpt-chaos-bench-") as tmp:
        tmp = Path(tmp)
        src = tmp / "ckpt"
        src.mkdir()
        for f, size in FILES.items():
            (src / f).write_bytes(os.urandom(size))
        with RemoteTier(tmp, "bench", proxy=True) as tier:
            os.environ.update(tier.env)
            throughput = {"direct": [], "proxy": []}
            training = {"off": [], "on": []}
            for r in range(args.rounds):
                for how, mbs in upload_round(tier, src, args.uploads, r).items():
                    throughput[how].append(mbs)
                for mode in ("off", "on"):
                    training[mode].append(training_run(tmp / f"train-{mode}-{r}", tier if mode == "on" else None))
                print(f"round {r + 1}/{args.rounds}: direct {throughput['direct'][-1]:.1f} MB/s, proxy "
                      f"{throughput['proxy'][-1]:.1f} MB/s; step {training['off'][-1]['step_s'] * 1000:.0f} ms off, "
                      f"{training['on'][-1]['step_s'] * 1000:.0f} ms on", flush=True)

    def med(rows: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    direct, proxy = statistics.median(throughput["direct"]), statistics.median(throughput["proxy"])
    out = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "rounds": args.rounds, "uploads_per_round": args.uploads, "checkpoint_bytes": sum(FILES.values()),
        "upload_mb_s": {"direct": direct, "proxy": proxy, "proxy_over_direct": proxy / direct},
        "training": {mode: {k: med(rows, k) for k in rows[0]} for mode, rows in training.items()},
    }
    off, on = out["training"]["off"], out["training"]["on"]
    out["training"]["on_over_off"] = {k: on[k] / off[k] for k in ("step_s", "step_after_save_s", "wall_s")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
