"""A small FSDP2 job saved the torchtitan way: ``fully_shard`` on CPU with gloo, 2 ranks under torchrun;
every few steps ``get_state_dict`` and ``dcp.async_save`` through a ``FileSystemWriter`` into
``step_N/``, on a gloo group of its own, the previous save's future waited for before the next one
starts; on start, ``dcp.load`` and ``set_state_dict`` of the highest ``step_N`` holding DCP's
``.metadata``. It knows nothing of ckpt-chaos.

The data position (epoch, batch in epoch) and every rank's torch RNG state (dropout draws from it)
travel in the checkpoint beside the model and AdamW, as torchtitan keeps its dataloader's state.

    torchrun --nproc-per-node 2 examples/dcp_async/train.py --ckpt-dir /tmp/ckpt --steps 12
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def dataset(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    y = x @ torch.randn(16, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def newest(ckpt_dir: Path) -> Path | None:
    """torchtitan's rule: the highest step_N whose folder holds DCP's .metadata, written last."""
    found = [p for p in ckpt_dir.glob("step_*") if re.fullmatch(r"step_\d+", p.name) and (p / ".metadata").exists()]
    return max(found, key=lambda p: int(p.name[5:]), default=None)


def state(model: nn.Module, opt: torch.optim.Optimizer, train: dict) -> dict:
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd, "train": train}


def main() -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # the same initial model on every rank, then sharded
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
    for layer in (model[0], model[3]):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(args.seed + 1 + rank)  # dropout: a stream a rank

    data = dataset(args.samples, args.seed)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    # its own generator: a new epoch's iterator draws a seed from it, not from the RNG that dropout uses
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, generator=torch.Generator().manual_seed(args.seed))
    # async saves run their collectives in DCP's thread while training runs FSDP's in this one: on one
    # group they would interleave. torchtitan, too, gives its async saves a gloo group of their own
    saver = dist.new_group(backend="gloo")

    step, epoch, skip = 0, 0, 0
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    last = newest(args.ckpt_dir)
    if last is not None:
        # get_state_dict first creates AdamW's state (a step at lr 0), for dcp.load to load into
        train = {"step": 0, "epoch": 0, "batch_in_epoch": 0, "rng": [torch.get_rng_state() for _ in range(world)]}
        sd = state(model, opt, train)
        dcp.load(sd, storage_reader=FileSystemReader(str(last)))
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        train = sd["train"]
        step, epoch, skip = train["step"], train["epoch"], train["batch_in_epoch"]
        torch.set_rng_state(train["rng"][rank])
        print(f"rank {rank}: resumed from {last.name} at step {step}", flush=True)

    pending = None
    while step < args.steps:
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if i < skip:
                continue
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % args.save_every == 0 or step == args.steps:
                rngs = [torch.empty(0, dtype=torch.uint8)] * world
                dist.all_gather_object(rngs, torch.get_rng_state())
                more = i + 1 < len(loader)
                train = {"step": step, "epoch": epoch if more else epoch + 1,
                         "batch_in_epoch": i + 1 if more else 0, "rng": rngs}
                if pending is not None:
                    pending.result()  # torchtitan's _async_wait: one save in flight at a time
                where = args.ckpt_dir / f"step_{step}"
                pending = dcp.async_save(state(model, opt, train), storage_writer=FileSystemWriter(str(where)),
                                         checkpoint_id=str(where), process_group=saver)
            if step >= args.steps:
                break
        else:
            epoch, skip = epoch + 1, 0
            continue
        break
    if pending is not None:
        pending.result()
    if rank == 0:
        print(f"done at step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
