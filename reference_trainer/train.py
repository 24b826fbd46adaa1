"""The training loop: FSDP2 over a small GPT, complete checkpoints, resume, preemption.

Run it under the elastic launcher::

    torchrun --nproc_per_node 4 -m reference_trainer --run-dir runs/demo --max-steps 40

Outputs, under ``run_dir`` (rank 0 writes them):

* ``trajectory.jsonl``: one record per optimizer step (loss and grad norm also as exact float
  hex, LR, tokens seen, a digest of the global batch's sample ids, optional state digest);
* ``events.jsonl``: saves, commits, loads (with per-component state digests), rejections;
* ``final_state.json``: per-component digests of the final state.

A restarted process appends to the same files; readers keep the last record of each step.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from ckpt_chaos import probe

from .checkpoint import CheckpointManager, corrupt_file
from .config import ConfigError, TrainConfig, resume_mismatches
from .data import build_loader
from .model import GPT, loss_fn
from .state import (TrainState, component_digests, digest, float_hex, init_optimizer_state, load_checkpoint,
                    model_optimizer_digest, seed_rank_rng)

PROCESS_ID = uuid.uuid4().hex[:8]


class JsonlLog:
    """Append-only JSON-lines file, written by rank 0 only, flushed after every record."""

    def __init__(self, path: Path, enabled: bool):
        self._f = None
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(path, "a", buffering=1)

    def write(self, record: dict) -> None:
        if self._f is not None:
            self._f.write(json.dumps(record, sort_keys=True) + "\n")
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()


def lr_factor(cfg: TrainConfig):
    """Linear warm-up to ``lr``, then cosine decay to ``min_lr`` at ``max_steps``."""
    floor = cfg.min_lr / cfg.lr

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


class _Signals:
    sigterm = False
    reported = False
    at: float | None = None  # time.monotonic() of the first SIGTERM: the grace period runs from it


def _on_sigterm(signum, frame) -> None:
    # Signal context: only set a flag; the loop acts on it at the next micro-batch boundary.
    if _Signals.at is None:
        _Signals.at = time.monotonic()
    _Signals.sigterm = True


def init_distributed(cfg: TrainConfig) -> tuple[int, int, torch.device]:
    if "WORLD_SIZE" not in os.environ:  # plain `python -m reference_trainer`: a one-rank job
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl"  # gloo for DCP's CPU-side collectives and async saves
    else:
        device, backend = torch.device("cpu"), "gloo"
    timeout = timedelta(seconds=cfg.collective_timeout_s)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun keeps one store across its restarts (--max-restarts) and, in torch 2.13, workers
        # of a restarted group read their peers' addresses under the same keys as the dead group:
        # gloo then connects to stale ports ("Connection refused"). A prefix per restart fixes it.
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
        base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                             timeout=timeout)
        store = dist.PrefixStore(f"reference_trainer/restart_{restart}", base)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    else:
        dist.init_process_group(backend, timeout=timeout)
    return dist.get_rank(), dist.get_world_size(), device


def build_state(cfg: TrainConfig, rank: int, world_size: int, device: torch.device) -> TrainState:
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank before sharding
    model = GPT(cfg).to(device)
    mesh = init_device_mesh(device.type, (world_size,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if cfg.bf16 else None)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    # fused: one kernel per parameter group instead of a DTensor dispatch per op and parameter; on
    # the CPU that takes about an eighth off a step (docs/benchmarks.md).
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                  weight_decay=cfg.weight_decay, fused=True)
    init_optimizer_state(optimizer)  # so a checkpoint before the first step has the optimizer's keys too
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg))
    loader, sampler = build_loader(cfg, rank, world_size)
    seed_rank_rng(cfg.seed, rank)
    return TrainState(cfg, rank, world_size, model, optimizer, scheduler, loader, sampler)


def _gather_ids(local: list[torch.Tensor], world_size: int) -> list[int]:
    """Sample ids of this step's micro-batches from every rank, in global stream order."""
    if not local:
        return []
    mine = torch.stack(local)  # [micro, per-rank batch]
    parts = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(parts, mine)
    ordered = torch.stack(parts, dim=1)  # [micro, rank, per-rank batch]
    return [int(i) for i in ordered.flatten()]


class Trainer:
    def __init__(self, cfg: TrainConfig, rank: int, world_size: int, device: torch.device):
        self.cfg, self.rank, self.world_size, self.device = cfg, rank, world_size, device
        run_dir = Path(cfg.run_dir)
        self.trajectory = JsonlLog(run_dir / "trajectory.jsonl", rank == 0)
        self.events = JsonlLog(run_dir / "events.jsonl", rank == 0)
        # The launch this process belongs to: a relaunch by an orchestrator (the harness sets
        # CKPT_CHAOS_ATTEMPT) or a restart by torchrun; the same count the probe reports.
        self.attempt = (int(os.environ.get("CKPT_CHAOS_ATTEMPT", "0"))
                        + int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
        self.ts = build_state(cfg, rank, world_size, device)
        async_group = dist.new_group(backend="gloo") if cfg.async_save else None
        # rank 0 waits up to UPLOADER_READY_S for its uploader after the resume; its peers wait with it
        # in a barrier of this group, whose timeout outlasts that wait, not in the first step's collective
        self.uploader_wait = None
        if cfg.remote_url and world_size > 1:
            from .remote import UPLOADER_READY_S

            self.uploader_wait = dist.new_group(
                backend="gloo", timeout=timedelta(seconds=UPLOADER_READY_S + cfg.collective_timeout_s))
        self.ckpt = CheckpointManager(cfg, rank, world_size, self.log, async_group)
        self.local_ids: list[torch.Tensor] = []
        self.upload_drain_s = cfg.upload_drain_s  # how long the last upload may take after training
        self.step_loss = torch.zeros((), dtype=torch.float32)

    def log(self, event: str, **fields) -> None:
        self.events.write({"event": event, "t": time.time(), "process": PROCESS_ID, "attempt": self.attempt,
                           "world_size": self.world_size, **fields})

    # -- resume ------------------------------------------------------------------------------------

    def resume(self) -> None:
        rejected: list[tuple[str, str]] = []
        corrupt_copies: set[tuple[str, bool]] = set()  # (name, restored) of each copy whose load found it corrupt
        touched = False  # a load failed verification after copying some tensors into the state
        while True:
            started = time.perf_counter()
            choice = self.ckpt.choose()
            choose_s = time.perf_counter() - started  # the manifests, sizes and .metadata checksums
            rejected += choice.rejected
            if choice.path is None:
                if touched:
                    self.ts = build_state(self.cfg, self.rank, self.world_size, self.device)
                self.ckpt.resumed()
                self.log("fresh_start", rejected=rejected)
                return
            if (choice.path.name, choice.restored) in corrupt_copies:
                # the same copy offered again (the remote tier's, downloaded anew): never loop. A local
                # copy found corrupt is replaced by the remote tier's, which is another copy.
                self.log("load_failed", name=choice.path.name, error="offered again after it failed its load")
                raise RuntimeError(f"{choice.path.name} was offered again after it failed verification on load")
            manifest = choice.manifest
            mismatches = resume_mismatches(manifest["config"], self.cfg)
            if mismatches:
                raise ConfigError(f"cannot resume from {choice.path}: incompatible config: {'; '.join(mismatches)}")
            probe.point("load.begin", name=choice.path.name, step=manifest["step"], micro=manifest["micro"])
            started = time.perf_counter()
            try:
                load_checkpoint(self.ts, choice.path, manifest["world_size"], has_grads=manifest["micro"] > 0,
                                reader=self.ckpt.reader(choice))
            except BaseException as e:  # DCP's CheckpointException is a BaseException
                corrupt = corrupt_file(e)
                if corrupt is not None:  # found while reading it: as if validation had rejected it
                    self.ckpt.reject(choice.path, corrupt)
                    rejected.append((choice.path.name, corrupt))
                    corrupt_copies.add((choice.path.name, choice.restored))
                    touched = True
                    continue
                # A checkpoint that validated but cannot be read (an I/O error): say so, and exit non-zero
                # so that the orchestrator restarts the job, which validates from scratch again.
                self.log("load_failed", name=choice.path.name, error=f"{type(e).__name__}: {e}"[:2000])
                raise
            break
        load_s = time.perf_counter() - started  # the shards read, verified and loaded
        self.ckpt.resumed()
        digests = component_digests(self.ts) if self.cfg.record_digests else None
        self.step_loss = torch.tensor(self.ts.progress.partial_loss, dtype=torch.float32)
        self.log("loaded", name=choice.path.name, step=manifest["step"], micro=manifest["micro"],
                 saved_world_size=manifest["world_size"], choose_s=choose_s, load_s=load_s, digests=digests,
                 saved_digests=manifest.get("digests"), rejected=rejected, latest_hint=choice.latest_hint)
        probe.point("load.end", name=choice.path.name, step=manifest["step"], micro=manifest["micro"])

    # -- one micro-batch and one optimizer step ------------------------------------------------------

    def micro_batch(self, batch: dict) -> torch.Tensor:
        tokens = batch["tokens"].to(self.device)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.bf16):
            loss = loss_fn(self.ts.model(tokens), tokens)
        (loss / self.cfg.grad_accum).backward()
        self.local_ids.append(batch["id"])
        return loss.detach().float()

    def fold_partial_step(self) -> None:
        """Move this step's progress so far into the (global) progress, before a mid-step save."""
        p = self.ts.progress
        p.partial_ids = p.partial_ids + _gather_ids(self.local_ids, self.world_size)
        p.partial_loss = self.step_loss.item()
        self.local_ids = []

    def optimizer_step(self) -> dict:
        ts, cfg, p = self.ts, self.cfg, self.ts.progress
        self.ckpt.wait_staged()  # the step changes tensors that an async save may still be copying
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(ts.model.parameters(), max_norm)
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        lr = ts.scheduler.get_last_lr()[0]
        ts.optimizer.step()
        ts.scheduler.step()
        ts.optimizer.zero_grad(set_to_none=True)
        ids = p.partial_ids + _gather_ids(self.local_ids, self.world_size)
        loss = self.step_loss.item()
        p.step += 1
        p.micro = 0
        p.tokens_seen += cfg.global_batch * cfg.seq_len
        p.best_loss = min(p.best_loss, loss)
        p.partial_loss, p.partial_ids, self.local_ids = 0.0, [], []
        self.step_loss = torch.zeros((), dtype=torch.float32)
        record = {
            "step": p.step, "epoch": ts.sampler.epoch(), "loss": loss, "loss_hex": float_hex(loss),
            "grad_norm": norm.item(), "grad_norm_hex": float_hex(norm.item()), "lr": lr, "lr_hex": float_hex(lr),
            "tokens_seen": p.tokens_seen, "batch_digest": digest(ids), "first_sample": ids[0],
            "attempt": self.attempt, "process": PROCESS_ID, "world_size": self.world_size, "t": time.time(),
        }
        if (cfg.digest_every and p.step % cfg.digest_every == 0) or p.step == cfg.max_steps:
            record["state_digest"] = model_optimizer_digest(ts)
        return record

    # -- the loop ------------------------------------------------------------------------------------

    def run(self) -> int:
        cfg = self.cfg
        probe.point("train.start", world_size=self.world_size, attempt=self.attempt)
        self.resume()
        if self.uploader_wait is not None:
            dist.barrier(group=self.uploader_wait)
        ts = self.ts  # built afresh by resume if a load failed and nothing else could be loaded
        p = ts.progress
        data = iter(ts.loader)
        last_time_save = time.monotonic()
        step_started = time.perf_counter()
        while p.step < cfg.max_steps:
            if p.micro == 0:
                probe.point("step.begin", step=p.step + 1)
                step_started = time.perf_counter()
            loss = self.micro_batch(next(data))
            p.micro += 1
            p.microbatches += 1
            probe.point("microstep.end", step=p.step + 1, micro=p.micro)
            if _Signals.sigterm and not _Signals.reported:
                _Signals.reported = True
                probe.point("sigterm.received", step=p.step + 1, micro=p.micro)
            step_done = p.micro == cfg.grad_accum
            time_due = (step_done and self.rank == 0 and cfg.ckpt_every_seconds > 0
                        and time.monotonic() - last_time_save >= cfg.ckpt_every_seconds)
            stop_here = cfg.stop_after_microbatches > 0 and p.microbatches == cfg.stop_after_microbatches
            # One collective per micro-batch: the job's mean loss, and whether any rank must stop.
            ctl = torch.tensor([loss.item(), float(_Signals.sigterm), float(stop_here), float(time_due)],
                               dtype=torch.float32, device=self.device)
            dist.all_reduce(ctl)
            ctl = ctl.cpu()
            self.step_loss += (ctl[0] / self.world_size) / cfg.grad_accum
            if step_done:
                record = self.optimizer_step()
                if cfg.step_delay_s > 0:
                    time.sleep(cfg.step_delay_s)
                record["step_time_s"] = time.perf_counter() - step_started
                self.trajectory.write(record)
                probe.point("step.end", step=p.step, loss_hex=record["loss_hex"])
                cadence = cfg.ckpt_every_steps > 0 and p.step % cfg.ckpt_every_steps == 0
                if cadence or ctl[3] > 0 or p.step == cfg.max_steps:
                    self.ckpt.save(ts, "final" if p.step == cfg.max_steps else "cadence", loss=record["loss"])
                    last_time_save = time.monotonic()
            self.ckpt.poll()
            if ctl[1] > 0 or ctl[2] > 0:
                reason = "preempt" if ctl[1] > 0 else "stop"
                if reason == "preempt":
                    probe.point("sigterm.agreed", step=p.step, micro=p.micro)
                return self.save_and_exit(reason)
        self.ckpt.wait()
        self.finish()
        return 0

    def save_and_exit(self, reason: str) -> int:
        """Emergency/planned stop: a blocking checkpoint at this exact position, then exit 0."""
        started = time.perf_counter()
        signalled = _Signals.at if reason == "preempt" and _Signals.at is not None else time.monotonic()
        p = self.ts.progress
        self.ckpt.wait()
        if self.ckpt.last_saved != (p.step, p.micro):
            if p.micro:
                self.fold_partial_step()
            self.ckpt.save(self.ts, reason, blocking=True)
        elapsed = time.perf_counter() - started
        # What is left of the grace period goes to the uploader (the emergency checkpoint's way off the
        # node): the period runs from the SIGTERM, and the ranks may first have finished a step and a
        # cadence save before they agreed to stop.
        used = time.monotonic() - signalled
        self.upload_drain_s = min(self.cfg.upload_drain_s, self.cfg.preempt_grace_s - used - 1.0)
        self.log("stopped", reason=reason, step=p.step, micro=p.micro, save_s=elapsed, since_signal_s=used,
                 grace_s=self.cfg.preempt_grace_s)
        if reason == "preempt" and used > self.cfg.preempt_grace_s:
            print(f"[reference_trainer] WARNING: emergency save ended {used:.1f}s after SIGTERM, over the "
                  f"{self.cfg.preempt_grace_s}s grace period", flush=True)
        probe.point("train.end", reason=reason, step=p.step, micro=p.micro)
        return 0

    def finish(self) -> None:
        digests = component_digests(self.ts)
        final = model_optimizer_digest(self.ts)
        if self.rank == 0:
            out = {"step": self.ts.progress.step, "state_digest": final, "digests": digests}
            (Path(self.cfg.run_dir) / "final_state.json").write_text(json.dumps(out, indent=1, sort_keys=True))
        self.log("finished", step=self.ts.progress.step)
        probe.point("train.end", reason="done", step=self.ts.progress.step)


def train(cfg: TrainConfig) -> int:
    """Entry point for one rank. Validates the config before any process group starts."""
    cfg.validate(int(os.environ.get("WORLD_SIZE", "1")))
    torch.set_num_threads(cfg.threads)
    signal.signal(signal.SIGTERM, _on_sigterm)
    rank, world_size, device = init_distributed(cfg)
    try:
        trainer = Trainer(cfg, rank, world_size, device)
        rc = trainer.run()
        dist.barrier()  # no rank leaves while a peer still talks to it
        # After the barrier: the peers are done, so waiting for the uploader trips no collective timeout.
        trainer.ckpt.close(trainer.upload_drain_s)
    except BaseException:
        if dist.is_initialized():
            dist.destroy_process_group()
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    # Success: no collective is left. The process group is not destroyed: gloo's teardown can abort
    # the process after the work is done (pytorch/pytorch#190489); the caller leaves with os._exit.
    return rc
