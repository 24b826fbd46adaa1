"""What a trainer does when it saves, read from its fault-free (golden) run: the profile the audit
generates its scenarios from.

The golden run of a ``[command]`` trainer (``run/command.py``) keeps the probe layer's events
(``probe.jsonl``: steps, Python's writes, fsyncs, renames, removals, ``torch.save``) and the fanotify
recorder's (``files.jsonl``: every process's creates, closes and renames, native writers' too). From
them, for each save: every file written, under which names, by which rank and which writer; what was
fsynced; how the save commits (a temporary name renamed, a temporary folder renamed, in place, a
pointer file written last); and across saves the cadence, the retention and the rule by which the
trainer finds its newest complete checkpoint (``command.complete``). Each inference says what it
rests on (``why``); where the records do not settle one, ``problems`` names what was seen and the
key to declare.

The profile also carries, for each save, the probe events a fault can be aimed at (``marks``): the
event right before the commit and the save's last event, each as a trigger table (point, rank, path,
nth) that fires there in a run that does what the golden run did. Generation works from the profile
alone (``generate.py``), so the same profile gives the same scenario files.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ckpt_chaos.check.history import read_jsonl
from ckpt_chaos.probe import follow
from ckpt_chaos.probe.run_files import FILES, GOLDEN, LISTING, PROBE_LOG, TRAJECTORY

# Python's writers, by the ``via`` its file.done carries; a file whose bytes the layer did not see
# pass through Python was written natively (Rust, C, a mapping): only faultfs's points reach it.
NATIVE = "native"
POINTER_MAX_BYTES = 256  # a pointer names one checkpoint: a name or a number, never more than a line
FILE_EVENTS = ("file.done", "ckpt.shard.done", "file.fsync", "file.rename", "file.remove", "file.rmtree",
               "ckpt.stage", "file.copy")


class DiscoveryError(ValueError):
    """The golden run does not show what the audit needs; the message says what it saw and what to declare."""


@dataclass
class SeenFile:
    """One file a save wrote, paths relative to the run directory."""

    rank: int
    names: list[str]
    """Written under the first, then each name a rename gave it (the last: where it stays)."""
    size: int
    writer: str
    """How its bytes were written: torch.save, open, os.write (Python: file.write reports them), or native."""
    role: str
    """What it is across saves and ranks: its last name with the step's and the rank's numbers as ``*``."""
    commit: str
    """in-place | rename (a temporary name) | folder-rename (its folder was renamed)."""
    fsynced: bool = False

    @property
    def final(self) -> str:
        return self.names[-1]

    @property
    def point(self) -> str:
        """The point whose writes of this file a trigger aims at (faultfs's for a native writer)."""
        if self.writer == NATIVE:
            return "faultfs.write"
        return "ckpt.shard.write" if self.names[0].endswith(".distcp") else "file.write"


@dataclass
class Save:
    step: int
    """The last optimizer step before it began."""
    entry: str | None
    """Its entry in the checkpoint folder (a file or a folder, relative to it), what a resume lists."""
    files: list[SeenFile] = field(default_factory=list)
    fsynced: list[str] = field(default_factory=list)
    """Paths fsynced during it, files and folders, in order."""
    pointer: str | None = None
    """The pointer file it rewrote last (relative to the run directory), if any."""
    commit: str = "in-place"
    """How it becomes visible: in-place | rename | folder-rename, '+ pointer' when a pointer moves last."""
    marks: dict[str, dict] = field(default_factory=dict)
    """Triggers at events of it: ``before_commit`` (the last event before its rename or pointer),
    ``commit`` (the rename or pointer write itself), ``end`` (its last event; where several ranks
    write, the next step's beginning, after them all)."""

    @property
    def ranks(self) -> list[int]:
        return sorted({f.rank for f in self.files})

    @property
    def roles(self) -> list[SeenFile]:
        """One file of each role (rank 0's, else the lowest rank's), in the order written."""
        out: dict[str, SeenFile] = {}
        for f in sorted(self.files, key=lambda f: f.rank):
            out.setdefault(f.role, f)
        return sorted(out.values(), key=self.files.index)


@dataclass
class Profile:
    command: dict
    """The ``[command]`` table it ran (argv, launcher, key, env, relaunch_argv...)."""
    world_size: int
    golden: str
    """The golden run's folder."""
    steps: int
    saves: list[Save]
    save_every: int | None
    complete: str | dict | None
    keep_last: int | None
    why: dict[str, str] = field(default_factory=dict)
    """What each inference rests on: cadence, complete, retention, writers."""
    problems: list[str] = field(default_factory=list)
    """What could not be inferred, each with the key to declare."""
    loads_with_torch: bool = False
    """The probe layer armed torch.load: a resume through it fires load.begin."""
    relaunch: dict | None = None
    """What the stop-and-relaunch run showed (``relaunch.Relaunch``); None where none ran."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Profile":
        saves = [Save(**{**s, "files": [SeenFile(**f) for f in s["files"]]}) for s in d["saves"]]
        return cls(**{**d, "saves": saves})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @property
    def ckpt_dir(self) -> str:
        return self.command.get("ckpt_dir", "checkpoints")


# ---- reading the records ----------------------------------------------------------------------------

def _native_files(records: list[dict], python: list[dict]) -> list[tuple[dict, float]]:
    """Files the fanotify recorder saw written that no Python file.done reported, as ``follow.files``
    gives them (names through the renames), each with the time it was closed."""
    # fanotify's records in the shape of faultfs's points, so that follow.files follows their renames
    ops = {"close": "faultfs.done", "rename": "faultfs.rename", "delete": "faultfs.remove"}
    events, closed = [], []
    written, renamed_open = set(), {}  # a file renamed before its close (safetensors): the name it started under
    for r in records:
        if r.get("op") not in ops or r.get("dir") or not r.get("path") or r.get("launch", 0) != 0:
            continue
        if r["op"] == "close" and not r.get("wrote"):
            continue
        if r["op"] == "rename" and r.get("src") and r["src"] not in written:
            renamed_open[r["path"]] = renamed_open.pop(r["src"], r["src"])
        opened = r.get("opened") or (renamed_open.pop(r["path"], None) if r["op"] == "close" else None)
        if r["op"] == "close":
            written.add(r["path"])
        events.append({"point": ops[r["op"]], "rank": r.get("rank") if r.get("rank") is not None else 0,
                       "info": {"path": r["path"], "src": r.get("src"), "bytes": r.get("size") or 0,
                                "opened": opened}})
        if r["op"] == "close":
            closed.append(r.get("t", 0.0))
    seen = {n for f in python for n in f["names"]}
    found = follow.files(events)
    return [(f, t) for f, t in zip(found, closed) if not seen & set(f["names"]) and f["size"] > 0]


def _step_at(timeline: list[tuple[float, int]], t: float) -> int:
    """The last step a rank ended at or before time ``t``."""
    step = 0
    for when, s in timeline:
        if when > t:
            break
        step = s
    return step


def _number(step: int) -> re.Pattern:
    return re.compile(rf"(?<!\d)0*{step}(?!\d)")


def _role(name: str, step: int, rank: int) -> str:
    """A file's role: its name with the save's step (padded as written) and any other number masked."""
    return re.sub(r"\d+", "*", _number(step).sub("*", name)) if step else re.sub(r"\d+", "*", name)


def _commit(names: list[str]) -> str:
    if len(names) == 1:
        return "in-place"
    first, last = Path(names[0]), Path(names[-1])
    return "rename" if first.name != last.name else "folder-rename"


def _trigger(events: list[dict], i: int) -> dict:
    """A trigger that fires at the golden run's event ``i`` in a run that does the same: its point, rank
    and path, and its ordinal among that rank's events of the same point and path."""
    e = events[i]
    rank, point, path = e.get("rank", 0), e["point"], (e.get("info") or {}).get("path")
    nth = sum(1 for x in events[:i + 1] if x["point"] == point and x.get("rank", 0) == rank
              and (x.get("info") or {}).get("path") == path)
    out = {"point": point, "rank": rank}
    if path:
        out["path"] = glob_escape(path)
    if nth > 1:
        out["nth"] = nth
    return out


def glob_escape(path: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", path)


def load_golden(golden: Path) -> tuple[list[dict], list[dict], dict, dict]:
    return (read_jsonl(golden / PROBE_LOG), read_jsonl(golden / FILES),
            json.loads((golden / GOLDEN).read_text()),
            json.loads((golden / LISTING).read_text()) if (golden / LISTING).is_file() else {})


def discover(golden: Path, declared: dict | None = None) -> Profile:
    """The profile of the golden run in ``golden``; ``declared``: keys the user gave (``complete``,
    ``save_every``, ``keep_last``), which win over what is inferred and are said to be declared."""
    declared = declared or {}
    events, records, meta, listing = load_golden(golden)
    command, world = meta["command"], meta["world_size"]
    ckpt = command.get("ckpt_dir", "checkpoints").rstrip("/")
    trajectory = read_jsonl(golden / TRAJECTORY)
    steps = max((r["step"] for r in trajectory), default=0)

    timeline: dict[int, list[tuple[float, int]]] = {}
    for e in events:
        if e["point"] == "step.end":
            timeline.setdefault(e.get("rank", 0), []).append((e.get("t", 0.0), e["info"]["step"]))
    for t in timeline.values():
        t.sort()

    # every written file, with the step after which it was closed: Python's (the probe layer's), then
    # those only faultfs (a golden run made with it) or fanotify saw, whose writer is native
    layer = [e for e in events if not e["point"].startswith("faultfs.")]
    dones = [e for e in layer if e["point"] in follow.DONE and (e.get("info") or {}).get("path")]
    python = follow.files(layer)
    written: list[tuple[dict, int, str, float]] = []
    for f, e in zip(python, dones):
        info = e["info"]
        writer = NATIVE if info.get("native") and not f.get("python_bytes") else info.get("via") or "open"
        written.append((f, _step_at(timeline.get(f["rank"], []), e.get("t", 0.0)), writer, e.get("t", 0.0)))
    faultfs = [{**e, "info": {**e["info"], "src": e["info"].get("src")}} for e in events
               if e["point"] in ("faultfs.done", "faultfs.rename", "faultfs.remove")]
    as_records = [{"op": {"faultfs.done": "close", "faultfs.rename": "rename", "faultfs.remove": "delete"}[e["point"]],
                   "rank": e.get("rank", 0), "t": e.get("t", 0.0), "path": e["info"].get("path"),
                   "src": e["info"].get("src"), "wrote": True, "size": e["info"].get("bytes"),
                   "opened": e["info"].get("opened")} for e in faultfs]
    native = _native_files(as_records, python) or _native_files(records, python)
    for f, t in native:
        written.append((f, _step_at(timeline.get(f["rank"], []), t), NATIVE, t))
    inside = [(f, s, w) for f, s, w, _ in sorted(written, key=lambda x: x[3]) if f["names"][-1].startswith(ckpt + "/")]
    if not inside:
        raise DiscoveryError(f"the trainer wrote nothing under {{ckpt_dir}} ({ckpt}/ of its run) in its fault-free "
                             "run: pass {ckpt_dir} in its command where its checkpoint folder goes (e.g. "
                             "--ckpt-dir {ckpt_dir}), or save more often than every "
                             f"{steps} steps")

    by_step: dict[int, list[SeenFile]] = {}
    for f, step, writer in inside:
        rel = f["names"][-1][len(ckpt) + 1:]
        by_step.setdefault(step, []).append(SeenFile(
            rank=f["rank"], names=f["names"], size=f["size"], writer=writer,
            role=f"{ckpt}/{_role(rel, step, f['rank'])}", commit=_commit(f["names"])))
    fsyncs = [(e, _step_at(timeline.get(e.get("rank", 0), []), e.get("t", 0.0))) for e in events
              if e["point"] == "file.fsync" and (e.get("info") or {}).get("path", "").startswith(ckpt)]

    # a file rewritten under the same last name in every save is a pointer (or state kept beside them)
    counts = Counter(f.final for fs in by_step.values() for f in fs)
    saves = []
    for step in sorted(by_step):
        if step == 0:
            continue  # written before the first step: the trainer's setup, not a checkpoint
        files = by_step[step]
        data = [f for f in files if counts[f.final] == 1 or len(by_step) == 1]
        entries = sorted({f.final[len(ckpt) + 1:].split("/")[0] for f in data})
        numbered = [n for n in entries if _number(step).search(n)]
        entry = numbered[0] if len(numbered) == 1 else (entries[0] if len(entries) == 1 else None)
        s = Save(step=step, entry=entry, files=files,
                 fsynced=list(dict.fromkeys(e["info"]["path"] for e, st in fsyncs if st == step)))
        for f in files:
            f.fsynced = any(n in s.fsynced for n in f.names)
        rewritten = [f for f in files if f not in data and f.size <= POINTER_MAX_BYTES]
        if rewritten:
            s.pointer = rewritten[-1].final
        kinds = {f.commit for f in data}
        s.commit = ("folder-rename" if "folder-rename" in kinds else "rename" if kinds == {"rename"}
                    else "in-place" if kinds == {"in-place"} else "mixed") + (" + pointer" if s.pointer else "")
        s.marks = _marks(events, timeline, s, ckpt)
        saves.append(s)
    if not saves:
        raise DiscoveryError(f"the trainer wrote under {ckpt}/ only before its first optimizer step: no checkpoint "
                             f"was saved in {steps} steps; make the run long enough for two saves")

    p = Profile(command=command, world_size=world, golden=str(golden), steps=steps, saves=saves,
                save_every=None, complete=None, keep_last=None)
    p.loads_with_torch = any("torch.load" in (e.get("info") or {}).get("armed", ()) for e in events
                             if e["point"] == "probe.armed")
    _cadence(p, declared)
    _complete(p, declared, ckpt)
    _retention(p, declared, listing, ckpt)
    writers = Counter(f.writer for s in saves for f in s.files)
    p.why["writers"] = ", ".join(f"{w}: {n} file(s)" for w, n in sorted(writers.items())) + (
        "; native files are reached through faultfs (its points need root and FUSE)" if NATIVE in writers else "")
    return p


def _marks(events: list[dict], timeline: dict, s: Save, ckpt: str) -> dict[str, dict]:
    """Triggers at the save's events: its commit (the rename of its data, else its pointer's write),
    the event before it on that rank, and its last event."""
    mine = [i for i, e in enumerate(events) if e["point"] in FILE_EVENTS
            and _step_at(timeline.get(e.get("rank", 0), []), e.get("t", 0.0)) == s.step
            and (e.get("info") or {}).get("path", "").startswith(ckpt)]
    if not mine:
        return {}
    out = {"end": _trigger(events, mine[-1])}
    later = any(e["point"] == "step.begin" and e["info"].get("step") == s.step + 1 for e in events)
    if len(s.ranks) > 1 and later:
        # ranks save side by side, and the one that finished last in the golden run may not finish last
        # in another; the next optimizer step comes after the backward whose collectives wait for them all
        out["end"] = {"point": "step.begin", "rank": 0, "step": s.step + 1}
    # the commit: the pointer's first event where it has one (its own temporary file is harmless),
    # else the rename that puts the checkpoint's entry (a file or a folder) in place
    entry = f"{ckpt}/{s.entry}" if s.entry else None
    renames = [i for i in mine if events[i]["point"] == "file.rename" and events[i]["info"].get("path") == entry]
    pointer = [i for i in mine if s.pointer and events[i]["point"] in ("file.rename", "file.done")
               and events[i]["info"].get("path") in {n for f in s.files if f.final == s.pointer for n in f.names}]
    first = (pointer or renames or [None])[0]
    if first is not None:
        commit = next((i for i in pointer if events[i]["point"] == "file.rename"), first)
        out["commit"] = _trigger(events, commit)
        rank = events[first].get("rank", 0)
        data = {n for f in s.files if f.final != s.pointer for n in f.names}
        before = [i for i in mine if i < first and events[i].get("rank", 0) == rank
                  and events[i]["point"] in ("file.done", "ckpt.shard.done", "file.fsync")
                  and events[i]["info"].get("path") in data | {ckpt} | {n.rsplit("/", 1)[0] for n in data}]
        if before:
            out["before_commit"] = _trigger(events, before[-1])
    return out


def _cadence(p: Profile, declared: dict) -> None:
    steps = [s.step for s in p.saves]
    if declared.get("save_every"):
        p.save_every = int(declared["save_every"])
        p.why["cadence"] = f"declared: every {p.save_every} steps (saves seen after steps {steps})"
        return
    gaps = Counter(b - a for a, b in zip(steps, steps[1:]))
    if gaps:
        p.save_every = gaps.most_common(1)[0][0]
        p.why["cadence"] = f"every {p.save_every} steps: saves after steps {', '.join(map(str, steps))}"
    else:
        p.save_every = steps[0]
        p.why["cadence"] = (f"one save, after step {steps[0]}: taken as every {steps[0]} steps (a longer run "
                            "shows more; declare save_every otherwise)")


def _complete(p: Profile, declared: dict, ckpt: str) -> None:
    if declared.get("complete"):
        p.complete = declared["complete"]
        p.why["complete"] = f"declared: {p.complete!r}"
        return
    entries = [(s.step, s.entry) for s in p.saves]
    pointers = {s.pointer for s in p.saves if s.pointer}
    if len(pointers) == 1 and all(s.pointer for s in p.saves):
        ptr = pointers.pop()
        sizes = {s.step: next(f.size for f in s.files if f.final == ptr) for s in p.saves}
        rel = ptr[len(ckpt) + 1:]
        if all(e and sizes[st] in (len(e), len(e) + 1) for st, e in entries):
            p.complete = {"pointer": rel}
            p.why["complete"] = (f"a pointer: {ptr} is rewritten last in every save with as many bytes as the name "
                                 f"of that save's checkpoint ({entries[-1][1]}), so it names it")
            return
        if all(e and sizes[st] in (len(str(st)), len(str(st)) + 1) for st, e in entries):
            e = entries[-1][1]
            m = _number(entries[-1][0]).search(e)
            digits = m.group(0)
            fmt = e[:m.start()] + ("{:0%dd}" % len(digits) if digits.startswith("0") else "{:d}") + e[m.end():]
            p.complete = {"pointer": rel, "format": fmt}
            p.why["complete"] = (f"a pointer: {ptr} is rewritten last in every save with as many bytes as the step "
                                 f"number, and each save's checkpoint is named by it ({e}): format {fmt!r}")
            return
        p.problems.append(f"{ptr} is rewritten in every save ({', '.join(f'{sizes[st]} bytes' for st, _ in entries)}) "
                          "but its size fits neither the checkpoint's name nor its step: declare complete = "
                          f'{{ pointer = "{rel}" }} (with format = "..." for a number), or a glob')
    if all(e and _number(st).search(e) for st, e in entries):
        globs = {_number(st).sub("*", e) for st, e in entries}
        if len(globs) == 1:
            p.complete = globs.pop()
            names = ", ".join(e for _, e in entries)
            p.why["complete"] = (f"a glob: each save's checkpoint is named by its step ({names}); "
                                 f"the trainer is taken to resume from the newest {p.complete}")
            return
    seen = ", ".join(f"after step {st}: {e or 'several entries'}" for st, e in entries)
    p.problems.append(f"no rule for the newest complete checkpoint: the saves' entries are not named by their step "
                      f"({seen}); declare complete (a glob in the checkpoint folder, e.g. \"step_*\", or "
                      "{ pointer = \"latest\" })")


def _retention(p: Profile, declared: dict, listing: dict, ckpt: str) -> None:
    if declared.get("keep_last"):
        p.keep_last = int(declared["keep_last"])
        p.why["retention"] = f"declared: the newest {p.keep_last} kept"
        return
    entries = [s.entry for s in p.saves if s.entry]
    left = sorted({k[len(ckpt) + 1:].split("/")[0] for k in listing if k.startswith(ckpt + "/")} & set(entries))
    if len(left) < len(entries) and left:
        p.keep_last = len(left)
        p.why["retention"] = (f"{len(entries)} saves, {len(left)} left at the end ({', '.join(left)}): the newest "
                              f"{p.keep_last} kept")
    else:
        p.why["retention"] = f"every checkpoint kept ({len(left)} of {len(entries)} left at the end)"


# ---- the profile as a person reads it -------------------------------------------------------------------

def describe(p: Profile) -> list[str]:
    c = p.command
    lines = [f"trainer: {' '.join(c['argv'])} ({c.get('launcher', 'torchrun')}, {p.world_size} ranks, "
             f"{p.steps} steps)", f"golden run: {p.golden}",
             f"cadence: {p.why.get('cadence', '?')}",
             f"complete: {p.complete!r}  ({p.why.get('complete', 'not inferred')})",
             f"retention: {p.why.get('retention', '?')}",
             f"writers: {p.why.get('writers', '?')}"]
    for s in p.saves:
        lines.append(f"save after step {s.step}: entry {s.entry or '?'}, commit {s.commit}, ranks "
                     f"{', '.join(map(str, s.ranks))}" + (f", pointer {s.pointer}" if s.pointer else ""))
        for f in s.files:
            lines.append(f"  rank {f.rank} {' -> '.join(f.names)}  {f.size} B  {f.writer}  {f.commit}"
                         + ("  fsynced" if f.fsynced else "") + f"  [role {f.role}]")
        dirs = [x for x in s.fsynced if x not in {n for f in s.files for n in f.names}]
        if dirs:
            lines.append(f"  folders fsynced: {', '.join(dirs)}")
    lines += [f"PROBLEM: {x}" for x in p.problems]
    return lines
