"""What a checkpoint holds, and how each part is captured, restored and fingerprinted.

A complete checkpoint is one DCP state dict:

* ``model``, ``optim``: FSDP2 sharded state through ``get_state_dict`` (reshardable);
* ``grads``: the accumulated sharded gradients, only for a checkpoint taken in the middle of a
  gradient-accumulation cycle (an emergency save lands on any micro-batch boundary);
* ``meta``: the same on every rank: progress counters, LR scheduler (the config is the manifest's,
  which a resume compares with its own before loading anything);
* ``rank<r>``: one per rank: every RNG stream and the data-loader state.

Per-rank parts are keyed by rank because DCP keeps one copy of a non-tensor value per key.
World-size change rule (see README): the loader state is expressed in global stream positions,
so every new rank restores rank 0's loader state; RNG streams belong to a rank's slice of the
data and have no counterpart at another world size, so they are derived afresh from
(seed, step, rank) and the resumed run is itself reproducible.

Each restore step is a separate function on purpose: the planted-bug tests replace one of them
(forget the RNG, the loader, the optimizer) and show that the harness notices.
"""

from __future__ import annotations

import hashlib
import math
import pickle
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor


@dataclass
class Progress:
    """Counters that say where training is; saved in ``meta``."""

    step: int = 0  # optimizer steps completed
    micro: int = 0  # micro-batches already done inside the next step (0 at a step boundary)
    microbatches: int = 0  # micro-batches processed since the start of training
    tokens_seen: int = 0
    best_loss: float = math.inf
    partial_loss: float = 0.0  # loss accumulated by the unfinished step (exact fp32 value)
    partial_ids: list[int] = field(default_factory=list)  # its sample ids so far, global order


@dataclass
class TrainState:
    """Everything the loop mutates; one object so capture and restore see the same parts."""

    cfg: Any
    rank: int
    world_size: int
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loader: Any
    sampler: Any
    progress: Progress = field(default_factory=Progress)


def init_optimizer_state(optimizer: torch.optim.AdamW) -> None:
    """Create AdamW's per-parameter state now, exactly as its first step would (step 0, zero moments).

    AdamW creates its state lazily at the first ``step()``, and torch's ``get_state_dict`` fills a
    stateless optimizer by taking a step with lr 0 (leaving the step count at 1), but only when no
    gradients exist. So a checkpoint taken before the first optimizer step held no optimizer state
    when taken mid-accumulation, and a resume from it failed with "Missing key in checkpoint
    state_dict: optim.state..." (found by ``ckpt-chaos explore``: a SIGTERM one micro-batch into
    step 1). With the state made up front, every checkpoint has the same keys and the first step
    is bit-identical to a lazily initialized one (tests/test_reference_trainer_state.py)."""
    if not isinstance(optimizer, torch.optim.AdamW):
        raise TypeError(f"init_optimizer_state knows AdamW's state, not {type(optimizer).__name__}'s")
    scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32  # as AdamW's own
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state[param]
            if state:
                continue
            state["step"] = (torch.zeros((), dtype=torch.float32, device=param.device)
                             if group["capturable"] or group["fused"] else torch.tensor(0.0, dtype=scalar, device="cpu"))
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)


# ---- RNG -------------------------------------------------------------------------------

def seed_rank_rng(seed: int, rank: int, step: int = 0) -> None:
    """Seed every RNG stream of this rank from (seed, step, rank)."""
    s = (seed * 1_000_003 + step * 10_007 + rank) % (2**31)
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)


def capture_rng() -> dict:
    np_state = np.random.get_state(legacy=False)
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"bit_generator": np_state["bit_generator"], "key": np_state["state"]["key"].tolist(),
                  "pos": np_state["state"]["pos"], "has_gauss": np_state["has_gauss"],
                  "gauss": np_state["gauss"]},
        "python": random.getstate(),
    }


def restore_rng(rng: dict) -> None:
    torch.set_rng_state(rng["torch"])
    if torch.cuda.is_available() and rng["cuda"]:
        torch.cuda.set_rng_state_all(rng["cuda"])
    n = rng["numpy"]
    np.random.set_state({"bit_generator": n["bit_generator"],
                         "state": {"key": np.array(n["key"], dtype=np.uint32), "pos": n["pos"]},
                         "has_gauss": n["has_gauss"], "gauss": n["gauss"]})
    random.setstate(rng["python"])


# ---- capture -----------------------------------------------------------------------------

def _blob(obj: Any) -> bytes:
    return pickle.dumps(obj)


def _unblob(data: bytes) -> Any:
    return pickle.loads(data)


def rank_state(ts: TrainState) -> dict:
    return {"rng": capture_rng(), "loader": ts.loader.state_dict()}


def meta_state(ts: TrainState) -> dict:
    return {"progress": asdict(ts.progress), "scheduler": ts.scheduler.state_dict()}


def checkpoint_state(ts: TrainState) -> dict:
    """The DCP state dict of a complete checkpoint at the current position."""
    model_sd, optim_sd = get_state_dict(ts.model, ts.optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd, "meta": _blob(meta_state(ts)),
                             f"rank{ts.rank}": _blob(rank_state(ts))}
    if ts.progress.micro:
        state["grads"] = {name: p.grad for name, p in ts.model.named_parameters()}
    return state


# ---- restore -----------------------------------------------------------------------------

def restore_model_and_optimizer(ts: TrainState, model_sd: dict, optim_sd: dict) -> None:
    set_state_dict(ts.model, ts.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)


def restore_loader(ts: TrainState, loader_state: dict) -> None:
    ts.loader.load_state_dict(loader_state)


def restore_rank_rng(ts: TrainState, rng: dict | None) -> None:
    """Restore this rank's saved streams, or derive new ones after a world-size change."""
    if rng is None:
        seed_rank_rng(ts.cfg.seed, ts.rank, ts.progress.step)
    else:
        restore_rng(rng)


def restore_meta(ts: TrainState, meta: dict) -> None:
    ts.progress = Progress(**meta["progress"])
    ts.scheduler.load_state_dict(meta["scheduler"])


def load_checkpoint(ts: TrainState, path: Path, saved_world_size: int, has_grads: bool,
                    reader: dcp.StorageReader | None = None) -> None:
    """Load a validated checkpoint directory into ``ts`` (collective: every rank calls it);
    ``reader``: DCP's storage reader for it (default: DCP's own)."""
    same_world = saved_world_size == ts.world_size
    rank_key = f"rank{ts.rank}" if same_world else "rank0"
    model_sd, optim_sd = get_state_dict(ts.model, ts.optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd, "meta": b"", rank_key: b""}
    if has_grads:
        state["grads"] = {name: torch.zeros_like(p) for name, p in ts.model.named_parameters()}
    dcp.load(state, checkpoint_id=str(path), storage_reader=reader)

    restore_model_and_optimizer(ts, state["model"], state["optim"])
    restore_meta(ts, _unblob(state["meta"]))
    per_rank = _unblob(state[rank_key])
    restore_loader(ts, per_rank["loader"])
    restore_rank_rng(ts, per_rank["rng"] if same_world else None)
    if has_grads:
        for name, p in ts.model.named_parameters():
            p.grad = state["grads"][name]


# ---- digests -----------------------------------------------------------------------------

def _hash_tree(obj: Any, h: "hashlib._Hash") -> None:
    """Feed a nested structure of tensors and plain values into a hash, in a stable order."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            h.update(f"K{k}".encode())
            _hash_tree(obj[k], h)
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}".encode())
        for v in obj:
            _hash_tree(v, h)
    elif isinstance(obj, float):
        h.update(f"F{obj.hex()}".encode())
    else:
        h.update(f"V{obj!r}".encode())


def digest(obj: Any) -> str:
    h = hashlib.sha256()
    _hash_tree(obj, h)
    return h.hexdigest()[:16]


def _row_sharded(t: Any) -> bool:
    return (isinstance(t, DTensor) and t.device_mesh.ndim == 1
            and all(p.is_shard() and p.dim == 0 for p in t.placements))


def _gathered(tree: Any) -> Any:
    """``tree`` with every DTensor in it made whole; collective.

    The dim-0-sharded ones (FSDP2's) are gathered with the classic c10d ``all_gather``:
    ``DTensor.full_tensor`` and ``get_*_state_dict(full_state_dict=True)`` gather through
    functional collectives, which under gloo in torch 2.13 now and then segfault a rank; the list
    form of ``all_gather`` does not. FSDP2 shards dim 0 the way ``torch.chunk`` does, so each rank
    pads its piece to the chunk size and the gathered rows are trimmed back. They travel in one
    ``all_gather`` per dtype, not one per tensor: on gloo each collective is a round trip between
    every pair of ranks, and a model and its optimizer state hold dozens of tensors. Every rank
    walks the same tree in the same order, so each packs its padded pieces at the same offsets."""
    batched: list[DTensor] = []

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if _row_sharded(x):
            batched.append(x)
            return _Pending(len(batched) - 1)
        return x.full_tensor() if isinstance(x, DTensor) else x

    shaped = walk(tree)
    whole: list[torch.Tensor | None] = [None] * len(batched)
    by_dtype: dict[tuple[torch.dtype, Any], list[int]] = {}
    for i, t in enumerate(batched):
        by_dtype.setdefault((t.dtype, t.device_mesh.get_group()), []).append(i)
    for (dtype, group), members in by_dtype.items():
        world = batched[members[0]].device_mesh.size()
        pieces, spans = [], []
        for i in members:
            t = batched[i]
            rows = t.shape[0]
            chunk = -(-rows // world) if rows else 0
            local = t.to_local().detach().contiguous()
            padded = local.new_zeros((chunk, *t.shape[1:]))
            padded[: local.shape[0]] = local
            pieces.append(padded.reshape(-1))
            spans.append((chunk, padded.numel()))
        flat = torch.cat(pieces)
        parts = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(parts, flat, group=group)
        offset = 0
        for i, (chunk, numel) in zip(members, spans):
            t = batched[i]
            rows = [part[offset:offset + numel].reshape(chunk, *t.shape[1:]) for part in parts]
            whole[i] = torch.cat(rows)[: t.shape[0]]
            offset += numel

    def fill(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: fill(v) for k, v in x.items()}
        if isinstance(x, list):
            return [fill(v) for v in x]
        return whole[x.index] if isinstance(x, _Pending) else x

    return fill(shaped)


@dataclass(frozen=True)
class _Pending:
    """Where a batched tensor goes back into the tree."""

    index: int


def _full_model_and_optimizer(ts: TrainState) -> tuple[dict[str, Any], dict[str, Any]]:
    """Full (world-size independent) model and optimizer state dicts; collective."""
    whole = _gathered({"model": get_model_state_dict(ts.model),
                       "optim": get_optimizer_state_dict(ts.model, ts.optimizer)})
    return whole["model"], whole["optim"]


def model_optimizer_digest(ts: TrainState) -> str | None:
    """Digest of the full (gathered) model and optimizer state; collective, value on rank 0."""
    model_sd, optim_sd = _full_model_and_optimizer(ts)
    return digest({"model": model_sd, "optim": optim_sd}) if ts.rank == 0 else None


def component_digests(ts: TrainState) -> dict[str, str] | None:
    """Per-component digests of the whole job's state; collective, the dict on rank 0.

    Model, optimizer and gradients are gathered to full tensors, so their digests do not depend
    on the world size. The loader digest is over the distinct per-rank loader states (equal on
    all ranks by design), so it too survives a world-size change; RNG streams are per rank.
    """
    model_sd, optim_sd = _full_model_and_optimizer(ts)
    grads = None
    if ts.progress.micro:
        grads = _gathered({n: p.grad for n, p in ts.model.named_parameters()})
    local = {"rng": digest(capture_rng()), "loader": digest(ts.loader.state_dict())}
    gathered: list[Any] = [None] * ts.world_size
    dist.all_gather_object(gathered, local)
    if ts.rank != 0:
        return None
    progress = asdict(ts.progress)
    out = {
        "model": digest(model_sd),
        "optimizer": digest(optim_sd),
        "scheduler": digest(ts.scheduler.state_dict()),
        "counters": digest({k: progress[k] for k in ("step", "micro", "microbatches", "tokens_seen")}),
        "dataloader": digest(sorted({g["loader"] for g in gathered})),
        "rng": digest([g["rng"] for g in gathered]),
    }
    if grads is not None:
        out["grads"] = digest(grads)
    return out


def float_hex(x: float) -> str:
    return float(x).hex()


