"""A DDP loop that checkpoints in torchtitan's idiom: ``get_state_dict(model, opt)`` → ``dcp.async_save``
into ``step_N/`` (the previous save awaited before the next one starts), and on resume
``get_state_dict`` → ``dcp.load`` → ``set_state_dict`` from the newest ``step_N`` whose ``.metadata``
was written, the step taken from the folder's name. ``get_state_dict`` of a fresh optimizer creates
its state with a zero-learning-rate ``optimizer.step()`` before the load. A correct resume.

    torchrun --nproc-per-node 2 tests/trainers/dcp_get_state_dict.py --ckpt-dir /tmp/ckpt
"""

import argparse
import re
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--ckpt-dir", type=Path, required=True)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--save-every", type=int, default=4)
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
saver_pg = dist.new_group(backend="gloo")  # the background save's collectives, apart from training's
torch.manual_seed(0)
g = torch.Generator().manual_seed(0)
x = torch.randn(96, 8, generator=g)
data = TensorDataset(x, x.sum(1, keepdim=True))
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
loader = DataLoader(data, batch_size=8, sampler=sampler, generator=torch.Generator().manual_seed(0))

step, per_epoch = 0, len(loader)
done = [int(m.group(1)) for d in args.ckpt_dir.glob("step_*") if (m := re.fullmatch(r"step_(\d+)", d.name))
        and (d / ".metadata").exists()] if args.ckpt_dir.exists() else []
if done:
    step = max(done)
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(args.ckpt_dir / f"step_{step}"))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    print(f"rank {rank}: resumed from step_{step} at step {step}", flush=True)

pending = None
while step < args.steps:
    epoch, skip = divmod(step, per_epoch)
    sampler.set_epoch(epoch)
    for i, (xb, yb) in enumerate(loader):
        if i < skip:
            continue
        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % args.save_every == 0:
            if pending is not None:
                pending.result()
            model_sd, optim_sd = get_state_dict(model, opt)
            pending = dcp.async_save({"model": model_sd, "optim": optim_sd},
                                     checkpoint_id=str(args.ckpt_dir / f"step_{step}"), process_group=saver_pg)
        if step >= args.steps:
            break
if pending is not None:
    pending.result()
dist.destroy_process_group()
