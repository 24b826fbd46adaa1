"""The remote tier: a background upload of committed checkpoints to S3, and restore from it.

A save stays what ``checkpoint.py`` makes it: a fast, atomic commit to the local checkpoint
directory. After each commit rank 0 hands the checkpoint's name to an uploader process (a pipe
write: the training loop never waits for the network). The uploader copies the checkpoint to
``s3://bucket/prefix/<name>/`` and makes it *durable* in a fixed order:

1. every file of the local manifest is put (``Content-MD5`` lets the server reject a corrupted
   body; the file's checksum from the manifest rides along as object metadata);
2. every object is checked against the manifest (size and checksum);
3. only then ``manifest.json`` is put. A remote checkpoint is durable iff its manifest exists:
   a cut link, a killed uploader or a full bucket leave objects without a manifest, which nothing
   ever restores and the next uploader deletes.

The uploader first hard-links the checkpoint's files into ``.upload-<name>``: when uploads lag
behind, local retention deletes checkpoints that are still uploading (with ``keep_last = 2`` and
a slow link, every one of them: nothing would ever become durable), and the links keep the data
until the upload ends. Failures are retried with exponential backoff. When uploads lag, the
uploader skips to the newest committed checkpoint: an older one would only be deleted by remote
retention once the newer one lands.
Remote retention keeps the newest ``remote_keep_last`` durable checkpoints.

On start, rank 0 compares the newest valid local checkpoint with the newest durable remote one
and, when the remote one is newer (a node that lost its disk), downloads it into
``.tmp-<name>``, validates it like any local checkpoint (sizes and checksums from its manifest) and
commits it locally before the usual load.

The code speaks plain S3 through boto3 and knows nothing of the server: ``remote_endpoint``
points it at moto (what the harness starts here), MinIO, or nothing (AWS, credentials from the
usual boto3 chain). The uploader is a process of its own (``python -m reference_trainer.remote``)
so that hashing and uploading never hold the training process's GIL, and so that it can die
(and be restarted) on its own.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

from ckpt_chaos import probe
from ckpt_chaos.probe import ENV_ROLE  # the probe reports the uploader's events with role "uploader"

from ckpt_chaos.probe import layout as ck

UPLOADER_MODULE = "reference_trainer.remote"
UPLOADER_READY_S = 60.0  # how long rank 0 waits, before training, for its uploader to be up
UPLOAD_PREFIX = ".upload-"  # hard links of a checkpoint being uploaded  # a trainer built on this one may run its own


class UploadIncomplete(RuntimeError):
    """Objects on the remote side do not match the manifest (yet)."""


def _md5_b64(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return base64.b64encode(h.digest()).decode()


class _ProgressReader:
    """A file object for the request body that reports each tenth of the bytes read to the probe."""

    def __init__(self, f, name: str, path: Path, size: int):
        self._f, self._name, self._path, self._size = f, name, path, max(size, 1)
        self._read, self._next_tenth = 0, 1

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self._read += len(data)
        while self._next_tenth <= 10 and self._read * 10 >= self._size * self._next_tenth:
            probe.point("upload.write", name=self._name, file=self._path.name, path=str(self._path),
                        bytes=self._read, fraction=self._next_tenth / 10)
            self._next_tenth += 1
        return data

    def __getattr__(self, item):
        return getattr(self._f, item)


class RemoteStore:
    """Checkpoints under ``s3://bucket/prefix/<name>/``; durable iff ``<name>/manifest.json`` exists."""

    def __init__(self, url: str, endpoint: str = "", timeout_s: float = 5.0):
        import boto3
        from botocore.config import Config

        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ValueError(f"remote_url={url!r}: expected s3://bucket/prefix")
        self.url, self.bucket, self.prefix = url, parsed.netloc, parsed.path.strip("/")
        # Retries are ours (with backoff and a log line each); checksums are ours (Content-MD5 and
        # the manifest's SHA-256), so botocore does not read a body twice to compute its own.
        config = Config(connect_timeout=timeout_s, read_timeout=timeout_s, retries={"max_attempts": 1},
                        request_checksum_calculation="when_required",
                        response_checksum_validation="when_required")
        self.s3 = boto3.client("s3", endpoint_url=endpoint or None, config=config,
                               region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))

    def key(self, name: str, file: str = "") -> str:
        return "/".join(p for p in (self.prefix, name, file) if p)

    def objects(self) -> dict[str, dict[str, int]]:
        """name -> {file: size} for everything under the prefix, durable or not."""
        found: dict[str, dict[str, int]] = {}
        start = self.key("") + "/" if self.prefix else ""
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(start):]
                if "/" in rel:
                    name, file = rel.split("/", 1)
                    if ck.parse_name(name):
                        found.setdefault(name, {})[file] = obj["Size"]
        return found

    def durable(self) -> list[str]:
        """Names of durable checkpoints, newest first."""
        names = [n for n, files in self.objects().items() if ck.MANIFEST in files]
        return sorted(names, key=ck.parse_name, reverse=True)

    def put_file(self, name: str, path: Path, checksum: str) -> None:
        size = path.stat().st_size
        with open(path, "rb") as f:
            self.s3.put_object(Bucket=self.bucket, Key=self.key(name, path.name),
                               Body=_ProgressReader(f, name, path, size), ContentLength=size,
                               ContentMD5=_md5_b64(path), Metadata={"checksum": checksum})
        probe.point("upload.object", name=name, file=path.name, bytes=size)

    def matches(self, name: str, file: str, size: int, checksum: str) -> str | None:
        """None if the object is there with the manifest's size and checksum; else what is wrong."""
        from botocore.exceptions import ClientError

        try:
            head = self.s3.head_object(Bucket=self.bucket, Key=self.key(name, file))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return f"{file} is missing"
            raise
        if head["ContentLength"] != size:
            return f"{file} has {head['ContentLength']} bytes, manifest says {size}"
        if head.get("Metadata", {}).get("checksum") != checksum:
            return f"{file} was uploaded with another checksum"
        return None

    def verify(self, name: str, manifest: dict) -> str | None:
        for file, (size, checksum) in ck.file_checksums(manifest).items():
            reason = self.matches(name, file, size, checksum)
            if reason:
                return reason
        return None

    def mark_durable(self, name: str, manifest_path: Path) -> None:
        body = manifest_path.read_bytes()
        self.s3.put_object(Bucket=self.bucket, Key=self.key(name, ck.MANIFEST), Body=body,
                           ContentMD5=base64.b64encode(hashlib.md5(body).digest()).decode())

    def delete(self, name: str, files: list[str]) -> None:
        """Un-durable first (the manifest), then the data: a crash midway leaves garbage, never a torn
        durable checkpoint."""
        keys = [self.key(name, ck.MANIFEST)] if ck.MANIFEST in files else []
        for key in keys + [self.key(name, f) for f in files if f != ck.MANIFEST]:
            self.s3.delete_object(Bucket=self.bucket, Key=key)

    def download(self, name: str, dest: Path) -> int:
        """Every object of a durable checkpoint into ``dest``; returns the bytes fetched."""
        manifest = json.loads(self.s3.get_object(Bucket=self.bucket, Key=self.key(name, ck.MANIFEST))["Body"].read())
        dest.mkdir(parents=True, exist_ok=True)
        total = 0
        for file in manifest["files"]:
            self.s3.download_file(self.bucket, self.key(name, file), str(dest / file))
            total += (dest / file).stat().st_size
        ck.write_durably(dest / ck.MANIFEST, json.dumps(manifest, indent=1).encode())
        for f in dest.iterdir():
            ck.fsync_path(f)
        ck.fsync_path(dest)
        return total


def store_from_config(cfg) -> RemoteStore:
    return RemoteStore(cfg.remote_url, cfg.remote_endpoint, cfg.remote_timeout_s)


# ---- restore (rank 0, at start) -----------------------------------------------------------------

def restore_newer(cfg, root: Path, local_newest: str | None, log: Callable[..., None]) -> Path | None:
    """If a durable remote checkpoint is newer than ``local_newest``, bring it into ``root`` and
    return its path; the newest remote one that validates after download wins."""
    try:
        store = store_from_config(cfg)
        names = store.durable()
    except Exception as e:  # an unreachable store must not stop a resume that local disk can serve
        log("remote_unreachable", error=f"{type(e).__name__}: {e}"[:500])
        return None
    floor = ck.parse_name(local_newest) if local_newest else None
    for name in names:
        if floor is not None and ck.parse_name(name) <= floor:
            break
        tmp = root / (ck.TMP_PREFIX + name)
        shutil.rmtree(tmp, ignore_errors=True)
        probe.point("remote.download", name=name)
        started = time.perf_counter()
        try:
            nbytes = store.download(name, tmp)
        except Exception as e:
            log("remote_download_failed", name=name, error=f"{type(e).__name__}: {e}"[:500])
            shutil.rmtree(tmp, ignore_errors=True)
            continue
        reason = ck.validate(tmp, cfg.verify_checksums, name=name)
        if reason is not None:
            log("remote_rejected", name=name, reason=reason)
            shutil.rmtree(tmp, ignore_errors=True)
            continue
        final = root / name
        if final.exists():  # a local copy that failed validation: keep it for post-mortem
            ck.quarantine(root, final, "replaced by the durable remote copy", log)
        os.rename(tmp, final)
        ck.fsync_path(root)
        log("restored_from_remote", name=name, bytes=nbytes, seconds=time.perf_counter() - started)
        probe.point("remote.restored", name=name)
        return final
    return None


# ---- the uploader, seen from the trainer (rank 0) --------------------------------------------------

class UploadQueue:
    """Hands committed checkpoints to the uploader process; never blocks on the network."""

    def __init__(self, cfg, log: Callable[..., None]):
        self.cfg, self.log = cfg, log
        self.proc: subprocess.Popen | None = None
        self.started = 0

    def _spawn(self) -> int:
        """Start an uploader; the read end of the pipe on which it says it is up."""
        env = {**os.environ, ENV_ROLE: "uploader"}
        args = {k: getattr(self.cfg, k) for k in ("remote_url", "remote_endpoint", "remote_timeout_s",
                                                   "remote_keep_last", "upload_retries", "upload_backoff_s",
                                                   "run_dir")}
        args["ckpt_dir"] = str(self.cfg.checkpoint_dir)
        args["parent_pid"] = os.getpid()
        ready, args["ready_fd"] = os.pipe()
        # No preexec_fn: without one, Popen starts the child with vfork instead of fork, and rank 0
        # does not copy its page tables when submit() replaces a dead uploader on the training loop
        # (a fork stalls a step by tenths of a second). The uploader ties its life to rank 0 itself.
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", UPLOADER_MODULE, json.dumps(args)],
                                         stdin=subprocess.PIPE, env=env, pass_fds=(args["ready_fd"],))
        finally:
            os.close(args["ready_fd"])
        self.started += 1
        self.log("uploader_started", pid=self.proc.pid, n=self.started)
        return ready

    def start(self) -> None:
        """Start the uploader before training and wait until it is up, so a hand-off is only ever a
        pipe write and the first checkpoints find it ready: an uploader still importing its S3
        client (seconds on a busy node, where it runs niced) would otherwise skip every checkpoint
        committed meanwhile but the newest. Waiting is bounded: training never hangs on it."""
        if self.proc is not None:
            return
        ready = self._spawn()
        try:
            up, _, _ = select.select([ready], [], [], UPLOADER_READY_S)
            said = os.read(ready, 16) if up else b""
        finally:
            os.close(ready)
        if not said:
            self.log("uploader_not_ready", waited_s=UPLOADER_READY_S if not up else None,
                     rc=self.proc.poll())

    def submit(self, name: str) -> None:
        started = time.perf_counter()
        for _ in range(2):
            if self.proc is not None and self.proc.poll() is not None:
                self.log("uploader_died", pid=self.proc.pid, rc=self.proc.returncode)
                self.proc = None
            if self.proc is None:
                # a new uploader first looks for committed checkpoints not yet durable; the step
                # does not wait for it to be up
                os.close(self._spawn())
            try:
                self.proc.stdin.write(name.encode() + b"\n")
                self.proc.stdin.flush()
                break
            except (BrokenPipeError, OSError):
                self.proc.wait()
        self.log("upload_queued", name=name, stall_s=time.perf_counter() - started)

    def close(self, timeout_s: float, respawns: int = 3) -> None:
        """Let the uploader finish what it has (up to ``timeout_s``), then stop it.

        An uploader that dies on the way (a non-zero exit: it exits 0 when it has finished, whether
        its uploads succeeded or not) is replaced while time is left; the new one starts with the newest committed checkpoint that is
        not durable, so the last checkpoint of the run still gets uploaded. Without this, nothing
        after training would ever submit again and the final checkpoint stayed local only (found by
        ``ckpt-chaos explore --families remote``)."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while self.proc is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                rc = self.proc.wait(max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                self.log("upload_drain_timeout", timeout_s=timeout_s)
                self.proc.kill()
                self.proc.wait()
                rc = None
            if rc == 0:
                return
            if rc is None or respawns <= 0 or time.monotonic() >= deadline:
                # No uploader comes after this one to sweep its staging, whose links would keep the
                # bytes of checkpoints that retention deleted until the next job.
                sweep_staging(self.cfg.checkpoint_dir)
                return
            self.log("uploader_died", pid=self.proc.pid, rc=rc)
            respawns -= 1
            os.close(self._spawn())  # the drain waits for its exit, not for it to be up


def sweep_staging(root: Path) -> None:
    """Remove the staging directories of uploaders that are gone."""
    for stale in Path(root).glob(UPLOAD_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)


def _die_with_parent(parent_pid: int) -> None:
    """The uploader belongs to its trainer: if rank 0 dies, so does it (as on a lost node)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    # Rank 0 may have died between the spawn and the prctl: then this process was already
    # re-parented, and no signal will come.
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)


# ---- the uploader process ------------------------------------------------------------------------------

class Uploader:
    def __init__(self, args: dict):
        self.args = args
        self.root = Path(args["ckpt_dir"])
        self.store = RemoteStore(args["remote_url"], args["remote_endpoint"], args["remote_timeout_s"])
        self.process_id = uuid.uuid4().hex[:8]
        # The trainer's event log; records are single short lines appended with O_APPEND, so they do
        # not interleave with rank 0's.
        self.events = open(Path(args["run_dir"]) / "events.jsonl", "a", buffering=1)
        self.done: set[str] = set()  # made durable by this process
        self.attempt = int(os.environ.get("CKPT_CHAOS_ATTEMPT", "0")) + int(
            os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    def log(self, event: str, **fields) -> None:
        record = {"event": event, "t": time.time(), "process": self.process_id, "attempt": self.attempt,
                  "role": "uploader", **fields}
        self.events.write(json.dumps(record, sort_keys=True) + "\n")

    def pending_at_start(self) -> str | None:
        """The newest valid local checkpoint, if the remote tier does not have it durable yet."""
        choice = ck.choose_resume(self.root, verify_checksums=False)
        if choice.path is None:
            return None
        try:
            durable = set(self.store.durable())
        except Exception:
            durable = set()
        return None if choice.path.name in durable else choice.path.name

    def upload(self, name: str) -> bool:
        if name in self.done:
            return True
        retries, backoff = self.args["upload_retries"], self.args["upload_backoff_s"]
        started = time.perf_counter()
        try:
            path, manifest = self.stage(name)
        except (OSError, ValueError) as e:
            shutil.rmtree(self.root / (UPLOAD_PREFIX + name), ignore_errors=True)  # what was staged
            self.log("upload_abandoned", name=name, reason=f"local copy gone or unreadable: {e}")
            probe.point("upload.end", name=name, durable=False)
            return False
        durable = False
        try:
            durable = self._upload(name, path, manifest, retries, backoff, started)
            return durable
        finally:
            shutil.rmtree(path, ignore_errors=True)
            # one event whatever the outcome, so that a scenario can wait for the uploader to be done
            # with a checkpoint without knowing whether it was refused, retried or made durable
            probe.point("upload.end", name=name, durable=durable)

    def stage(self, name: str) -> tuple[Path, dict]:
        """Hard-link the checkpoint's files into ``.upload-<name>``: local retention may delete the
        checkpoint while it uploads (uploads lag behind), and the links keep its data until we are done."""
        src, staged = self.root / name, self.root / (UPLOAD_PREFIX + name)
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir()
        manifest = ck.read_manifest(src)
        for file in list(manifest["files"]) + [ck.MANIFEST]:
            try:
                os.link(src / file, staged / file)
            except OSError as e:
                if isinstance(e, FileNotFoundError):
                    raise
                shutil.copy2(src / file, staged / file)  # a file system without hard links
        return staged, manifest

    def _upload(self, name: str, path: Path, manifest: dict, retries: int, backoff: float, started: float) -> bool:
        total = sum(v["size"] for v in manifest["files"].values())
        probe.point("upload.begin", name=name, files=len(manifest["files"]), bytes=total)
        error = ""
        for attempt in range(1, retries + 1):
            if attempt > 1:  # when the backoff ended: the failed attempt's own length is no evidence of it
                self.log("upload_attempt", name=name, upload_attempt=attempt)
            try:
                self._put_all(name, path, manifest)
                probe.point("upload.verify", name=name)
                reason = self.store.verify(name, manifest)
                if reason:
                    raise UploadIncomplete(reason)
                self.store.mark_durable(name, path / ck.MANIFEST)
                probe.point("upload.durable", name=name)
                self.log("uploaded", name=name, bytes=total, seconds=time.perf_counter() - started,
                         attempts=attempt)
                self.done.add(name)
                self.retention()
                return True
            except FileNotFoundError as e:
                self.log("upload_abandoned", name=name, reason=f"local copy deleted while uploading: {e}")
                return False
            except Exception as e:  # botocore, socket and verification errors alike: retry
                error = f"{type(e).__name__}: {e}"[:500]
                delay = backoff * 2 ** (attempt - 1) if attempt < retries else None
                self.log("upload_retry", name=name, upload_attempt=attempt, error=error, retry_in_s=delay)
                probe.point("upload.failed", name=name, attempt=attempt, error=error)
                if delay is not None:
                    time.sleep(delay)
        self.log("upload_failed", name=name, attempts=retries, error=error)
        return False

    def _put_all(self, name: str, path: Path, manifest: dict) -> None:
        for file, (size, checksum) in sorted(ck.file_checksums(manifest).items()):
            # An object that already matches (an earlier attempt got it through) is not sent again.
            if self.store.matches(name, file, size, checksum) is None:
                continue
            self.store.put_file(name, path / file, checksum)

    def retention(self) -> None:
        """Keep the newest ``remote_keep_last`` durable checkpoints; delete older ones and the garbage
        of failed uploads older than the newest durable one."""
        objects = self.store.objects()
        durable = sorted((n for n, f in objects.items() if ck.MANIFEST in f), key=ck.parse_name, reverse=True)
        if not durable:
            return
        keep = set(durable[: self.args["remote_keep_last"]])
        newest = ck.parse_name(durable[0])
        deleted = []
        for name, files in objects.items():
            if name not in keep and ck.parse_name(name) <= newest:
                self.store.delete(name, list(files))
                deleted.append(name)
        probe.point("remote.retention", deleted=sorted(deleted))
        if deleted:
            self.log("remote_retention", deleted=sorted(deleted), kept=sorted(keep))

    def run(self, lines) -> int:
        sweep_staging(self.root)  # an earlier uploader may have died mid-upload
        work: queue.Queue = queue.Queue()
        first = self.pending_at_start()
        if first:
            work.put(first)

        def read() -> None:
            for line in lines:
                if line.strip():
                    work.put(line.decode().strip())
            work.put(None)  # the trainer closed the pipe: finish what is queued, then exit

        threading.Thread(target=read, daemon=True).start()
        done = False
        while not done:
            names = [work.get()]
            while not work.empty():
                names.append(work.get())
            done = None in names
            names = sorted({n for n in names if n}, key=ck.parse_name)
            if not names:
                continue
            for skipped in names[:-1]:  # uploads lag behind: the newest one makes these moot
                self.log("upload_skipped", name=skipped, newer=names[-1])
            self.upload(names[-1])
        return 0


def main() -> int:
    # Uploads are background work: on a node where the ranks use every core, they must not take
    # CPU time from training (hashing and HTTP would otherwise slow the steps down).
    os.nice(10)
    args = json.loads(sys.argv[1])
    _die_with_parent(args["parent_pid"])
    uploader = Uploader(args)
    uploader.log("uploader_up", pid=os.getpid())
    if "ready_fd" in args:
        try:
            os.write(args["ready_fd"], b"up\n")
        except BrokenPipeError:
            pass  # a replacement uploader: rank 0 did not wait for it
        os.close(args["ready_fd"])
    return uploader.run(sys.stdin.buffer)


if __name__ == "__main__":
    sys.exit(main())
