"""Which file of the fault-free run a file being written is, whatever name it is written under.

A trainer rarely writes a checkpoint file under the name a user sees: safetensors' own writer
writes ``.tmpXXXXXX`` beside ``model.safetensors`` and renames it, ``torch.save`` callers write
``step_8.pt.tmp``, Lightning (through fsspec) stages in ``TMPDIR`` and moves the file into place, a
framework renames a whole staging folder. A trigger names the file the user sees; this module lets
both layers that fire file points, the automatic probe layer (``auto.py``) and faultfs, report each
write with the names that file had in the golden run, and cut it at tenths of that file's own size.
It is the one implementation of it: both layers call ``Follower.open``; the Generator matches a
trigger's path with ``matches``, and the check of the triggers before a run matches it against the
same names of the golden run's files (``files``).

The golden run's side, ``plan(events)``. Each file written (one ``file.done`` or
``ckpt.shard.done`` of the probe layer, or one ``faultfs.done``: each layer counts its own) is
followed through every later rename of it or of a folder above it (``file.rename`` and
``faultfs.rename``, ``src`` -> ``path``): its *names* are the one it was written under, then each one
it was given. Its *key*, the same in any run of the trainer: the name it was written under with each
word (a run of letters, digits and ``_``) that is not in the *vocabulary* masked as ``*``, and its
ordinal among the files of its rank and layer with that masked name, in the order they were
written. The vocabulary is the words of the names files kept (their last names, not those of
files removed, or written over by the next file of that name, before any rename: ``mkstemp``'s empty
file that fsspec then opens by name and renames), so a random temporary name (``.tmpYwRTPf``,
``tmpk3j_x8a1``, a pid) masks to the same ``.*`` or ``*`` in every run while a stable name keeps its
words.

The run's side, ``Follower.open(source, rank, path, launch)``, when a file starts being written: the
next ordinal of its key gives the golden run's file, whose size plans the write's tenths and whose
names the write and done points carry as ``aliases``. The trainer is deterministic (the golden run is
made twice and compared), so the n-th such file of a rank is the same file in both runs, as long as
the run does what the golden run did: in its first launch. A relaunch (``launch`` > 0), which the
golden run does not mirror, is planned by exact path only, and carries no aliases. A rank that writes
two files with the same masked name at once (two threads) may see their ordinals swap: the golden
run counts files when they are closed, a run when they are opened.
"""

from __future__ import annotations

import bisect
import fnmatch
import re
import threading
from collections import Counter

WORD = re.compile(r"[A-Za-z0-9_]+")
# the point that closes a written file, and the point that reports its writes -> the layer counting it
DONE = {"file.done": "file", "ckpt.shard.done": "file", "faultfs.done": "faultfs"}
WRITE = {"file.write": "file", "ckpt.shard.write": "file", "faultfs.write": "faultfs"}
RENAMES = ("file.rename", "faultfs.rename")
REMOVES = ("file.remove", "faultfs.remove", "file.rmtree")


def masked(path: str, vocab) -> str:
    """``path`` with every word not in ``vocab`` replaced by ``*`` (also a glob that matches it)."""
    return WORD.sub(lambda m: m.group(0) if m.group(0) in vocab else "*", path)


def moved(path: str, src: str, dst: str) -> str | None:
    """Where a rename of ``src`` to ``dst`` takes ``path`` (``src`` itself, or a file in the folder
    ``src``), or None when it does not touch it."""
    src, dst = src.rstrip("/"), dst.rstrip("/")
    if path == src:
        return dst
    if path.startswith(src + "/"):
        return dst + path[len(src):]
    return None


class _Alive:
    """The files still there, by their last name, with the names under a folder found by bisection
    (a run of thousands of files renames and removes folders of them)."""

    def __init__(self):
        self.at: dict[str, list[dict]] = {}
        self.names: list[str] = []  # sorted

    def add(self, name: str, f: dict) -> None:
        if name not in self.at:
            bisect.insort(self.names, name)
            self.at[name] = []
        self.at[name].append(f)

    def take(self, path: str) -> list[tuple[str, dict]]:
        """Remove and return the files at ``path`` or in the folder ``path``."""
        path = path.rstrip("/")
        lo, hi = bisect.bisect_left(self.names, path + "/"), bisect.bisect_left(self.names, path + "0")
        names = ([path] if path in self.at else []) + self.names[lo:hi]  # "0" follows "/"
        out = [(n, f) for n in names for f in self.at.pop(n)]
        for n in names:
            del self.names[bisect.bisect_left(self.names, n)]
        return out


def files(events) -> list[dict]:
    """The files a run wrote, in the order they were closed: ``source`` (``file``: the probe layer;
    ``faultfs``), ``rank``, ``names`` (written under, then each name a rename gave it), ``size``,
    ``removed`` (it was removed, or replaced by a later file of the same layer, under its last name); ``python_bytes`` where a native writer wrote
    the rest of ``size`` (the layer's ``native``), which no ``file.write`` reports."""
    out: list[dict] = []
    alive = _Alive()
    for e in events:
        point, info = e.get("point"), e.get("info") or {}
        path = info.get("path")
        if not path:
            continue
        if point in DONE:
            # faultfs names a file by where it is when it is closed: a writer that renames its
            # temporary file before closing it (safetensors) says where it started in ``opened``
            first = info.get("opened") or path
            f = {"source": DONE[point], "rank": e.get("rank", 0), "names": [first] if first == path else [first, path],
                 "size": int(info.get("bytes") or 0), "removed": False}
            if info.get("native"):  # bytes a native writer put there: Python wrote only python_bytes of them
                f["python_bytes"] = int(info.get("python_bytes") or 0)
            if path in alive.at:  # overwritten: the same layer's earlier file of that name
                for g in alive.at[path]:
                    # gone as a removed file is (``tempfile.mkstemp``'s empty file, then written by name)
                    g["removed"] = g["removed"] or g["source"] == f["source"]
                alive.at[path] = [g for g in alive.at[path] if g["source"] != f["source"]]
            out.append(f)
            alive.add(path, f)
        elif point in RENAMES and info.get("src"):
            moving = alive.take(info["src"])
            if not moving:
                continue  # a rename both layers report: the second finds the files moved already
            alive.take(path)  # what was there is replaced
            for name, f in moving:
                to = moved(name, info["src"], path)
                if to != f["names"][-1]:
                    f["names"].append(to)
                alive.add(to, f)
        elif point in REMOVES and not (point == "file.rmtree" and info.get("stage") == "end"):
            for _, f in alive.take(path):
                f["removed"] = True
    return out


def plan(events) -> dict:
    """The plan of the next runs, from a run's probe events (``planned.json``): ``sizes``, each name a
    file had -> its size; ``vocab``, the words that are not masked; ``files``, layer -> rank -> key ->
    the files with that masked name, in order, each ``{"names": [...], "size": n}``."""
    found = files(events)
    vocab = sorted({w for f in found if len(f["names"]) > 1 or not f["removed"]
                    for w in WORD.findall(f["names"][-1])})
    words = set(vocab)
    sizes: dict[str, int] = {}
    keyed: dict[str, dict[str, dict[str, list]]] = {}
    for f in found:
        same = keyed.setdefault(f["source"], {}).setdefault(str(f["rank"]), {})
        same.setdefault(masked(f["names"][0], words), []).append({"names": f["names"], "size": f["size"]})
        for n in f["names"]:
            sizes[n] = max(sizes.get(n, 0), f["size"])
    return {"sizes": sizes, "vocab": vocab, "files": keyed}


def normalized(planned: dict | None) -> dict:
    """A plan as ``plan`` makes it; a flat ``{path: size}`` (an older plan, a test's) is its sizes."""
    if not planned:
        return {"sizes": {}, "vocab": [], "files": {}}
    if isinstance(planned.get("sizes"), dict) and isinstance(planned.get("files"), dict):
        return planned
    return {"sizes": {k: int(v) for k, v in planned.items()}, "vocab": [], "files": {}}


def planned_size(sizes: dict[str, int], path: str) -> int | None:
    """A file's planned size by its exact path, else by a glob key that matches it."""
    size = sizes.get(path)
    if size is None:
        size = next((v for k, v in sizes.items() if any(c in k for c in "*?[") and fnmatch.fnmatch(path, k)), None)
    return size


class Follower:
    """A run's side of the plan, in one process (the probe layer) or one mount (faultfs)."""

    def __init__(self, planned: dict | None = None):
        p = normalized(planned)
        self.sizes, self.vocab, self.files = p["sizes"], frozenset(p["vocab"]), p["files"]
        self._count: Counter = Counter()
        self._lock = threading.Lock()

    def open(self, source: str, rank: int, path: str, launch: int = 0) -> tuple[int | None, list[str]]:
        """A file starts being written under ``path`` (as the points name it): its planned size (None:
        not known) and its other names in the golden run."""
        size, aliases, _ = self.match(source, rank, path, launch)
        return size, aliases

    def match(self, source: str, rank: int, path: str, launch: int = 0) -> tuple[int | None, list[str], bool]:
        """As ``open``, and whether the size is that of the same file in the golden run (found by its key
        in the first launch), not a size by path or glob: a file closed with fewer bytes is short."""
        key = masked(path, self.vocab)
        with self._lock:
            n = self._count[(source, rank, launch, key)]
            self._count[(source, rank, launch, key)] = n + 1
        if launch == 0:
            same = self.files.get(source, {}).get(str(rank), {}).get(key, ())
            if n < len(same):
                return same[n]["size"] or None, [x for x in same[n]["names"] if x != path], True
        return planned_size(self.sizes, path), [], False


def names(info: dict) -> list[str]:
    """The names a point's file goes by: its path, and the golden run's names of it (``aliases``)."""
    return [info.get("path") or "", *info.get("aliases", ())]


def matches(info: dict, pattern: str) -> bool:
    """Whether a trigger's ``path`` glob names the point's file, under any of its names."""
    return any(fnmatch.fnmatch(n, pattern) for n in names(info))
