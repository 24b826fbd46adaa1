"""What happened: the records a run leaves behind, read back as plain data.

A trainer's run directory holds ``trajectory.jsonl`` (one record per optimizer step, appended
again by every restart) and ``events.jsonl`` (saves, commits, loads, rejections). The harness
adds ``history.jsonl``: every probe event of every rank and every action of the harness itself,
on one timeline.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSON-lines file; a torn last line (a writer killed mid-line) is ignored."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def trajectory(run_dir: Path) -> dict[int, dict]:
    """Step -> record; where a restart re-ran a step, the last record wins (the one that counts)."""
    return {r["step"]: r for r in read_jsonl(Path(run_dir) / "trajectory.jsonl")}


def trainer_events(run_dir: Path, kind: str | None = None) -> list[dict]:
    events = read_jsonl(Path(run_dir) / "events.jsonl")
    return [e for e in events if kind is None or e["event"] == kind]


def final_state(run_dir: Path) -> dict | None:
    path = Path(run_dir) / "final_state.json"
    return json.loads(path.read_text()) if path.is_file() else None


def trajectory_records(run_dir: Path) -> list[dict]:
    """Every step record in the order written, restarts included."""
    return read_jsonl(Path(run_dir) / "trajectory.jsonl")


class History:
    """The harness's timeline (``history.jsonl``): probe events and harness actions, appended as
    they happen, so a harness killed mid-run still leaves what it saw."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file = open(self.path, "a", buffering=1)
        self._lock = threading.Lock()

    def add(self, source: str, kind: str, **data) -> dict:
        entry = {"t": data.pop("t", None) or time.time(), "source": source, "kind": kind, **data}
        with self._lock:
            self._file.write(json.dumps(entry, sort_keys=True, default=str) + "\n")
        return entry

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_history(run_dir: Path) -> list[dict]:
    return read_jsonl(Path(run_dir) / "history.jsonl")


def timeline(run_dir: Path) -> list[dict]:
    """Harness actions, probe events and trainer events on one time-ordered list."""
    merged = read_history(run_dir) + [
        {"source": "trainer", "kind": e["event"], **{k: v for k, v in e.items() if k != "event"}}
        for e in trainer_events(run_dir)]
    return sorted(merged, key=lambda e: e.get("t", 0.0))


def snapshot_checkpoints(root: Path, verify_checksums: bool = True) -> dict:
    """What a resume would find in a checkpoint directory right now, validated independently of the
    trainer's own choice: each checkpoint and why it is invalid (None: valid), `latest`, strays."""
    from reference_trainer.checkpoint import LATEST, TMP_PREFIX, TRASH_PREFIX, list_checkpoints, validate

    root = Path(root)
    if not root.is_dir():
        return {"checkpoints": {}, "latest": None, "strays": [], "newest_valid": None}
    ckpts = {p.name: validate(p, verify_checksums) or dcp_problem(p) for p in list_checkpoints(root)}
    latest_path = root / LATEST
    latest = latest_path.read_text().strip() if latest_path.is_file() else None
    strays = sorted(p.name for p in root.iterdir() if p.name.startswith((TMP_PREFIX, TRASH_PREFIX)))
    valid = [n for n, reason in ckpts.items() if reason is None]
    return {"checkpoints": ckpts, "latest": latest, "strays": strays,
            "newest_valid": valid[0] if valid else None}


def dcp_problem(path: Path) -> str | None:
    """Why a DCP checkpoint directory is torn, judged from DCP's own ``.metadata`` alone (None: every
    byte range it references is there). Independent of any trainer's manifest, so it also judges a
    trainer whose manifest was written over partial files."""
    import torch.distributed.checkpoint as dcp

    if not (Path(path) / ".metadata").is_file():
        return ".metadata is missing (DCP never finished this save)"
    try:
        metadata = dcp.FileSystemReader(str(path)).read_metadata()
    except Exception as e:  # a torn pickle raises anything
        return f".metadata is unreadable: {type(e).__name__}: {e}"
    need: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(need.items()):
        f = Path(path) / name
        if not f.is_file():
            return f"{name} is missing (.metadata references it)"
        if f.stat().st_size < end:
            return f"{name} has {f.stat().st_size} bytes, .metadata references bytes up to {end}"
    return None
