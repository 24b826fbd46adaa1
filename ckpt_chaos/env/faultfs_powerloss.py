"""faultfs's power-loss model (``env/faultfs.py``): the namespace operations not yet durable, and a
crash, which drops what no fsync made durable and undoes or keeps those operations."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass


@dataclass
class NsOp:
    """A namespace operation not yet durable: enough to undo it."""

    kind: str  # create | mkdir | unlink | rmdir | rename
    dir_ino: int  # directory whose fsync makes it durable (for rename: the source directory)
    name: str
    ino: int = 0
    dst_dir_ino: int = 0  # rename: destination directory (its fsync also makes it durable)
    dst_name: str = ""
    grave: str | None = None  # unlink: where the entry waits; rename: the entry it replaced



def remove_entry(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def _index(root: str) -> tuple[dict[int, str], dict[int, str]]:
    """inode -> path of every directory (root included) and every file under ``root``."""
    dirs, files = {os.lstat(root).st_ino: root}, {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            p = os.path.join(dirpath, d)
            dirs[os.lstat(p).st_ino] = p
        for f in filenames:
            p = os.path.join(dirpath, f)
            files[os.lstat(p).st_ino] = p
    return dirs, files


def _find_in(root: str, ino: int) -> str | None:
    for dirpath, _, filenames in os.walk(root):
        for f in filenames:
            p = os.path.join(dirpath, f)
            if os.lstat(p).st_ino == ino:
                return p
    return None


class Crash:
    """One power cut over a FaultFS's folder ``data`` (``FaultFS.crash``), step by step, with the paths of
    its account relative to ``data`` and named through the directories an undo re-creates."""

    def __init__(self, data: str, keep: str, synced_files: set[int], synced_dirs: set[int]):
        self.data, self.keep = data, keep  # keep: where durable copies and set-aside entries wait
        self.synced_files, self.synced_dirs = synced_files, synced_dirs
        self.dirs, self.files = _index(data)
        self.renumbered: dict[int, int] = {}  # a directory re-created by an undo has a new inode

    def rel(self, path: str) -> str:
        return os.path.relpath(path, self.data)

    def where(self, ino: int) -> str | None:
        ino = self.renumbered.get(ino, ino)
        return self.dirs.get(ino)

    def at(self, dir_ino: int, name: str) -> str:
        parent = self.where(dir_ino)
        return os.path.normpath(os.path.join(self.rel(parent), name)) if parent else name

    def entry(self, op: NsOp, path: str, src: str | None = None) -> dict:
        return {"op": op.kind, "path": path, **({"src": src} if src is not None else {}),
                "folder_ever_fsynced": bool({op.dir_ino, op.dst_dir_ino} & self.synced_dirs)}

    def drop_data(self, dirty: dict[int, str | None], ops: list[NsOp], mode: str) -> tuple[list, list, list]:
        """Revert each file of ``dirty`` (inode -> copy of its durable content, None: empty) to its
        durable content; ``(truncated, restored, data_lost)`` of the account."""
        dirs, files, rel = self.dirs, self.files, self.rel
        # entries a pending unlink, or a rename over them, keeps aside: by the name they had
        aside = {op.grave: (op.dir_ino, op.name) if op.kind == "unlink" else (op.dst_dir_ino, op.dst_name)
                 for op in ops if op.grave}
        truncated, restored, data_lost = [], [], []
        for ino, copy in dirty.items():
            path = files.get(ino)
            if path is None:
                path = _find_in(self.keep, ino)
                if path is None or mode == "entries-kept":
                    continue  # kept aside by an unlink or a rename over it, which stays done: it is gone
                parent, name = aside.get(path, (None, os.path.basename(path)))
                named = os.path.normpath(os.path.join(rel(dirs[parent]), name)) if parent in dirs else name
            else:
                named = rel(path)
            before = os.lstat(path).st_size
            if copy is None:
                os.truncate(path, 0)
                truncated.append(named)
            else:
                shutil.copyfile(copy, path)
                os.unlink(copy)
                restored.append(named)
            data_lost.append({"path": named, "size_before": before, "size_after": os.lstat(path).st_size,
                              "ever_fsynced": ino in self.synced_files})
        return truncated, restored, data_lost

    def kept(self, ops: list[NsOp]) -> list[dict]:
        """Mode ``entries-kept``: the account's ``entries_kept``, one for each pending operation."""
        return [self.entry(op, self.at(op.dst_dir_ino, op.dst_name), self.at(op.dir_ino, op.name))
                if op.kind == "rename" else self.entry(op, self.at(op.dir_ino, op.name)) for op in ops]

    def undo(self, ops: list[NsOp]) -> tuple[list[str], list[dict]]:
        """Mode ``undo``: undo the pending operations, newest first; ``(undone, entries_undone)``."""
        rel, undone, entries_undone = self.rel, [], []
        for op in reversed(ops):
            parent = self.where(op.dir_ino)
            if parent is None:
                continue
            here = os.path.join(parent, op.name)
            if op.kind in ("create", "mkdir"):
                if os.path.lexists(here) and os.lstat(here).st_ino == op.ino:
                    remove_entry(here)
                    undone.append(f"{op.kind} {os.path.relpath(here, self.data)}")
                    entries_undone.append(self.entry(op, rel(here)))
            elif op.kind == "unlink":
                if os.path.lexists(op.grave):
                    os.rename(op.grave, here)
                    undone.append(f"unlink {os.path.relpath(here, self.data)}")
                    entries_undone.append(self.entry(op, rel(here)))
            elif op.kind == "rmdir":
                if os.path.lexists(here):
                    continue
                os.mkdir(here)
                self.renumbered[op.ino] = os.lstat(here).st_ino
                self.dirs[self.renumbered[op.ino]] = here
                undone.append(f"rmdir {os.path.relpath(here, self.data)}")
                entries_undone.append(self.entry(op, rel(here)))
            elif op.kind == "rename":
                dst_parent = self.where(op.dst_dir_ino)
                if dst_parent is None:
                    continue
                there = os.path.join(dst_parent, op.dst_name)
                if not os.path.lexists(there):
                    continue
                os.rename(there, here)
                if op.grave and os.path.lexists(op.grave):
                    os.rename(op.grave, there)
                undone.append(f"rename {os.path.relpath(here, self.data)} -> "
                              f"{os.path.relpath(there, self.data)}")
                entries_undone.append(self.entry(op, rel(there), rel(here)))
                self.dirs, _ = _index(self.data)  # a directory may have moved
        return undone, entries_undone
