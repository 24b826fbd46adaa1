"""What happened: the records a run leaves behind, read back as typed records or plain data.

A trainer's run directory holds ``trajectory.jsonl`` (one record per optimizer step, appended
again by every restart) and ``events.jsonl`` (saves, commits, loads, rejections). The harness
adds ``history.jsonl``: every probe event of every rank and every action of the harness itself,
on one timeline. Each of its lines is one record below (``source``, ``kind``, then its fields, the
nemesis's own account of a fault or a heal flattened in), and is read back as that record, so the
checks, plots and search read attributes. Files written before the records were typed have the
same lines and read the same; a line that is no record names its file, line and what is wrong.
"""

from __future__ import annotations

import json
import pickle
import re
import threading
import time
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from ckpt_chaos.probe.run_files import EVENTS, FINAL_STATE, HISTORY, TORCHRUN_LOG, TRAJECTORY


class HistoryError(ValueError):
    """A history line that is no record; the message names the file, the line and the problem."""


@dataclass(kw_only=True)
class Record:
    """One line of ``history.jsonl``: when (0: stamped as it is written), and (class-wide) its source
    and kind."""

    SOURCE: ClassVar[str] = "harness"
    KIND: ClassVar[str] = ""
    t: float = 0.0


@dataclass(kw_only=True)
class ProbeEvent(Record):
    """A rank (or another process of the job, by ``role``) reached a probe point."""

    SOURCE: ClassVar[str] = "probe"
    point: str  # on disk: the record's kind
    rank: int
    pid: int  # as the process saw it (in a container: its own namespace's)
    launch: int
    info: dict[str, Any] = field(default_factory=dict)
    role: str = "rank"  # "uploader" for the remote tier's uploader


@dataclass(kw_only=True)
class LaunchStarted(Record):
    KIND: ClassVar[str] = "launch"
    launch: int
    world_size: int
    pid: int  # the launcher's (node 0's on a multi-node backend)
    mode: str  # recovery.relaunch
    probe: bool = True
    backend: str | None = None  # multi-node backends: docker | netns | slurm
    nodes: int | None = None
    launcher_pids: list[int] | None = None
    # slurm: job_id, restart_count (SLURM_RESTART_COUNT its tasks see), node_list, requeued_by
    # (slurm: Slurm's own requeue, past a grace period or after a lost node; job: the batch script
    # requeued itself after a preemption it survived; harness: scontrol requeue of a job that ended
    # without finishing, as an operator does)
    slurm: dict | None = None


@dataclass(kw_only=True)
class FaultFired(Record):
    """A fault acted; ``detail`` is its nemesis's account (ranks, pids, rule, checkpoint, files, lost...)."""

    KIND: ClassVar[str] = "fault"
    index: int  # in the scenario's faults
    fault: str  # its kind
    target: str
    launch: int
    at: dict[str, Any]  # the event it fired on: point, rank, info
    snapshot_before: dict | None = None  # the checkpoint directory just before (probe events only)
    remote_after: dict | None = None  # what the remote tier held just after
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def pids(self) -> list[int]:
        return self.detail.get("pids", [])

    @property
    def unreached(self) -> str | None:
        """Why the fault acted on no process (its targets were not known), or None where it acted."""
        return self.detail.get("unreached")


@dataclass(kw_only=True)
class Healed(Record):
    """The end of a launch: what the nemeses undid (faultfs rules and what they did, ballast, toxics)."""

    KIND: ClassVar[str] = "heal"
    launch: int
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def injected(self) -> list[dict]:
        """The calls faultfs failed in this launch (each with its rule, op, path, errno, pid, t)."""
        return self.detail.get("faultfs", {}).get("injected", [])


@dataclass(kw_only=True)
class Exited(Record):
    """A launch ended: its exit status and what a resume would find."""

    KIND: ClassVar[str] = "exit"
    launch: int
    rc: int | None  # None: killed at the deadline, or restarted by the trainer itself (``restarted``)
    snapshot: dict  # history.snapshot_checkpoints of the checkpoint directory
    deadline_hit: bool = False
    grace_expired: list[float] = field(default_factory=list)  # a preemption's grace ran out at these times
    remote: dict | None = None  # the remote tier's snapshot
    complete: dict | None = None  # a [command] trainer: what it counts as complete checkpoints, path -> size, mtime_ns
    # a [command] trainer whose complete is a pointer file: what it named (run.command.pointer: file, content,
    # checkpoint, problem); a problem (missing, empty, garbled, dangling) is why nothing was complete
    pointer: dict | None = None
    files: dict | None = None  # a [command] trainer: every file in its checkpoint folder, path -> size
    slurm: dict | None = None  # the slurm backend: the job's JobState, Reason, ExitCode, Restarts as the run ended
    # recovery.relaunch = "self": the trainer restarted its workers (no exit status); the state is what the
    # restarted group found, taken at its first point, before it loaded anything
    restarted: bool = False


@dataclass(kw_only=True)
class RankExited(Record):
    KIND: ClassVar[str] = "rank_exit"
    launch: int
    rank: int
    pid: int


@dataclass(kw_only=True)
class DeadlineHit(Record):
    KIND: ClassVar[str] = "deadline"
    launch: int
    deadline_s: float


@dataclass(kw_only=True)
class Reaped(Record):
    """Stopped ranks killed as torchrun began to close them."""

    KIND: ClassVar[str] = "reap_stopped"
    launch: int
    pids: list[int]
    why: str = ""


@dataclass(kw_only=True)
class TornDown(Record):
    """Nodes still running ``after_s`` after another failed: the orchestrator killed them."""

    KIND: ClassVar[str] = "teardown"
    launch: int
    nodes: list[int]
    after_s: float


@dataclass(kw_only=True)
class Held(Record):
    """A fault's trigger matched before the fault it waits for (``when.after``) had fired, and the hold
    ended without it firing: ``why``."""

    KIND: ClassVar[str] = "held"
    index: int
    launch: int
    after: int
    at: dict[str, Any]  # the event it was held at: point, rank, info
    held_s: float
    why: str


@dataclass(kw_only=True)
class HarnessError(Record):
    KIND: ClassVar[str] = "error"
    error: str


HARNESS_RECORDS: dict[str, type[Record]] = {c.KIND: c for c in (
    LaunchStarted, FaultFired, Healed, Exited, RankExited, DeadlineHit, Reaped, TornDown, Held, HarnessError)}
R = TypeVar("R", bound=Record)


def to_line(record: Record) -> str:
    # optional fields that are not set are left out, as the lines have always been written
    data = {f.name: getattr(record, f.name) for f in fields(record) if f.name not in ("detail", "point")
            and not (f.default is None and getattr(record, f.name) is None)}
    data.update(getattr(record, "detail", {}))
    kind = record.point if isinstance(record, ProbeEvent) else record.KIND
    if isinstance(record, ProbeEvent) and record.role == "rank":
        del data["role"]
    return json.dumps({**data, "source": record.SOURCE, "kind": kind}, sort_keys=True, default=str)


def from_line(data: dict, where: str = "history") -> Record:
    """The record a parsed history line holds; ``where`` (file:line) names it in errors."""
    source, kind = data.get("source"), data.get("kind")
    if source == "probe":
        cls: type[Record] = ProbeEvent
        data = {**data, "point": kind}
    elif source == "harness" and kind in HARNESS_RECORDS:
        cls = HARNESS_RECORDS[kind]
    else:
        raise HistoryError(f"{where}: not a history record (source {source!r}, kind {kind!r}); harness records "
                           f"are {', '.join(HARNESS_RECORDS)}: was this file written by ckpt-chaos?")
    names = {f.name for f in fields(cls)}
    values = {k: v for k, v in data.items() if k in names and k not in ("source", "kind")}
    if "detail" in names:
        values["detail"] = {k: v for k, v in data.items() if k not in names and k not in ("source", "kind")}
    missing = [f.name for f in fields(cls) if f.name not in values
               and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise HistoryError(f"{where}: {source} record {kind!r} lacks {', '.join(missing)}; the file is damaged or "
                           "from another version: re-run the scenario")
    return cls(**values)


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
    return {r["step"]: r for r in read_jsonl(Path(run_dir) / TRAJECTORY)}


def trainer_events(run_dir: Path, kind: str | None = None) -> list[dict]:
    events = read_jsonl(Path(run_dir) / EVENTS)
    return [e for e in events if kind is None or e["event"] == kind]


def final_state(run_dir: Path) -> dict | None:
    path = Path(run_dir) / FINAL_STATE
    return json.loads(path.read_text()) if path.is_file() else None


def trajectory_records(run_dir: Path) -> list[dict]:
    """Every step record in the order written, restarts included."""
    return read_jsonl(Path(run_dir) / TRAJECTORY)


def step_loss(rec: dict) -> float:
    """A step record's loss: the reference trainer's ``loss``, or else the sum of the probe layer's
    ``loss_hex`` (a [command] trainer's: comma-separated ``float.hex`` of each backward's loss)."""
    if rec.get("loss") is not None:
        return float(rec["loss"])
    return sum(float.fromhex(x) for x in rec.get("loss_hex", "").split(",") if x)


class History:
    """The harness's timeline (``history.jsonl``): probe events and harness actions, appended as
    they happen, so a harness killed mid-run still leaves what it saw."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file = open(self.path, "a", buffering=1)
        self._lock = threading.Lock()

    def add(self, record: Record) -> Record:
        if not record.t:
            record.t = time.time()
        with self._lock:
            self._file.write(to_line(record) + "\n")
        return record

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_history(run_dir: Path) -> list[Record]:
    """The records of a run's ``history.jsonl``, in the order written; a torn last line (a harness
    killed mid-line) is ignored."""
    path = Path(run_dir) / HISTORY
    if not path.is_file():
        return []
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        out.append(from_line(data, f"{path}:{n}"))
    return out


def launch_logs(run_dir: Path, history: list[Record] | None = None) -> dict[int, str] | None:
    """Launch -> its part of ``torchrun.log``: each launch opens its part with a ``$ command`` line.
    None where the parts and the history's launches do not pair up (a backend that logs elsewhere)."""
    log = Path(run_dir) / TORCHRUN_LOG
    if not log.exists():
        return None
    parts = re.split(r"(?m)^\$ ", log.read_text(errors="replace"))[1:]
    launches = [e.launch for e in of(read_history(run_dir) if history is None else history, LaunchStarted)]
    return dict(zip(launches, parts)) if len(parts) == len(launches) else None


def named(part: str, keys: list[str]) -> list[str]:
    """The keys a launch's part of ``torchrun.log`` (``launch_logs``) names as words, in what the job
    printed: its first line, the harness's echo of the command line, carries every option it was
    given and is left out."""
    printed = part.split("\n", 1)[1] if "\n" in part else ""
    return [k for k in keys if re.search(rf"\b{re.escape(k)}\b", printed)]


def of(records: list[Record], cls: type[R], launch: int | None = None) -> list[R]:
    """The records of one type (of one launch)."""
    return [r for r in records if isinstance(r, cls) and (launch is None or getattr(r, "launch", None) == launch)]


# The facts of the reference layout's manifest that describe the training a checkpoint holds (besides
# its files): `ckpt-chaos ckpts` lists them, and a tool choosing a checkpoint reads them.
MANIFEST_FACTS = ("step", "tokens_seen", "world_size")


def snapshot_checkpoints(root: Path, verify_checksums: bool = True) -> dict:
    """What a resume would find in a checkpoint directory right now, validated independently of the
    trainer's own choice: each checkpoint and why it is invalid (None: valid), `latest`, strays, and
    what was kept aside in ``rejected/`` with the reason noted beside it (None: no note)."""
    from ckpt_chaos.probe.layout import LATEST, MANIFEST, TMP_PREFIX, TRASH_PREFIX, list_checkpoints, validate

    root = Path(root)
    if not root.is_dir():
        return {"checkpoints": {}, "latest": None, "strays": [], "newest_valid": None, "rejected": {}}
    ckpts = {p.name: validate(p, verify_checksums) or dcp_problem(p) for p in list_checkpoints(root)}
    latest_path = root / LATEST
    latest = latest_path.read_text().strip() if latest_path.is_file() else None
    # The layout's temporary and trash entries, and any other hidden directory: a trainer's work in
    # progress (an uploader's staging, say), which a finished job has no reason to keep.
    strays = sorted(p.name for p in root.iterdir()
                    if p.name.startswith((TMP_PREFIX, TRASH_PREFIX)) or (p.name.startswith(".") and p.is_dir()))
    valid = [n for n, reason in ckpts.items() if reason is None]
    facts = {}  # what each valid checkpoint's manifest says of the training it holds
    for n in valid:
        try:
            m = json.loads((root / n / MANIFEST).read_text())
        except (OSError, ValueError):
            continue
        facts[n] = {k: m[k] for k in MANIFEST_FACTS if k in m} if isinstance(m, dict) else {}
    # the bytes of each file a save in progress has on disk: where a fault landed in its write
    writing = {f"{d}/{f.name}": f.stat().st_size for d in strays if d.startswith(TMP_PREFIX)
               for f in sorted((root / d).iterdir()) if f.is_file()}
    return {"checkpoints": ckpts, "latest": latest, "strays": strays, "newest_valid": valid[0] if valid else None,
            "writing": writing, "rejected": kept_aside(root), "manifests": facts}


def kept_aside(root: Path) -> dict[str, str | None]:
    """The checkpoints kept aside in a checkpoint directory's ``rejected/``, each with the reason noted
    beside it (``REJECTED_BECAUSE``; None: no note)."""
    from ckpt_chaos.probe.layout import REJECTED

    aside = Path(root) / REJECTED
    if not aside.is_dir():
        return {}
    out = {}
    for p in sorted(aside.iterdir()):
        if p.is_dir():
            try:
                out[p.name] = (p / "REJECTED_BECAUSE").read_text(errors="replace").strip()[:500] or None
            except OSError:
                out[p.name] = None
    return out


def dcp_problem(path: Path) -> str | None:
    """Why a DCP checkpoint directory is torn, judged from DCP's own ``.metadata`` alone (None: every
    byte range it references is there). Independent of any trainer's manifest, so it also judges a
    trainer whose manifest was written over partial files."""
    if not (Path(path) / ".metadata").is_file():
        return ".metadata is missing (DCP never finished this save)"
    try:
        metadata = _dcp_metadata(Path(path))
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


class _TorchStub:
    """Stands in for a torch class while DCP's ``.metadata`` is read without torch: the storage
    index (file, offset, length per chunk) is plain Python inside torch's dataclasses."""

    def __init__(self, *args, **kwargs):
        self.args = args
        self.__dict__.update(kwargs)

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:  # (__dict__, __slots__ values)
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.state = state


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module.split(".")[0] == "torch":
            return type(name, (_TorchStub,), {})
        return super().find_class(module, name)


def _dcp_metadata(path: Path):
    """DCP's ``.metadata`` of a checkpoint directory, read without importing torch (which costs the
    harness seconds, and would be paid while a rank waits at a fault's probe point); DCP's own reader
    where that does not give the storage index."""
    with open(path / ".metadata", "rb") as fh:
        metadata = _MetadataUnpickler(fh).load()
    infos = getattr(metadata, "storage_data", None)
    if isinstance(infos, dict) and all(hasattr(i, "relative_path") and hasattr(i, "length") for i in infos.values()):
        return metadata
    import torch.distributed.checkpoint as dcp

    return dcp.FileSystemReader(str(path)).read_metadata()
