"""How a checkpoint reaches the disk: atomic commit, validation, resume choice, retention.

Layout of the checkpoint directory::

    step_00000020/          committed checkpoint: DCP files + manifest.json
    step_00000023.001/      emergency checkpoint taken 1 micro-batch into step 24
    latest                  name of the newest committed checkpoint (a hint for tools)
    .tmp-step_00000030/     a save in progress (removed on start if a crash left it)
    .trash-step_00000010/   a checkpoint being deleted by retention (removed on start)
    rejected/step_00000030/ a checkpoint that failed validation, kept for post-mortem

A save goes: DCP writes every rank's shard into ``.tmp-<name>`` and rank 0 writes ``.metadata``;
rank 0 then fsyncs every file and the directory, writes ``manifest.json`` (file list, sizes,
SHA-256, step, world size, config hash) and fsyncs it, renames the directory to ``<name>``,
fsyncs the parent, and only then moves ``latest`` (temporary file, fsync, rename, fsync).
A crash at any instant leaves the old or the new checkpoint as the newest valid one: a name
``step_*`` exists only after its manifest is durable, and the resume choice trusts nothing
that does not validate.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter

from ckpt_chaos import probe

from ckpt_chaos.probe.layout import (  # noqa: F401  (re-exported: the directory layout is part of this module's API)
    MANIFEST, LATEST, TMP_PREFIX, TRASH_PREFIX, REJECTED, FORMAT,
    ResumeChoice, checkpoint_name, choose_resume, describe, fsync_path, list_checkpoints,
    parse_name, quarantine, read_manifest, remove_tree, sha256_file, validate,
    write_durably,
)
from .state import TrainState, checkpoint_state, component_digests


class SaveFailed(RuntimeError):
    """A save failed and the trainer's policy is to stop."""


# ---- writing with probe points ----------------------------------------------------------------

class _ProbedStream:
    """A file stream that reports each tenth of the planned shard bytes to the probe."""

    def __init__(self, raw, name: str, planned: int):
        self._raw, self._name, self._planned = raw, name, max(planned, 1)
        self._written, self._next_tenth = 0, 1

    def write(self, data) -> int:
        n = self._raw.write(data)
        self._written += len(data)
        while self._next_tenth <= 10 and self._written * 10 >= self._planned * self._next_tenth:
            probe.point("ckpt.shard.write", file=self._name, bytes=self._written,
                        planned=self._planned, fraction=self._next_tenth / 10)
            self._next_tenth += 1
        return n

    def __getattr__(self, item):
        return getattr(self._raw, item)


class _ProbedFileSystem(FileSystem):
    def __init__(self, planned: int):
        super().__init__()
        self.planned = planned

    @contextmanager
    def create_stream(self, path, mode):
        with super().create_stream(path, mode) as raw:
            if "w" not in mode:
                yield raw
                return
            yield _ProbedStream(raw, Path(path).name, self.planned)
        if "w" in mode:
            probe.point("ckpt.shard.done", file=Path(path).name, bytes=Path(path).stat().st_size)


class ProbedWriter(FileSystemWriter):
    """DCP's FileSystemWriter, reporting shard progress and the metadata write to the probe."""

    def write_data(self, plan, planner):
        planned = 0
        for item in plan.items:
            if item.tensor_data is not None:
                numel = 1
                for s in item.tensor_data.chunk.sizes:
                    numel *= s
                planned += numel * torch.empty((), dtype=item.tensor_data.properties.dtype).element_size()
        self.fs = _ProbedFileSystem(planned)
        return super().write_data(plan, planner)

    def finish(self, metadata, results) -> None:
        super().finish(metadata, results)
        probe.point("ckpt.metadata", path=str(self.path))


# ---- the manager ----------------------------------------------------------------------------

@dataclass
class _Pending:
    future: Future
    name: str
    progress: dict
    loss: float | None
    digests: dict | None
    started: float
    stall_s: float


class CheckpointManager:
    """Saves, commits, validates and prunes checkpoints for one training job."""

    def __init__(self, cfg, rank: int, world_size: int, log: Callable[..., None],
                 async_group: dist.ProcessGroup | None = None):
        self.cfg, self.rank, self.world_size, self.log = cfg, rank, world_size, log
        self.root = cfg.checkpoint_dir
        self.async_group = async_group
        self.pending: _Pending | None = None
        self.last_saved: tuple[int, int] | None = None  # position of the newest committed save
        self.uploads = None  # the remote tier's uploader (rank 0, when remote_url is set)
        if cfg.remote_url and rank == 0:
            from .remote import UploadQueue

            self.uploads = UploadQueue(cfg, log)

    # -- start-up --------------------------------------------------------------------------

    def clean_strays(self) -> None:
        """Remove what a crash left behind: unfinished saves and unfinished deletions (rank 0)."""
        self.root.mkdir(parents=True, exist_ok=True)
        for p in self.root.iterdir():
            if p.name.startswith((TMP_PREFIX, TRASH_PREFIX)) or p.name == LATEST + ".tmp":
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
                self.log("stray_removed", name=p.name)
        fsync_path(self.root)

    def choose(self) -> ResumeChoice:
        """Rank 0 picks the checkpoint to resume and tells every rank."""
        choice = None
        if self.rank == 0:
            self.clean_strays()
            choice = choose_resume(self.root, self.cfg.verify_checksums)
            for name, reason in choice.rejected:
                self.log("ckpt_rejected", name=name, reason=reason)
                self._quarantine(self.root / name, reason)
            if self.cfg.remote_url:  # a newer durable copy on the remote tier (this node lost its disk)
                from .remote import restore_newer

                restored = restore_newer(self.cfg, self.root, choice.path.name if choice.path else None, self.log)
                if restored is not None:
                    choice = ResumeChoice(restored, read_manifest(restored), choice.rejected, choice.latest_hint)
            if self.uploads is not None:
                self.uploads.start()
        box = [choice]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _quarantine(self, path: Path, reason: str) -> None:
        quarantine(self.root, path, reason, self.log)

    # -- saving ------------------------------------------------------------------------------

    def save(self, ts: TrainState, reason: str, loss: float | None = None, blocking: bool | None = None) -> bool:
        """Save the current position (collective). Returns False if the save failed."""
        # The stall is everything training waits for: a previous async save, the digests, staging.
        started = time.perf_counter()
        self.wait()  # never two saves in flight
        p = ts.progress
        name = checkpoint_name(p.step, p.micro)
        use_async = self.cfg.async_save if blocking is None else not blocking
        digests = component_digests(ts) if self.cfg.record_digests else None
        probe.point("ckpt.stage", name=name, step=p.step, micro=p.micro, reason=reason, asynchronous=use_async)
        tmp = self.root / (TMP_PREFIX + name)
        writer = ProbedWriter(tmp) if probe.active() else FileSystemWriter(tmp)
        state = checkpoint_state(ts)
        progress = {"step": p.step, "micro": p.micro, "tokens_seen": p.tokens_seen}
        if use_async:
            try:
                future = dcp.async_save(state, storage_writer=writer, process_group=self.async_group)
            except (Exception, CheckpointException) as e:  # staging failed: nothing in flight
                return self._failed(name, reason, e)
            stall = time.perf_counter() - started
            self.pending = _Pending(future, name, progress, loss, digests, started, stall)
            self.log("save_started", name=name, reason=reason, asynchronous=True, stall_s=stall)
            return True
        error: BaseException | None = None
        try:
            dcp.save(state, storage_writer=writer)
        except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
            error = e
        if self.rank == 0 and error is None:
            try:
                self._commit(name, progress, loss, digests)
            except Exception as e:
                error = e
        # Every rank learns the outcome, so no rank runs ahead believing in a failed save.
        box = [None if error is None else f"{type(error).__name__}: {error}"]
        dist.broadcast_object_list(box, src=0)
        total = time.perf_counter() - started
        if box[0] is not None:
            return self._failed(name, reason, box[0])
        self.last_saved = (p.step, p.micro)
        self.log("saved", name=name, reason=reason, asynchronous=False, stall_s=total, total_s=total,
                 digests=digests)
        return True

    def poll(self) -> None:
        """Commit a finished async save; never blocks."""
        if self.pending is not None and self.pending.future.done():
            self._finish_async()

    def wait(self) -> None:
        """Block until the async save in flight (if any) is written and committed."""
        if self.pending is not None:
            self._finish_async()

    def _finish_async(self) -> None:
        pending, self.pending = self.pending, None
        try:
            pending.future.result()
            if self.rank == 0:
                self._commit(pending.name, pending.progress, pending.loss, pending.digests)
        except (Exception, CheckpointException) as e:
            self._failed(pending.name, "async", e)
            return
        total = time.perf_counter() - pending.started
        self.last_saved = (pending.progress["step"], pending.progress["micro"])
        self.log("saved", name=pending.name, reason="async", asynchronous=True, stall_s=pending.stall_s,
                 total_s=total, digests=pending.digests)
        probe.point("ckpt.async.done", name=pending.name)

    def _failed(self, name: str, reason: str, error) -> bool:
        if self.rank == 0:
            shutil.rmtree(self.root / (TMP_PREFIX + name), ignore_errors=True)
        self.log("save_failed", name=name, reason=reason, error=str(error), policy=self.cfg.on_save_failure)
        probe.point("ckpt.failed", name=name, error=str(error))
        print(f"[reference_trainer] WARNING: checkpoint {name} failed and was discarded: {error}", flush=True)
        if self.cfg.on_save_failure == "stop":
            raise SaveFailed(f"checkpoint {name} failed: {error}")
        return False

    def _commit(self, name: str, progress: dict, loss: float | None, digests: dict | None) -> None:
        """Rank 0: make the written checkpoint durable, then visible, then the newest."""
        tmp = self.root / (TMP_PREFIX + name)
        files = sorted(p for p in tmp.iterdir() if p.is_file())
        for f in files:
            fsync_path(f)
        fsync_path(tmp)
        probe.point("ckpt.fsync", name=name, files=len(files))
        manifest = {
            "format": FORMAT, "step": progress["step"], "micro": progress["micro"],
            "tokens_seen": progress["tokens_seen"], "world_size": self.world_size,
            "config_hash": self.cfg.trajectory_hash(), "config": self.cfg.to_dict(),
            "loss": loss, "digests": digests, "created": time.time(),
            "files": {f.name: {"size": f.stat().st_size, "sha256": sha256_file(f)} for f in files},
        }
        write_durably(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
        probe.point("ckpt.manifest", name=name)
        final = self.root / name
        if final.exists():  # an older timeline's checkpoint with this name
            self._quarantine(final, "superseded by a new save of the same step")
        os.rename(tmp, final)
        fsync_path(self.root)
        probe.point("ckpt.commit", name=name)
        write_durably(self.root / LATEST, name.encode())
        probe.point("ckpt.latest", name=name)
        self.log("committed", name=name, files=len(files), bytes=sum(v["size"] for v in manifest["files"].values()),
                 loss=loss)
        self.apply_retention()
        if self.uploads is not None:
            self.uploads.submit(name)

    def close(self, drain_s: float) -> None:
        """End of training: give the uploader up to ``drain_s`` to make the last checkpoint durable."""
        if self.uploads is not None:
            self.uploads.close(drain_s)

    def apply_retention(self) -> None:
        """Rank 0, after a commit: keep the last K, the milestones and the best; delete the rest."""
        ckpts = list_checkpoints(self.root)
        keep = set(ckpts[: self.cfg.keep_last])
        if self.cfg.keep_every:
            keep |= {c for c in ckpts if parse_name(c.name)[1] == 0 and parse_name(c.name)[0] % self.cfg.keep_every == 0}
        if self.cfg.keep_best:
            losses = {}
            for c in ckpts:
                try:
                    loss = read_manifest(c).get("loss")
                except (OSError, ValueError):
                    continue
                if loss is not None:
                    losses[c] = loss
            if losses:
                keep.add(min(losses, key=losses.get))
        deleted = []
        for c in ckpts:
            if c not in keep:
                remove_tree(c)
                deleted.append(c.name)
        probe.point("ckpt.retention", deleted=deleted)
        if deleted:
            self.log("retention", deleted=deleted, kept=sorted(k.name for k in keep))
