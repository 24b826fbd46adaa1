"""The cache of verdicts: a mutant's verdict (killed or survived) kept under the hash of its mutated
file, its operator and everything else it depends on (``fingerprint``), so that a later run takes
it instead of running the mutant again, until one of those changes."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from ckpt_chaos.mutation import ROOT
from ckpt_chaos.mutation.scope import FINGERPRINTED

CACHE = ROOT / "build" / "mutation-cache"


def fingerprint(base: dict, files: list[str], pristine: Path = ROOT,
                fingerprinted: tuple[str, ...] = FINGERPRINTED) -> str:
    """What else a mutant's verdict depends on: the tracked sources of the trainer and the harness
    (every target file's pristine text among them; an example's folder, its scenarios with it, with
    ``--example``) and the scenarios that reach each target line."""
    h = hashlib.sha256()
    listed = subprocess.run(["git", "ls-files", "-z", *fingerprinted], cwd=pristine, capture_output=True)
    for name in sorted(filter(None, listed.stdout.decode().split("\0"))):
        path = pristine / name
        if path.is_file() and name.endswith((".py", ".toml")):
            h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    for f in sorted(files):
        h.update(json.dumps([f, base["reached"].get(f, {})], sort_keys=True).encode())
    return h.hexdigest()


def cache_key(m: dict, print_: str) -> str:
    """A verdict's key: the mutated file's hash, the operator, and the fingerprint of the rest."""
    return hashlib.sha256("\0".join((m["file"], m["operator"], m["mutated_sha"], print_)).encode()).hexdigest()


def cached(cache: Path | None, m: dict, print_: str) -> dict | None:
    if cache is None:
        return None
    path = cache / f"{cache_key(m, print_)}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def remember(cache: Path | None, mutants: list[dict], print_: str) -> int:
    """Keep the verdict of each mutant run here (killed or survived: a timeout or an error says
    nothing about the mutant); returns how many were new."""
    if cache is None:
        return 0
    cache.mkdir(parents=True, exist_ok=True)
    new = 0
    for m in mutants:
        status = m.get("run_status", m["status"])
        if status not in ("killed", "survived") or m.get("cached") or "wall_s" not in m:
            continue
        path = cache / f"{cache_key(m, print_)}.json"
        if not path.exists():
            keep = {k: m[k] for k in ("status", "scenario", "checks", "detail", "lines", "planned", "ran", "wall_s",
                                      "exit") if k in m}
            keep["status"] = status
            path.write_text(json.dumps({**keep, "file": m["file"], "operator": m["operator"], "diff": m["diff"]}))
            new += 1
    return new
