"""A small DeepSpeed job, as its documentation writes one: ZeRO stage 2 on the CPU accelerator with
gloo, 2 ranks under torchrun, ``engine.save_checkpoint`` every few steps into ``global_stepN`` (with
its ``latest`` file), ``engine.load_checkpoint`` of what ``latest`` names on start. It knows nothing
of ckpt-chaos.

The data position and every rank's RNG state (dropout draws from it) travel in ``client_state``,
which DeepSpeed keeps in ``mp_rank_00_model_states.pt`` (rank 0's copy, which every rank reads back);
the model, the ZeRO optimizer shards, the LR schedule and the step count are DeepSpeed's own.

    torchrun --nproc-per-node 2 examples/deepspeed/train.py --ckpt-dir /tmp/ckpt --steps 12
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

# Before deepspeed is imported: it picks its accelerator at import. Its first run compiles a
# shared-memory op for the CPU accelerator (about 50 s); the build is kept in the project, not in
# the home folder, for every later run to reuse.
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(__file__).resolve().parents[2] / ".cache" / "torch_extensions"))

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--zero-stage", type=int, default=2, choices=(1, 2))
    return p.parse_args()


def dataset(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    y = x @ torch.randn(16, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def config(args: argparse.Namespace) -> dict:
    return {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        # torch's own AdamW: DeepSpeed's fused CPU Adam would be compiled first
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-3, "warmup_max_lr": 1e-2,
                                                     "warmup_num_steps": 4, "warmup_type": "linear"}},
        "zero_optimization": {"stage": args.zero_stage},
        "steps_per_print": 10**9,
    }


def main() -> None:
    args = parse()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed + rank)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config(args))

    data = dataset(args.samples, args.seed)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    # its own generator: a new epoch's iterator draws a seed from it, not from the RNG that dropout uses
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, generator=torch.Generator().manual_seed(args.seed))

    epoch, skip = 0, 0
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    path, client = engine.load_checkpoint(str(args.ckpt_dir))  # what `latest` names; (None, None) without one
    if path is not None:
        epoch, skip = client["epoch"], client["batch_in_epoch"]
        torch.set_rng_state(client["rng"][rank])
        print(f"rank {rank}: resumed from {path} at step {engine.global_steps}", flush=True)

    step = engine.global_steps
    while step < args.steps:
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if i < skip:
                continue
            loss = nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            step = engine.global_steps
            if step % args.save_every == 0 or step == args.steps:
                rngs = [None] * world
                dist.all_gather_object(rngs, torch.get_rng_state())
                more = i + 1 < len(loader)
                engine.save_checkpoint(str(args.ckpt_dir), tag=f"global_step{step}",
                                       client_state={"epoch": epoch if more else epoch + 1,
                                                     "batch_in_epoch": i + 1 if more else 0, "rng": rngs})
            if step >= args.steps:
                break
        else:
            epoch, skip = epoch + 1, 0
            continue
        break
    if rank == 0:
        print(f"done at step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
