"""A small Ray Train job, as its documentation writes one: a ``TorchTrainer`` with two CPU workers
(gloo), ``FailureConfig(max_failures=2)`` so that Ray itself restarts the worker group when a
worker dies, a ``Checkpoint`` reported every few steps into ``storage_path``, and a resume from
``ray.train.get_checkpoint()``. It knows nothing of ckpt-chaos.

Rank 0 writes the checkpoint (model, AdamW, every rank's RNG state, the data position) into a
temporary folder and reports it, the other ranks report none, as Ray's "Saving checkpoints"
guide shows; Ray copies it into the run's storage folder and keeps it as the latest checkpoint.

    python examples/ray_train/train.py --storage /tmp/ckpt --steps 12
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import psutil
import ray
import ray.train
import torch
import torch.distributed as dist
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer, prepare_model
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def train_loop(cfg: dict) -> None:
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.manual_seed(cfg["seed"] + rank)
    g = torch.Generator().manual_seed(cfg["seed"])
    x = torch.randn(cfg["samples"], 16, generator=g)
    data = TensorDataset(x, x @ torch.randn(16, 1, generator=g) + 0.1 * torch.randn(cfg["samples"], 1, generator=g))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=cfg["seed"], drop_last=True)
    # its own generator: each new iterator (a resume's too) draws a seed from it, not from dropout's RNG
    loader = DataLoader(data, batch_size=cfg["batch"], sampler=sampler, generator=torch.Generator().manual_seed(cfg["seed"]))
    model = prepare_model(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    step, epoch, skip = 0, 0, 0
    checkpoint = ray.train.get_checkpoint()  # the latest reported one, after a restart by Ray
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=False)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"][rank])
        step, epoch, skip = state["step"], state["epoch"], state["batch_in_epoch"]
        print(f"rank {rank}: resumed from {checkpoint.path} at step {step}", flush=True)

    while step < cfg["steps"]:
        sampler.set_epoch(epoch)
        for i, (xb, yb) in enumerate(loader):
            if i < skip:
                continue
            loss = nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % cfg["save_every"] == 0 or step == cfg["steps"]:
                rngs = [None] * world
                dist.all_gather_object(rngs, torch.get_rng_state())
                more = i + 1 < len(loader)
                with tempfile.TemporaryDirectory() as tmp:
                    saved = None
                    if rank == 0:
                        torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "rng": rngs,
                                    "step": step, "epoch": epoch if more else epoch + 1,
                                    "batch_in_epoch": i + 1 if more else 0}, os.path.join(tmp, "state.pt"))
                        saved = Checkpoint.from_directory(tmp)
                    # named by its step, not Ray's default timestamp: the same folder in every run
                    ray.train.report({"step": step, "loss": loss.item()}, checkpoint=saved,
                                     checkpoint_dir_name=f"checkpoint_{step:06d}")
            if step >= cfg["steps"]:
                return
        epoch, skip = epoch + 1, 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--storage", type=Path, required=True, help="RunConfig.storage_path")
    p.add_argument("--ray-temp", type=Path, help="Ray's session folder (default: beside --storage)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--batch", type=int, default=8, help="per worker")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-failures", type=int, default=2)
    args = p.parse_args()
    temp = (args.ray_temp or args.storage.parent / "ray").resolve()
    temp.mkdir(parents=True, exist_ok=True)
    if len(str(temp)) > 40:  # Ray's unix sockets live in its session folder, and a socket's path has 107 bytes
        link = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp")) / "t"
        link.symlink_to(temp)
        temp = link
    for tries in (1, 2, 3):
        try:
            ray.init(num_cpus=2, _temp_dir=str(temp), include_dashboard=False)
            break
        except Exception as e:
            # Ray waits a fixed 30 s for its raylet to register (ray/_private/node.py:428), which a loaded
            # 2-core machine can outlast: stop what it started and start again
            if "timed out during startup" not in str(e) or tries == 3:
                raise
            print(f"ray.init failed ({e}); starting Ray again", flush=True)
            for child in psutil.Process().children(recursive=True):
                child.kill()
    trainer = TorchTrainer(
        train_loop, train_loop_config={k: getattr(args, k) for k in ("steps", "save_every", "samples", "batch", "seed")},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(name="run", storage_path=str(args.storage.resolve()),
                             failure_config=FailureConfig(max_failures=args.max_failures)))
    try:
        result = trainer.fit()
        print(f"done: {result.metrics}, checkpoint {result.checkpoint.path if result.checkpoint else None}", flush=True)
    finally:
        ray.shutdown()
        if temp.is_symlink():
            shutil.rmtree(temp.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
