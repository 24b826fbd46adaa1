"""How a checkpoint reaches the disk: atomic commit, validation, resume choice, retention.

Layout of the checkpoint directory::

    step_00000020/          committed checkpoint: DCP files + manifest.json
    step_00000023.001/      emergency checkpoint taken 1 micro-batch into step 24
    latest                  name of the newest committed checkpoint (a hint for tools)
    .tmp-step_00000030/     a save in progress (removed on start if a crash left it)
    .trash-step_00000010/   a checkpoint being deleted by retention (removed on start)
    rejected/step_00000030/ a checkpoint that failed validation, kept for post-mortem

A save goes: DCP writes every rank's shard into ``.tmp-<name>``, fsyncing each file, while the
rank hashes it (XXH3-128); rank 0 gathers the checksums with DCP's write results and writes
``.metadata`` (fsynced too); rank 0 then fsyncs the directory, writes ``manifest.json`` (file list,
sizes, checksums, step, world size, config hash) and fsyncs it, renames the directory to
``<name>``, fsyncs the parent, and only then moves ``latest`` (temporary file, fsync, rename, fsync).
A crash at any instant leaves the old or the new checkpoint as the newest valid one: a name
``step_*`` exists only after its manifest is durable, and the resume choice trusts nothing
that does not validate.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import shutil
import threading
import time
from concurrent import futures
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX, FileSystem, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.storage import WriteResult
from torch.distributed._shard._utils import narrow_tensor_by_index  # what FileSystemReader uses
from torch.utils.serialization import config as serialization_config

from ckpt_chaos import probe

from ckpt_chaos.probe.layout import (  # noqa: F401  (re-exported: the directory layout is part of this module's API)
    MANIFEST, LATEST, TMP_PREFIX, TRASH_PREFIX, REJECTED, FORMAT, CHECKSUMS,
    Checksum, ResumeChoice, checkpoint_name, checksum_file, choose_resume, fsync_path, list_checkpoints,
    discard, file_checksums, parse_name, quarantine, read_manifest, remove_tree, trash_of, validate, write_durably,
)
from .state import TrainState, checkpoint_state, component_digests


class SaveFailed(RuntimeError):
    """A save failed and the trainer's policy is to stop."""


# ---- writing: checksums and probe points ------------------------------------------------------

class _HashingStream:
    """A file stream that hashes what is written through it, times the writes, and reports each
    tenth of the planned shard bytes to the probe."""

    def __init__(self, raw, name: str, planned: int, probed: bool, checksum: Checksum):
        self._raw, self._name, self._planned, self._probed = raw, name, max(planned, 1), probed
        self.hash = checksum.new()
        self.size, self._next_tenth = 0, 1
        self.write_s = self.checksum_s = 0.0
        self.last_write = time.perf_counter()

    def write(self, data) -> int:
        t0 = time.perf_counter()
        n = self._raw.write(data)
        t1 = time.perf_counter()
        self.hash.update(data)
        self.last_write = time.perf_counter()
        self.write_s += t1 - t0
        self.checksum_s += self.last_write - t1
        self.size += n
        while self._probed and self._next_tenth <= 10 and self.size * 10 >= self._planned * self._next_tenth:
            probe.point("ckpt.shard.write", file=self._name, bytes=self.size,
                        planned=self._planned, fraction=self._next_tenth / 10)
            self._next_tenth += 1
        return n

    def __getattr__(self, item):
        return getattr(self._raw, item)


class _HashingFileSystem(FileSystem):
    """DCP's file system, keeping the size and checksum of every file written through it."""

    def __init__(self, planned: int, checksum: Checksum):
        super().__init__()
        self.planned, self.checksum = planned, checksum
        self.files: dict[str, dict] = {}  # name -> manifest entry
        self.times = {"write_s": 0.0, "checksum_s": 0.0, "fsync_s": 0.0}

    @contextmanager
    def create_stream(self, path, mode):
        with super().create_stream(path, mode) as raw:
            if "w" not in mode:
                yield raw
                return
            stream = _HashingStream(raw, Path(path).name, self.planned, probe.active(), self.checksum)
            yield stream
            # DCP fsyncs and closes the file after its last write, inside this block.
            self.times["fsync_s"] += time.perf_counter() - stream.last_write
        self.times["write_s"] += stream.write_s
        self.times["checksum_s"] += stream.checksum_s
        self.files[Path(path).name] = {"size": stream.size, self.checksum.key: stream.hash.hexdigest()}
        probe.point("ckpt.shard.done", file=Path(path).name, bytes=Path(path).stat().st_size)

    def rename(self, path, new_path) -> None:
        super().rename(path, new_path)
        if Path(path).name in self.files:
            self.files[Path(new_path).name] = self.files.pop(Path(path).name)


@functools.cache
def _record_overhead(dtype: torch.dtype) -> int:
    """What torch.save adds around a tensor's bytes in a shard (its zip headers and pickle, and on
    average half of the 64-byte alignment of its data record)."""
    buf = io.BytesIO()
    with serialization_config.patch({"save.compute_crc32": False}):
        torch.save(torch.empty(0, dtype=dtype), buf)
    return len(buf.getvalue()) + 32


# The key under which each rank's file entries ride to rank 0 in the write results DCP gathers
# for ``finish`` anyway; ``finish`` takes them out before DCP writes its metadata.
_FILES_KEY = "__reference_trainer_files__"


class ProbedWriter(FileSystemWriter):
    """DCP's FileSystemWriter; each rank hashes its files as it writes them (no second read, all
    ranks at once) and rank 0's ``finish`` collects every file's size and checksum in ``files``.
    Reports shard progress and the metadata write to the probe, and times the save's phases."""

    def __init__(self, *args, checksum: Checksum, **kwargs):
        super().__init__(*args, **kwargs)
        self.checksum = checksum  # the manifest format's
        self.files: dict[str, dict] | None = None  # rank 0, after finish: the manifest's file entries
        self.phases: dict[str, float] = {}
        self._marks: dict[str, float] = {}

    def set_up_storage_writer(self, *args, **kwargs) -> None:
        self._marks["plan"] = time.perf_counter()
        super().set_up_storage_writer(*args, **kwargs)

    def write_data(self, plan, planner):
        started = time.perf_counter()
        planned = 0  # the shard file's size, so that its progress is reported as a fraction of the file
        for item in plan.items:
            if item.tensor_data is None:
                planned += planner.resolve_data(item).getbuffer().nbytes
                continue
            numel = 1
            for s in item.tensor_data.chunk.sizes:
                numel *= s
            dtype = item.tensor_data.properties.dtype
            planned += numel * torch.empty((), dtype=dtype).element_size() + _record_overhead(dtype)
        self.fs = _HashingFileSystem(planned, self.checksum)
        # torch.save's CRC32 of each record is the serialization's slowest part and adds nothing:
        # the file checksum covers every byte and is validated before any load.
        with serialization_config.patch({"save.compute_crc32": False}):
            results = super().write_data(plan, planner).wait()
        self._marks["written"] = time.perf_counter()
        times = self.fs.times
        self.phases.update(plan_s=started - self._marks["plan"], write_data_s=self._marks["written"] - started,
                           **{f"write_data.{k}": v for k, v in times.items()})
        self.phases["write_data.serialize_s"] = self.phases["write_data_s"] - sum(times.values())
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(results + [WriteResult(index=MetadataIndex(_FILES_KEY), size_in_bytes=0,
                                               storage_data=dict(self.fs.files))])
        return done

    def finish(self, metadata, results) -> None:
        started = time.perf_counter()
        files: dict[str, dict] = {}
        kept = []
        for rank_results in results:
            kept.append([r for r in rank_results if r.index.fqn != _FILES_KEY])
            for r in rank_results:
                if r.index.fqn == _FILES_KEY:
                    files.update(r.storage_data)
        super().finish(metadata, kept)
        self.files = {**files, **self.fs.files}
        self.phases.update(gather_s=started - self._marks["written"], metadata_s=time.perf_counter() - started)
        probe.point("ckpt.metadata", path=str(self.path))


# ---- reading: checksums verified while loading -------------------------------------------------

class FileCorrupt(ValueError):
    """A checkpoint file's bytes do not match its manifest entry, found while loading it."""


def read_while_loading(name: str) -> bool:
    """The files whose checksum ``VerifyingReader`` verifies as ``dcp.load`` reads them: the shards.
    Validation before the load hashes the rest (``.metadata``, which DCP unpickles first)."""
    return name.endswith(DEFAULT_SUFFIX)


def _verifier(name: str, world_size: int) -> int:
    """The rank that reads a data file whole and verifies it: its writer's rank modulo the world
    size, so each file has one verifier at any world size on resume."""
    m = re.match(r"__(\d+)_", name)
    return int(m.group(1)) % world_size if m else 0


class VerifyingReader(FileSystemReader):
    """DCP's FileSystemReader, except that each shard is read once, front to back, and its size and
    checksum are checked against the manifest as it is read: one cold read of the checkpoint in
    all instead of a hashing pass before ``dcp.load`` and a second read by it.

    A file's verifier (``_verifier``) reads all of it, other ranks only the items they load from
    it. A mismatch raises FileCorrupt once the file is read, which DCP raises on every rank: the
    load fails as a whole, and the caller rejects the checkpoint and loads another (tensors already
    copied from it are overwritten, or the state is built afresh)."""

    def __init__(self, path, manifest: dict | None, rank: int, world_size: int):
        super().__init__(path)
        # name -> (size, checksum) of the files this rank verifies; None: verify nothing
        self.expected = None if manifest is None else {
            n: v for n, v in file_checksums(manifest).items()
            if read_while_loading(n) and _verifier(n, world_size) == rank}
        self.hasher = CHECKSUMS[manifest["format"]] if manifest is not None else None

    def read_data(self, plan, planner):
        per_file: dict[str, dict[tuple[int, int], list]] = {name: {} for name in self.expected or {}}
        for req in plan.items:
            info = self.storage_data[req.storage_index]
            per_file.setdefault(info.relative_path, {}).setdefault((info.offset, info.length), []).append(req)
        for name, items in per_file.items():
            want = (self.expected or {}).get(name)
            with open(os.path.join(self.path, name), "rb", buffering=0) as f:
                if want is None:
                    for (offset, length), reqs in sorted(items.items()):
                        f.seek(offset)
                        self._deliver(reqs, _read_exactly(f, length, name), planner)
                    continue
                h, pos = self.hasher.new(), 0
                for (offset, length), reqs in sorted(items.items()):
                    pos += _hash_through(f, h, offset - pos)
                    data = _read_exactly(f, length, name)
                    h.update(data)
                    pos += length
                    self._deliver(reqs, data, planner)
                pos += _hash_through(f, h, None)
            size, checksum = want
            if pos != size:
                raise FileCorrupt(f"{name} has {pos} bytes, manifest says {size}")
            if h.hexdigest() != checksum:
                raise FileCorrupt(f"{name} fails its {self.hasher.label} checksum")
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(None)
        return done

    def _deliver(self, reqs: list, data: bytes, planner) -> None:
        for req in reqs:
            info = self.storage_data[req.storage_index]
            stream = self.transforms.transform_load_stream(req, info.transform_descriptors or (), io.BytesIO(data))
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(stream.read(-1)))
                continue
            if not stream.seekable():  # torch.load seeks
                stream = io.BytesIO(stream.read(-1))
            tensor = torch.load(stream, map_location="cpu", weights_only=True)
            tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            target.copy_(tensor)  # which refuses a tensor of another size
            planner.commit_tensor(req, target)


def _read_exactly(f, n: int, name: str) -> bytes:
    data = f.read(n)
    while len(data) < n:
        more = f.read(n - len(data))
        if not more:
            raise FileCorrupt(f"{name} ends at byte {f.tell()}, before the item it should hold")
        data += more
    return data


def _hash_through(f, h, n: int | None) -> int:
    """Hash the next ``n`` bytes of ``f`` (all that is left: None); returns how many there were."""
    seen = 0
    while n is None or seen < n:
        chunk = f.read(8 << 20 if n is None else min(8 << 20, n - seen))
        if not chunk:
            break
        h.update(chunk)
        seen += len(chunk)
    return seen


def corrupt_file(error: BaseException) -> str | None:
    """The reason a load failed if a file failed its verification on any rank, else None (DCP
    raises every rank's failure in a CheckpointException)."""
    for failure in getattr(error, "failures", {}).values():
        found = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(found, FileCorrupt):
            return str(found)
    return None


# ---- the manager ----------------------------------------------------------------------------

@dataclass
class _Pending:
    future: Future
    staged: Future | None  # done once the state is copied: training may change it from then on
    writer: ProbedWriter
    name: str
    progress: dict
    loss: float | None
    digests: dict | None
    started: float
    stall_s: float
    phases: dict


class CheckpointManager:
    """Saves, commits, validates and prunes checkpoints for one training job."""

    def __init__(self, cfg, rank: int, world_size: int, log: Callable[..., None],
                 async_group: dist.ProcessGroup | None = None):
        self.cfg, self.rank, self.world_size, self.log = cfg, rank, world_size, log
        self.root = cfg.checkpoint_dir
        self.async_group = async_group
        self.pending: _Pending | None = None
        self.stager: DefaultStager | None = None  # async saves: its staging buffers are reused
        self.deleter: threading.Thread | None = None  # rank 0: deletes what retention discarded
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
        """Rank 0 picks the checkpoint to resume and tells every rank. The shards' checksums are
        verified by the load itself (``VerifyingReader``); one that fails is passed to ``reject``
        and ``choose`` is called again."""
        choice = None
        if self.rank == 0:
            self.clean_strays()
            choice = choose_resume(self.root, self.cfg.verify_checksums, read_later=read_while_loading)
            for name, reason in choice.rejected:
                self.log("ckpt_rejected", name=name, reason=reason)
                self._quarantine(self.root / name, reason)
            if self.cfg.remote_url:  # a newer durable copy on the remote tier (this node lost its disk)
                from .remote import restore_newer

                restored = restore_newer(self.cfg, self.root, choice.path.name if choice.path else None, self.log)
                if restored is not None:
                    choice = ResumeChoice(restored, read_manifest(restored), choice.rejected, choice.latest_hint, True)
        box = [choice]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def reader(self, choice: ResumeChoice) -> VerifyingReader:
        return VerifyingReader(choice.path, choice.manifest if self.cfg.verify_checksums else None, self.rank,
                               self.world_size)

    def reject(self, path: Path, reason: str) -> None:
        """A chosen checkpoint failed on load: out of the resume path, with the reason (rank 0)."""
        if self.rank == 0:
            self.log("ckpt_rejected", name=path.name, reason=reason)
            self._quarantine(path, reason)

    def resumed(self) -> None:
        """The resume is over: start the uploader (rank 0), which then finds no rejected checkpoint."""
        if self.uploads is not None:
            self.uploads.start()

    def _quarantine(self, path: Path, reason: str) -> None:
        quarantine(self.root, path, reason, self.log)

    # -- saving ------------------------------------------------------------------------------

    def save(self, ts: TrainState, reason: str, loss: float | None = None, blocking: bool | None = None) -> bool:
        """Save the current position (collective). Returns False if the save failed."""
        # The stall is everything training waits for: a previous async save, the digests, the
        # state dict, and for a synchronous save the write and the commit (for an async save,
        # ``wait_staged`` adds the wait for the copy before the next step).
        started = time.perf_counter()
        self.wait()  # never two saves in flight
        waited = time.perf_counter()
        p = ts.progress
        name = checkpoint_name(p.step, p.micro)
        use_async = self.cfg.async_save if blocking is None else not blocking
        digests = component_digests(ts) if self.cfg.record_digests else None
        probe.point("ckpt.stage", name=name, step=p.step, micro=p.micro, reason=reason, asynchronous=use_async)
        writer = ProbedWriter(self.root / (TMP_PREFIX + name), checksum=CHECKSUMS[self.cfg.manifest_format])
        state = checkpoint_state(ts)
        phases = {"wait_previous_s": waited - started, "state_s": time.perf_counter() - waited}
        progress = {"step": p.step, "micro": p.micro, "tokens_seen": p.tokens_seen}
        if use_async:
            if self.stager is None:
                # The copy runs on a thread of its own (the DCP default copies on the caller's);
                # the stager keeps its buffers, so later saves copy without allocating.
                self.stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                                           use_async_staging=True, use_non_blocking_copy=False))
            try:
                response = dcp.async_save(state, storage_writer=writer, process_group=self.async_group,
                                          async_stager=self.stager)
            except (Exception, CheckpointException) as e:  # nothing in flight
                return self._failed(name, reason, e)
            staging = time.perf_counter()
            phases["wait_staged_s"] = 0.0  # every async save reports it: zero when the copy was done in time
            response.staging_completion.add_done_callback(
                lambda _: phases.__setitem__("stage_s", time.perf_counter() - staging))
            stall = time.perf_counter() - started
            self.pending = _Pending(response.upload_completion, response.staging_completion, writer, name, progress,
                                    loss, digests, started, stall, phases)
            self.log("save_started", name=name, reason=reason, asynchronous=True, stall_s=stall)
            return True
        error: BaseException | None = None
        try:
            dcp.save(state, storage_writer=writer)
        except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
            error = e
        if self.rank == 0 and error is None:
            try:
                phases["commit_s"] = self._commit(name, writer.files, progress, loss, digests)
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
                 digests=digests, phases={**phases, **writer.phases})
        return True

    def wait_staged(self) -> None:
        """Block until the async save in flight has copied the state; call before changing it."""
        pending = self.pending
        if pending is not None and pending.staged is not None and not pending.staged.done():
            started = time.perf_counter()
            futures.wait([pending.staged])  # a staging error surfaces from the save's own future
            pending.stall_s += time.perf_counter() - started
            pending.phases["wait_staged_s"] = time.perf_counter() - started

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
                pending.phases["commit_s"] = self._commit(pending.name, pending.writer.files, pending.progress,
                                                          pending.loss, pending.digests)
        except (Exception, CheckpointException) as e:
            self._failed(pending.name, "async", e)
            return
        total = time.perf_counter() - pending.started
        self.last_saved = (pending.progress["step"], pending.progress["micro"])
        self.log("saved", name=pending.name, reason="async", asynchronous=True, stall_s=pending.stall_s,
                 total_s=total, digests=pending.digests, phases={**pending.phases, **pending.writer.phases})
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

    def _commit(self, name: str, written: dict[str, dict] | None, progress: dict, loss: float | None,
                digests: dict | None) -> float:
        """Rank 0: make the written checkpoint durable, then visible, then the newest. ``written``:
        the size and checksum of each file as the ranks wrote it. Returns the seconds it took."""
        started = time.perf_counter()
        tmp = self.root / (TMP_PREFIX + name)
        fmt = self.cfg.manifest_format
        files = {}
        for f in sorted(p for p in tmp.iterdir() if p.is_file()):
            size = f.stat().st_size
            entry = (written or {}).get(f.name)
            if entry is None:  # not written by DCP through the writer: the manifest describes it as it is
                entry = {"size": size, CHECKSUMS[fmt].key: checksum_file(f, fmt)}
            elif entry["size"] != size:
                raise RuntimeError(f"{f.name} has {size} bytes on disk, {entry['size']} were written")
            files[f.name] = entry
        # DCP fsynced each file's data as it wrote it (sync_files); the names are in the directory.
        fsync_path(tmp)
        probe.point("ckpt.fsync", name=name, files=len(files))
        manifest = {
            "format": fmt, "step": progress["step"], "micro": progress["micro"],
            "tokens_seen": progress["tokens_seen"], "world_size": self.world_size,
            "config_hash": self.cfg.trajectory_hash(), "config": self.cfg.to_dict(),
            "loss": loss, "digests": digests, "created": time.time(), "files": files,
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
        return time.perf_counter() - started

    def close(self, drain_s: float) -> None:
        """End of training: give the uploader up to ``drain_s`` to make the last checkpoint durable."""
        if self.stager is not None:
            self.stager.close()
        self._join_deleter()
        if self.uploads is not None:
            self.uploads.close(drain_s)

    def _join_deleter(self) -> None:
        if self.deleter is not None:
            self.deleter.join()
            self.deleter = None

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
        trash = []
        try:
            for c in ckpts:
                if c not in keep:
                    trash.append(trash_of(c))
                    discard(c)
        finally:
            # A discard that fails after its rename (the folder's fsync) has still taken the checkpoint
            # out of the layout: it is deleted and reported with the others, and the error goes on up.
            trash = [t for t in trash if t.exists()]
            # Renamed to trash, a checkpoint is gone from the layout for good; freeing its blocks takes
            # a large checkpoint's unlink a while, which training need not wait for.
            self._join_deleter()
            self.deleter = threading.Thread(target=lambda: [shutil.rmtree(t, ignore_errors=True) for t in trash],
                                            name="retention", daemon=True)
            self.deleter.start()
            deleted = [t.name.removeprefix(TRASH_PREFIX) for t in trash]
            probe.point("ckpt.retention", deleted=deleted)
            if deleted:
                self.log("retention", deleted=deleted, kept=sorted(k.name for k in keep))
