"""The checkpoint layout contract: what a checkpoint directory holds, and how to tell a complete
checkpoint from a torn one.

A trainer writes by it (the reference trainer's ``checkpoint.py`` writes DCP checkpoints on top of
it) and the harness reads by it (snapshots, checks, ``ckpt-chaos ckpts``, the corrupt fault), so
neither reaches into the other. Names, the manifest, durable small writes, validation, the resume
choice and quarantine: plain files and no torch, so that the uploader process and the harness read
checkpoints without importing a training stack. It sits beside the probe because it is the other
half of what a trainer shares with the harness.

Contract: ``<root>/step_NNNNNNNN[.MMM]/`` holds the checkpoint's files and ``manifest.json`` (files,
sizes, checksums, step, world size, config hash, format); such a directory exists only once every
file in it is durable (written in ``.tmp-<name>/`` and renamed); ``<root>/latest`` names the newest
committed checkpoint; ``rejected/`` holds quarantined ones with the reason; a hidden directory
(``.tmp-``, ``.trash-``, an uploader's staging) is work in progress, gone once the job has finished.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import xxhash

MANIFEST = "manifest.json"
LATEST = "latest"
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
REJECTED = "rejected"
FORMAT = 2
_NAME = re.compile(r"^step_(\d{8})(?:\.(\d{3}))?$")


def checkpoint_name(step: int, micro: int = 0) -> str:
    return f"step_{step:08d}" + (f".{micro:03d}" if micro else "")


def parse_name(name: str) -> tuple[int, int] | None:
    m = _NAME.match(name)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else None


def list_checkpoints(root: Path) -> list[Path]:
    """Committed-looking checkpoint directories, newest first (not yet validated)."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and parse_name(p.name)]
    return sorted(found, key=lambda p: parse_name(p.name), reverse=True)


# ---- durability helpers -------------------------------------------------------------------

def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes) -> None:
    """Write a small file atomically: temporary file, fsync, rename, fsync of the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    fsync_path(path.parent)


@dataclass(frozen=True)
class Checksum:
    key: str  # the field of each file's entry in the manifest
    label: str
    new: Callable[[], Any]  # a hashlib-style object: update(), hexdigest()


# Each file's checksum, by manifest format. Format 2 hashes with XXH3-128: the checksum guards
# against storage faults (flipped bits, torn or zeroed blocks, truncation), not against an
# attacker, and XXH3 detects random damage as well as any 128-bit hash (it passes SMHasher's
# distribution and avalanche tests) at ~10 GB/s a core against SHA-256's ~1 GB/s, so hashing
# stays far below the disk's time on save and on validation. Format 1 checkpoints (SHA-256) are
# still validated, so that an upgraded trainer resumes from them.
CHECKSUMS = {1: Checksum("sha256", "SHA-256", hashlib.sha256),
             2: Checksum("xxh3_128", "XXH3-128", xxhash.xxh3_128)}


def checksum_file(path: Path, fmt: int = FORMAT) -> str:
    h = CHECKSUMS[fmt].new()
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def trash_of(path: Path) -> Path:
    """Where ``discard`` renames a directory to: ``.trash-<name>`` beside it, which a start-up removes."""
    return path.with_name(TRASH_PREFIX + path.name)


def discard(path: Path) -> Path:
    """Take a directory out of the layout durably (renamed to ``trash_of(path)``); returns the new
    path, whose deletion a crash can no longer leave half-done."""
    trash = trash_of(path)
    os.rename(path, trash)
    fsync_path(path.parent)
    return trash


def remove_tree(path: Path) -> None:
    """Delete a directory so that a crash midway never leaves a half-deleted ``step_*``."""
    shutil.rmtree(discard(path), ignore_errors=True)


# ---- validation ---------------------------------------------------------------------------

def read_manifest(path: Path) -> dict:
    return json.loads((path / MANIFEST).read_text())


def file_checksums(manifest: dict) -> dict[str, tuple[int, str]]:
    """Each file of a manifest: its size and its checksum (of the manifest format's kind)."""
    key = CHECKSUMS[manifest["format"]].key
    return {name: (want["size"], want[key]) for name, want in manifest["files"].items()}


def validate(path: Path, verify_checksums: bool = True, name: str | None = None,
             read_later: Callable[[str], bool] | None = None) -> str | None:
    """None if ``path`` is a complete, intact checkpoint; otherwise the reason it is not.
    ``name``: the name it will have (a download still in its temporary directory).
    ``read_later``: files whose checksum the caller verifies as it reads them (a trainer's load
    that hashes what it reads); their presence and size are still checked here."""
    try:
        manifest = read_manifest(path)
    except FileNotFoundError:
        return "manifest.json is missing"
    except (OSError, ValueError) as e:
        return f"manifest.json is unreadable: {e}"
    checksum = CHECKSUMS.get(manifest.get("format"))
    if checksum is None:
        return f"manifest format {manifest.get('format')!r} is not one of {sorted(CHECKSUMS)}"
    if parse_name(name or path.name) != (manifest.get("step"), manifest.get("micro")):
        return f"manifest says step {manifest.get('step')}.{manifest.get('micro')}, directory is {name or path.name}"
    if ".metadata" not in manifest.get("files", {}):
        return "manifest lists no DCP .metadata file"
    for name, want in manifest["files"].items():
        try:
            size = (path / name).stat().st_size
        except FileNotFoundError:
            return f"{name} is missing"
        if size != want["size"]:
            return f"{name} has {size} bytes, manifest says {want['size']}"
    if verify_checksums:
        # One reader per file (a rank's shard each): the disk serves concurrent reads faster.
        names = [n for n in manifest["files"] if not (read_later and read_later(n))]
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(names)))) as pool:
            sums = pool.map(lambda n: checksum_file(path / n, manifest["format"]), names)
            for name, got in zip(names, sums):
                if got != manifest["files"][name].get(checksum.key):
                    return f"{name} fails its {checksum.label} checksum"
    return None


def quarantine(root: Path, path: Path, reason: str, log: Callable[..., None]) -> None:
    """Move a checkpoint that failed validation out of the resume path, keeping it."""
    dest_root = root / REJECTED
    dest_root.mkdir(exist_ok=True)
    dest = dest_root / f"{path.name}.{int(time.time() * 1000)}"
    os.rename(path, dest)
    try:
        (dest / "REJECTED_BECAUSE").write_text(reason + "\n")
    except OSError as e:  # a full disk must not stop the resume; the reason is in events.jsonl too
        log("quarantine_note_failed", name=path.name, error=str(e))
    fsync_path(root)


@dataclass
class ResumeChoice:
    path: Path | None
    manifest: dict | None
    rejected: list[tuple[str, str]]  # (name, reason) of newer checkpoints that failed validation
    latest_hint: str | None
    restored: bool = False  # brought from the remote tier: another copy than a local one of that name


def choose_resume(root: Path, verify_checksums: bool = True,
                  read_later: Callable[[str], bool] | None = None) -> ResumeChoice:
    """The newest checkpoint that validates; older ones are tried in turn. ``read_later``: as for
    ``validate``, and then the caller rejects a checkpoint whose load finds a file corrupt."""
    rejected: list[tuple[str, str]] = []
    latest = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else None
    for path in list_checkpoints(root):
        reason = validate(path, verify_checksums, read_later=read_later)
        if reason is None:
            return ResumeChoice(path, read_manifest(path), rejected, latest)
        rejected.append((path.name, reason))
    return ResumeChoice(None, None, rejected, latest)
