"""What happened: the records a run leaves behind, read back as plain data.

A trainer's run directory holds ``trajectory.jsonl`` (one record per optimizer step, appended
again by every restart) and ``events.jsonl`` (saves, commits, loads, rejections). The harness
adds ``history.jsonl``: every probe event of every rank and every action of the harness itself,
on one timeline.
"""

from __future__ import annotations

import json
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
