"""Inode exhaustion on the checkpoint file system (``inodes_full``): every free inode is taken by an
empty file beside the data, while the free bytes stay as they were. A trainer that checks the free
space before a save (``shutil.disk_usage``, ``statvfs``'s blocks) sees room enough, and its save
still fails with ENOSPC at its first create: the checkpoint's folder, a shard, ``.metadata``, the
manifest. It must report the failure and resume from an older checkpoint, as after a full disk.

The files go in ``inode-ballast/`` on the run's file system (``ckpt_chaos/env/storage.py``), beside
``disk_full``'s ballast file, and are removed at the end of the launch (unless ``keep_full``) or by
a heal fault. An ext4 image has a fixed inode count (4096 for 16 MiB), which the files use up in a
tenth of a second. A tmpfs has as many inodes as half the machine's memory pages (millions), so its
count is first lowered, by a remount with ``nr_inodes``, to what is in use plus ``SPARE``, and given
back with the files: what a file system with few inodes does to the job, at the cost of a few dozen
files.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckpt_chaos.faults.kind import Effects, FaultKind, Nemesis
from ckpt_chaos.faults.registry import Invalid
from ckpt_chaos.faults.search_rules import DISK_FULL_PLACES, WORLD_SIZE, Rule, SearchRule, Story
from ckpt_chaos.faults.storage import _on_local_storage, _surfaced

if TYPE_CHECKING:
    from ckpt_chaos.check.history import FaultFired
    from ckpt_chaos.check.verdict import Report, Run
    from ckpt_chaos.env.storage import Storage
    from ckpt_chaos.scenario import Fault, Scenario

BALLAST = "inode-ballast"
SPARE = 64  # inodes a lowered tmpfs has beyond those in use: the files that take them
MAX_FILES = 1 << 20  # a file system with more free inodes than this is not one the fault can empty


@dataclass
class InodesFullParams:
    headroom: int = 0  # inodes left free: files the trainer can still create
    keep_full: bool = False  # the inodes stay taken across relaunches (else given back at the launch's end)


def _statvfs(path) -> dict:
    sv = os.statvfs(path)
    return {"inodes": sv.f_files, "inodes_free": sv.f_ffree, "free_bytes": sv.f_bavail * sv.f_frsize}


def _remount(path, inodes: int) -> None:
    p = subprocess.run(["mount", "-o", f"remount,nr_inodes={inodes}", os.fspath(path)], capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise RuntimeError(f"inodes_full: remounting {path} with nr_inodes={inodes} failed: {p.stderr.strip()}")


def _create_until_full(folder) -> int:
    """Empty files in ``folder`` until a create fails with ENOSPC; how many were made."""
    made = 0
    while made < MAX_FILES:
        try:
            os.close(os.open(os.path.join(folder, f"{made:08d}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except OSError as e:
            if e.errno == errno.ENOSPC:
                return made
            raise
        made += 1
    raise RuntimeError(f"inodes_full: {MAX_FILES} files made in {folder} and inodes still free")


class InodeNemesis(Nemesis):
    """Takes the free inodes of the run's checkpoint file system, and gives them back at the end of
    the launch (unless a fault said ``keep_full``) or at a heal fault."""

    def __init__(self, setting):
        super().__init__(setting)
        self.keep_full = False
        self.lowered_from: int | None = None  # a tmpfs's own inode count, while lowered

    def inodes_full(self, fault: Fault, event: dict, record: dict) -> None:
        storage: Storage = self.setting.storage
        self.keep_full |= fault.params.keep_full
        before = _statvfs(storage.fs)
        record["before"] = before
        if storage.spec.fs == "tmpfs" and self.lowered_from is None:
            cap = before["inodes"] - before["inodes_free"] + SPARE
            _remount(storage.fs, cap)
            self.lowered_from = before["inodes"]
            record["nr_inodes"] = {"was": before["inodes"], "now": cap}
        folder = storage.fs / BALLAST
        try:
            folder.mkdir(exist_ok=True)
            made = _create_until_full(folder)
        except OSError as e:
            if e.errno != errno.ENOSPC:  # the folder itself took the last inode
                raise
            made = 0
        kept = max(0, made - fault.params.headroom)
        for i in range(kept, made):  # give headroom files back, newest first
            os.unlink(folder / f"{i:08d}")
        record.update(files=kept, after=_statvfs(storage.fs), headroom=fault.params.headroom)

    def _give_back(self) -> dict:
        storage = self.setting.storage
        folder = storage.fs / BALLAST
        if not folder.exists() and self.lowered_from is None:
            return {}
        out: dict = {"files": len(os.listdir(folder)) if folder.exists() else 0}
        shutil.rmtree(folder, ignore_errors=True)
        if self.lowered_from is not None:
            _remount(storage.fs, self.lowered_from)
            out["nr_inodes"] = self.lowered_from
            self.lowered_from = None
        self.keep_full = False
        return {"inodes_given_back": out}

    def lift(self) -> dict:
        return self._give_back()

    def heal(self) -> dict:
        return {} if self.keep_full else self._give_back()


def _check(s: Scenario, f: Fault) -> None:
    _on_local_storage(s, f)
    if s.storage.fs not in ("tmpfs", "ext4"):
        raise Invalid("kind", "inodes_full needs a file system of the run's own, whose inodes are the job's alone",
                      "add [storage] with fs = \"tmpfs\" or \"ext4\"")
    if f.params.headroom < 0:
        raise Invalid("headroom", f"{f.params.headroom}", "use 0 or more")


def _effect(run: Run, h: FaultFired, report: Report) -> None:
    """The inodes ran out while bytes stayed free (else it was a full disk, which says nothing new);
    then the failed save was reported, or the launch stopped."""
    after, headroom = h.detail.get("after", {}), h.detail.get("headroom", 0)
    ok = after.get("inodes_free", -1) <= headroom and after.get("free_bytes", 0) > 0
    report.add("injected", ok, fault=h.index, detail=
               f"{h.detail.get('files')} empty files took the inodes: {after.get('inodes_free')} of "
               f"{after.get('inodes')} left free, with {after.get('free_bytes', 0) >> 10} KiB of space still free"
               if ok else f"the inodes were not exhausted with space left: after the fill {after}")
    _surfaced(run, h, report, None)


def _save_under_way(s: Scenario, f: Fault) -> bool:
    """n/a if no save began while the inodes were taken; one is under way when it strikes inside a save."""
    return f.when.point.startswith("ckpt.")


def _add(s: Story, place, rank, delay) -> None:
    if not s.can() or s.full_from is not None:  # saves fail already: it would take nothing they need
        return
    if when := s.at(s.least_tried(place, DISK_FULL_PLACES), rank, delay):
        s.add("inodes_full", when)


SEARCH = SearchRule(rules=(Rule("inodes_full", "storage", {"place": DISK_FULL_PLACES, "rank": range(WORLD_SIZE),
                                                             "delay": range(4)}, _add),))

KINDS = (
    FaultKind(name="inodes_full", family="storage",
              doc="take every free inode of the checkpoint file system with empty files (headroom left) while its "
                  "free bytes stay: creates fail with ENOSPC; given back at the launch's end unless keep_full",
              params=InodesFullParams, nemesis=InodeNemesis, action=InodeNemesis.inodes_full, colour="#a6761d",
              effects=Effects(fails_saves=True, fills_disk=True, healable=True), validate=_check,
              needs=lambda p: frozenset({"sized_fs"}), effect_check=_effect,
              coverage={"fault_injected": lambda s, f: True, "fault_surfaced": _save_under_way},
              describe=lambda f, h: f"inodes_full ({h.detail.get('files')} empty files)", search=SEARCH),
)
