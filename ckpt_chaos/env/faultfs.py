"""faultfs: a FUSE pass-through file system that fails, slows down and forgets, on command.

The harness mounts it over a run's checkpoint directory (``ckpt_chaos/env/storage.py``) and drives it
through a control socket while the trainer runs on top of it. Because it sits under the VFS, it
sees every call a trainer makes whatever the call's flavour (``openat``, ``renameat2``,
``mkdirat``, writes from any thread), which ``LD_PRELOAD`` tools such as libfiu cannot. It offers:

* **Errno rules**: fail the n-th matching call (an operation, a glob over the path inside the
  mount, optionally only calls from given processes) with a chosen errno, ``count`` times in a
  row; or each matching call with a probability drawn from a seeded generator. Counting starts
  when the rule is armed, so a rule armed at a probe point is as reproducible as the point.
* **Slow storage**: a delay per write call and/or a bandwidth cap over all writes.
* **Probe points for any writer** (``report``): the calls of a job's processes (those with a
  ckpt-chaos controller in their environment) become probe events sent to that controller, and
  each call waits for its answer, so a fault lands at a precise point of a writer Python cannot
  see. A write crossing a tenth of the file's planned size (its size in the fault-free run) is
  split there: the bytes before go to disk, then ``faultfs.write`` is reported with the fraction,
  and a writer killed meanwhile writes nothing more. A file written under a temporary name is
  planned at the size of the file it becomes in the fault-free run, and its points carry that
  file's names (``aliases``; ``ckpt_chaos/probe/follow.py``).
* **Lost un-fsynced data** (as Jepsen's LazyFS, with directory semantics as ALICE's model):
  with ``lazy`` on, the layer remembers what is durable. File data is durable once the file is
  fsynced; a create, mkdir, unlink, rmdir or rename is durable once its directory is fsynced (a
  rename once either of its directories is). ``crash`` turns the file system into the state a
  power cut would leave: un-fsynced data is dropped (a file reverts to its last fsynced content,
  a never-fsynced file is empty) and un-persisted namespace operations are undone, newest first
  (mode ``undo``), or all kept (mode ``entries-kept``: what ext4 often leaves, a file under its
  new name with only its fsynced bytes).

Otherwise it behaves as a local file system. A file unlinked while open or memory-mapped is gone
from its folder at once (``hard_remove``; FUSE's default renames it to ``.fuse_hidden*`` until its
last close, so a retention's ``rmtree`` of a checkpoint still mapped by ``safetensors`` failed with
ENOTEMPTY). Its handles go on reading, writing, truncating and fsyncing; libfuse calls those without
a path, and the rules, the points and the power-loss model name the file by the path its handle
had when it was unlinked (renames followed). Only ``fstat`` of it fails (ESTALE): the kernel asks
for its attributes by inode, which libfuse's path API cannot answer once the file has no name.

Run as ``python -m ckpt_chaos.env.faultfs BACKING MOUNTPOINT CONTROL_SOCKET FSNAME`` (``@name``: an
abstract socket). ``BACKING/data``
is what the mount shows; ``BACKING/.faultfs`` holds durable copies and the entries that an
undo may need back, on the same file system so that keeping them is a rename, not a copy.

The probe points' reporting is in ``env/faultfs_probe.py``, the crash of the power-loss model in
``env/faultfs_powerloss.py``.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import random
import shutil
import socket
import sys
import threading
import time
from dataclasses import dataclass, field

from mfusepy import FUSE, FuseOSError, Operations, fuse_get_context

from ckpt_chaos.env.faultfs_powerloss import Crash, NsOp, remove_entry
from ckpt_chaos.env.faultfs_probe import Reporter, exiting, tgid
from ckpt_chaos.env.storage import FAULTFS_POINTS, POWER_LOSS_MODES, socket_address

# Call names a rule may use, and the FUSE operations each covers.
CALLS = {
    "open": ("open", "create"),
    "write": ("write",),
    "read": ("read",),
    "fsync": ("fsync", "fsyncdir"),
    "rename": ("rename",),
    "unlink": ("unlink",),
    "mkdir": ("mkdir",),
    "rmdir": ("rmdir",),
    "truncate": ("truncate",),
    "any": ("open", "create", "write", "read", "fsync", "fsyncdir", "rename", "unlink", "mkdir", "rmdir",
            "truncate"),
}


@dataclass
class Rule:
    """What to break: calls of ``call`` on paths matching ``path`` (relative to the mount root)."""

    call: str = "any"
    path: str = "*"
    errno: int = errno.EIO
    nth: int = 1  # the first matching call that fails (counted from arming)
    count: int = 1  # how many matching calls fail from the nth on (0: all of them)
    probability: float | None = None  # instead of nth/count: each matching call fails with this chance
    seed: int = 0
    pids: list[int] | None = None  # only calls from these processes (thread group ids)
    delay_s: float = 0.0  # slow storage: added to every matching call (no failure when errno == 0)
    bytes_per_s: float = 0.0  # slow storage: writes share this bandwidth
    matched: int = 0
    failed: int = 0
    rng: random.Random = field(default_factory=random.Random)



class FaultFS(Operations):
    use_ns = True  # utimens gets nanoseconds

    def __init__(self, backing: str):
        self.data = os.path.join(backing, "data")
        self.keep = os.path.join(backing, ".faultfs")
        os.makedirs(self.data, exist_ok=True)
        os.makedirs(self.keep, exist_ok=True)
        self._mutex = threading.RLock()
        self.rules: dict[int, Rule] = {}
        self.next_rule = 1
        self.injected: list[dict] = []  # every failure this layer caused, for the history
        self.calls: dict[str, int] = {}
        self.lazy = False
        self.dirty: dict[int, str | None] = {}  # inode -> copy of its durable content (None: empty)
        self.ops: list[NsOp] = []  # un-persisted namespace operations, oldest first
        self.synced_files: set[int] = set()  # inodes fsynced since tracking began (for the crash's account)
        self.synced_dirs: set[int] = set()  # directory inodes fsynced since tracking began
        self.bandwidth_free_at = 0.0
        self.serial = 0
        self.reporter: Reporter | None = None
        # handle -> [a write failed, end of the bytes written, planned size, the file's names in the golden
        # run, the path of its first write] (for done)
        self.writing: dict[int, list] = {}
        # handle -> its path inside the mount, renames followed: a file unlinked while open (hard_remove)
        # has no path left, and its calls come with None; rules and points name it by this
        self.names: dict[int, str] = {}
        # handle -> the thread that opened it: the writer of a shared mapping's pages, which the kernel
        # writes back from a context of its own
        self.openers: dict[int, int] = {}
        self.harness = os.getppid()  # the harness started this daemon

    # ---- rules --------------------------------------------------------------------------------

    def _check(self, op: str, *paths: str, nbytes: int = 0) -> None:
        """Count the call against every armed rule; sleep and/or raise as the rules say."""
        if op == "open" and tgid(fuse_get_context()[2]) == self.harness:
            # the kernel opening, for the harness's file-event recorder (env/fileevents.py), what a job
            # process opened: not a call of the job's, and a fault it took would be the job's no more
            return
        delay, fail = 0.0, None
        with self._mutex:
            self.calls[op] = self.calls.get(op, 0) + 1
            pid = None
            for rid, r in self.rules.items():
                if op not in CALLS[r.call]:
                    continue
                if not any(fnmatch.fnmatch(p.lstrip("/"), r.path) for p in paths):
                    continue
                if r.pids is not None:
                    pid = pid if pid is not None else tgid(fuse_get_context()[2])
                    if pid not in r.pids:
                        continue
                r.matched += 1
                if r.bytes_per_s and nbytes:
                    start = max(time.monotonic(), self.bandwidth_free_at)
                    self.bandwidth_free_at = start + nbytes / r.bytes_per_s
                    delay = max(delay, self.bandwidth_free_at - time.monotonic())
                delay += r.delay_s
                if not r.errno or fail is not None:
                    continue
                if r.probability is not None:
                    hit = r.rng.random() < r.probability
                else:
                    hit = r.matched >= r.nth and (r.count == 0 or r.failed < r.count)
                if hit:
                    r.failed += 1
                    fail = r.errno
                    self.injected.append({"t": time.time(), "rule": rid, "op": op, "path": paths[0],
                                          "errno": errno.errorcode.get(r.errno, str(r.errno)),
                                          "pid": pid if pid is not None else tgid(fuse_get_context()[2])})
        if delay > 0:
            time.sleep(delay)
        if fail is not None:
            raise FuseOSError(fail)

    def arm(self, spec: dict) -> int:
        rule = Rule(**spec)
        rule.rng = random.Random(rule.seed)
        with self._mutex:
            rid = self.next_rule
            self.next_rule += 1
            self.rules[rid] = rule
        return rid

    def report(self, controller: str | None, points=FAULTFS_POINTS, planned: dict | None = None,
               prefix: str = "") -> None:
        """Report the job's calls to ``controller`` (None: stop); ``planned``: the golden run's files
        (``follow.plan``, or sizes by path relative to the run directory), that writes are cut at
        tenths of; ``prefix``: this mount's
        path relative to the run directory."""
        old, self.reporter = self.reporter, (Reporter(controller, points, planned, prefix) if controller else None)
        if old is not None:
            old.close()

    def _hold(self, point: str, **info) -> None:
        r = self.reporter
        if r is not None:
            r.hold(point, fuse_get_context()[2], **info)

    def reads_ruled(self) -> bool:
        """Whether an armed rule acts on reads (fails or slows them)."""
        with self._mutex:
            return any("read" in CALLS[r.call] for r in self.rules.values())

    def disarm(self, rid: int | None = None) -> None:
        with self._mutex:
            if rid is None:
                self.rules.clear()
            else:
                self.rules.pop(rid, None)

    # ---- helpers ------------------------------------------------------------------------------

    def _full(self, path: str | None) -> str:
        if path is None:  # only a handle's calls reach an unlinked file; libfuse says ESTALE to the others
            raise FuseOSError(errno.ESTALE)
        return os.path.join(self.data, path.lstrip("/"))

    def _name(self, path: str | None, fh: int | None) -> str:
        """The path of a handle's call: the kernel's, or, for a file unlinked while open (no path), the
        one the handle had when it was unlinked."""
        return path if path is not None else self.names.get(fh, "")

    def _renamed(self, old: str, new: str) -> None:
        """The handles of ``old`` (a file, or anything under a folder) are named after ``new`` now."""
        inside = old.rstrip("/") + "/"
        for fh, name in list(self.names.items()):
            if name == old:
                self.names[fh] = new
            elif name.startswith(inside):
                self.names[fh] = new.rstrip("/") + "/" + name[len(inside):]

    def _ino(self, full: str) -> int:
        return os.lstat(full).st_ino

    def _grave(self) -> str:
        self.serial += 1
        return os.path.join(self.keep, f"grave-{self.serial}")

    def _touch_data(self, full: str | None = None, fh: int | None = None) -> None:
        """Before the first change to a file since its last fsync, keep its durable content. ``fh``: a
        handle of the file instead of its path (a file unlinked while open has none)."""
        st = os.lstat(full) if fh is None else os.fstat(fh)
        if st.st_ino in self.dirty:
            return
        if not st.st_nlink:
            # unlinked for good (before tracking began, or its unlink was made durable), not kept aside
            # for a crash to bring back: its data is gone whatever happens
            return
        copy = None
        if st.st_size:
            copy = os.path.join(self.keep, f"data-{st.st_ino}")
            shutil.copyfile(full if fh is None else f"/proc/self/fd/{fh}", copy)
        self.dirty[st.st_ino] = copy

    def _log(self, op: NsOp) -> None:
        if self.lazy:
            self.ops.append(op)

    # ---- the pass-through operations ------------------------------------------------------------

    def getattr(self, path, fh=None):
        st = os.fstat(fh) if path is None and fh is not None else os.lstat(self._full(path))
        out = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_ino", "st_blocks")}
        # use_ns: mfusepy takes every time as integer nanoseconds (seconds would read as 1.8 s past 1970)
        return out | {k: getattr(st, k + "_ns") for k in ("st_atime", "st_mtime", "st_ctime")}

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._full(path))

    def access(self, path, amode):
        if not os.access(self._full(path), amode):
            raise FuseOSError(errno.EACCES)
        return 0

    def statfs(self, path):
        sv = os.statvfs(self.data)
        return {k: getattr(sv, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                            "f_files", "f_ffree", "f_favail", "f_flag", "f_namemax")}

    def open(self, path, flags):
        self._check("open", path)
        full = self._full(path)
        if self.reporter is not None and flags & os.O_ACCMODE == os.O_RDONLY:
            # before the file is opened: a fault here lands in a load, whatever code does the reading
            self._hold("faultfs.open", path=self.reporter.path(path))
        emptied = self.reporter is not None and flags & os.O_TRUNC and flags & os.O_ACCMODE != os.O_RDONLY
        with self._mutex:
            if self.lazy and flags & os.O_TRUNC:
                self._touch_data(full)
            before = os.lstat(full).st_size if emptied else 0
            fd = os.open(full, flags)
            self.names[fd] = path
            self.openers[fd] = fuse_get_context()[2]
        if emptied:
            self._emptied(fd, path, before=before, length=0)
        return fd

    def create(self, path, mode, fi=None):
        self._check("create", path)
        full = self._full(path)
        with self._mutex:
            existed = os.path.lexists(full)
            before = os.lstat(full).st_size if existed else 0
            if self.lazy and existed:
                self._touch_data(full)
            # the caller's flags (mfusepy passes them as ``fi``): a file created to be read back ("w+b")
            # gets a handle it can read through
            fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC if fi is None else fi | os.O_CREAT, mode)
            if self.lazy and not existed:
                ino = os.fstat(fd).st_ino
                self.dirty[ino] = None
                self._log(NsOp("create", self._ino(os.path.dirname(full)), os.path.basename(full), ino))
            self.names[fd] = path
            self.openers[fd] = fuse_get_context()[2]
        if self.reporter is not None:
            self._emptied(fd, path, before=before, length=0, **({} if existed else {"created": True}))
        return fd

    def read(self, path, size, offset, fh):
        self._check("read", self._name(path, fh))
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        path = self._name(path, fh)  # unlinked while open: the name it had
        self._check("write", path, nbytes=len(data))
        r = self.reporter
        done = 0
        if r is not None:
            tid = fuse_get_context()[2]
            if not r.of_job(tid):  # a mapping's pages written back: its writer is the one that opened it
                tid = self.openers.get(fh, tid)
            state = self.writing.get(fh)
            if state is None:
                with self._mutex:  # two threads' first writes to one handle: one file, counted once
                    state = self.writing.get(fh)
                    if state is None:
                        state = self.writing[fh] = [False, 0, *r.begin(tid, path), r.path(path)]
            for at, fraction in r.cuts(state[2], offset, len(data)):
                done += self._pwrite(path, data[done:at - offset], offset + done, fh)
                state[1] = max(state[1], at)
                try:
                    r.hold("faultfs.write", tid, path=r.path(path), offset=offset, bytes=at,
                           **({"fraction": round(fraction, 4)} if fraction is not None else {}),
                           **({"aliases": state[3]} if state[3] else {}))
                except FuseOSError:
                    state[0] = True
                    raise
            state[1] = max(state[1], offset + len(data))
        return done + self._pwrite(path, data[done:], offset + done, fh)

    def _pwrite(self, path, data, offset, fh) -> int:
        with self._mutex:
            if self.lazy:
                self._touch_data(fh=fh)
            return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
        # by path while the file has one; an ftruncate of a file unlinked while open comes with its
        # handle only (_FUSE)
        full = None if path is None and fh is not None else self._full(path)
        self._check("truncate", self._name(path, fh))
        with self._mutex:
            before = os.fstat(fh).st_size if full is None else os.lstat(full).st_size
            if self.lazy:
                self._touch_data(full, fh if full is None else None)
            os.truncate(fh if full is None else full, length)
        if length < before:  # cut short (an O_TRUNC open comes here first); a writer sizing its file is not
            self._emptied(None, self._name(path, fh), before=before, length=length)
        return 0

    def _emptied(self, fd: int | None, path: str, **info) -> None:
        """``faultfs.truncate``: a job's file was just emptied (created, or opened with O_TRUNC) or cut short,
        and no byte has gone into it since; held like every point, so a writer killed here leaves it so.
        An open the controller fails (its process died meanwhile, or an errno fault) closes its handle."""
        r = self.reporter
        if r is None:
            return
        try:
            self._hold("faultfs.truncate", path=r.path(path), **info)
        except BaseException:
            if fd is not None:
                with self._mutex:
                    self.names.pop(fd, None)
                    self.openers.pop(fd, None)
                os.close(fd)
            raise

    def flush(self, path, fh):
        # close() is not a durability point, only fsync is; but it is where a writer says it is done
        state = self.writing.pop(fh, None)
        r = self.reporter
        path = self._name(path, fh)
        if state is not None and r is not None:
            # bytes: how far it wrote (a writer may size the file first: size says that)
            # opened: where its first write was, when a rename moved it since (safetensors renames first)
            # exited: the process was ending and the kernel closed the file for it; whether the writer
            # had finished is then the evidence's to judge (bytes against the golden run's file)
            self._hold("faultfs.done", path=r.path(path), bytes=state[1], size=os.fstat(fh).st_size,
                       **({"failed": True} if state[0] else {}),
                       **({"exited": True} if exiting(fuse_get_context()[2]) else {}),
                       **({"opened": state[4]} if state[4] != r.path(path) else {}),
                       **({"aliases": state[3]} if state[3] else {}))
        return 0

    def release(self, path, fh):
        self.writing.pop(fh, None)
        with self._mutex:
            self.names.pop(fh, None)
            self.openers.pop(fh, None)
        os.close(fh)
        return 0

    def fsync(self, path, datasync, fh):
        path = self._name(path, fh)
        self._check("fsync", path)
        if self.reporter is not None:
            self._hold("faultfs.fsync", path=self.reporter.path(path))
        os.fsync(fh)
        with self._mutex:
            ino = os.fstat(fh).st_ino
            copy = self.dirty.pop(ino, None)
            if copy:
                os.unlink(copy)
            if self.lazy:
                self.synced_files.add(ino)
        return 0

    def fsyncdir(self, path, datasync, fh):
        self._check("fsyncdir", path or "")
        if path is None:  # a folder removed while open: nothing of it left to make durable
            return 0
        full = self._full(path)
        fd = os.open(full, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        with self._mutex:
            ino = self._ino(full)
            self._persist_dir(ino)
            if self.lazy:
                self.synced_dirs.add(ino)
        return 0

    def _persist_dir(self, dir_ino: int) -> None:
        durable = [op for op in self.ops if dir_ino in (op.dir_ino, op.dst_dir_ino)]
        self.ops = [op for op in self.ops if op not in durable]
        for op in durable:
            if op.grave:
                remove_entry(op.grave)
            if op.kind == "rmdir":  # the directory is gone for good, and with it what happened inside
                inside = [o for o in self.ops if o.dir_ino == op.ino]
                self.ops = [o for o in self.ops if o not in inside]
                for o in inside:
                    if o.grave:
                        remove_entry(o.grave)

    def mkdir(self, path, mode):
        self._check("mkdir", path)
        full = self._full(path)
        with self._mutex:
            os.mkdir(full, mode)
            self._log(NsOp("mkdir", self._ino(os.path.dirname(full)), os.path.basename(full), self._ino(full)))
        return 0

    def rmdir(self, path):
        self._check("rmdir", path)
        if self.reporter is not None:
            self._hold("faultfs.remove", path=self.reporter.path(path))
        full = self._full(path)
        with self._mutex:
            ino, parent = self._ino(full), self._ino(os.path.dirname(full))
            os.rmdir(full)
            self._log(NsOp("rmdir", parent, os.path.basename(full), ino))
        return 0

    def unlink(self, path):
        self._check("unlink", path)
        if self.reporter is not None:
            self._hold("faultfs.remove", path=self.reporter.path(path))
        full = self._full(path)
        with self._mutex:
            if not self.lazy:
                os.unlink(full)
                return 0
            op = NsOp("unlink", self._ino(os.path.dirname(full)), os.path.basename(full), self._ino(full),
                       grave=self._grave())
            os.rename(full, op.grave)  # kept until the unlink is durable: a crash may bring it back
            self.ops.append(op)
        return 0

    def rename(self, old, new, flags=0):
        self._check("rename", old, new)
        if self.reporter is not None:
            self._hold("faultfs.rename", path=self.reporter.path(new), src=self.reporter.path(old))
        src, dst = self._full(old), self._full(new)
        with self._mutex:
            if not self.lazy:
                os.rename(src, dst)
                self._renamed(old, new)
                return 0
            op = NsOp("rename", self._ino(os.path.dirname(src)), os.path.basename(src), self._ino(src),
                       dst_dir_ino=self._ino(os.path.dirname(dst)), dst_name=os.path.basename(dst))
            if os.path.lexists(dst) and not os.path.isdir(dst):
                op.grave = self._grave()
                os.rename(dst, op.grave)
            os.rename(src, dst)
            self._renamed(old, new)
            self.ops.append(op)
        return 0

    def chmod(self, path, mode):
        os.chmod(self._full(path), mode)
        return 0

    def chown(self, path, uid, gid):
        os.chown(self._full(path), uid, gid)
        return 0

    def utimens(self, path, times=None):
        os.utime(self._full(path), ns=times)
        return 0

    # ---- power loss -----------------------------------------------------------------------------

    def set_lazy(self, on: bool) -> None:
        with self._mutex:
            if on and not self.lazy:
                self.dirty.clear()
                self.ops.clear()
                self.synced_files.clear()
                self.synced_dirs.clear()
            self.lazy = on

    def crash(self, mode: str = "undo") -> dict:
        """Become what a power cut would leave. Either way un-fsynced data is dropped: a file reverts
        to its last fsynced content (a never-fsynced file is empty, one appended to is short).
        ``mode`` (``POWER_LOSS_MODES``) says what becomes of the namespace operations (create, mkdir,
        unlink, rmdir, rename) that no directory fsync made durable: ``undo`` undoes them, newest
        first (the worst POSIX allows); ``entries-kept`` keeps every one, as a crash on ext4 often
        leaves it (the journal committed the entries, delayed allocation had not written the data: a
        file renamed into place without an fsync is there under its new name, empty or short).

        Returns the account, paths relative to the mount: ``data_lost``, each file whose un-fsynced
        writes were dropped (``path``, where it was at the crash, or the name a pending unlink or
        rename took from it; ``size_before``; ``size_after``; ``ever_fsynced``), ``entries_undone``
        and ``entries_kept`` (``op``; ``path``, for a rename its new name; ``src``, a rename's old
        name; ``folder_ever_fsynced``: its folder had been fsynced, only before it), and, as flat
        lists, ``truncated`` and ``restored`` paths and ``undone`` ("rename A -> B", "create C")."""
        if mode not in POWER_LOSS_MODES:
            raise ValueError(f"unknown power-loss mode {mode!r}; allowed: {', '.join(POWER_LOSS_MODES)}")
        with self._mutex:
            cut = Crash(self.data, self.keep, self.synced_files, self.synced_dirs)
            truncated, restored, data_lost = cut.drop_data(self.dirty, self.ops, mode)
            self.dirty.clear()
            entries_kept = cut.kept(self.ops) if mode == "entries-kept" else []
            undone, entries_undone = cut.undo(self.ops) if mode == "undo" else ([], [])
            self.ops.clear()
            for name in os.listdir(self.keep):
                remove_entry(os.path.join(self.keep, name))
            return {"mode": mode, "truncated": sorted(truncated), "restored": sorted(restored), "undone": undone,
                    "data_lost": sorted(data_lost, key=lambda d: d["path"]), "entries_undone": entries_undone,
                    "entries_kept": entries_kept}

    def status(self) -> dict:
        with self._mutex:
            return {"calls": dict(self.calls), "injected": list(self.injected), "lazy": self.lazy,
                    "dirty_files": len(self.dirty), "pending_namespace_ops": len(self.ops),
                    "rules": {rid: {"call": r.call, "path": r.path, "matched": r.matched, "failed": r.failed}
                              for rid, r in self.rules.items()}}


class _FUSE(FUSE):
    """mfusepy's FUSE, but an ftruncate reaches ``FaultFS.truncate`` with its handle under libfuse 3 as
    under libfuse 2 (mfusepy 3.1 drops the handle there): a file unlinked while open has no path."""

    def open(self, path, fip):
        ret = super().open(path, fip)
        self._direct_io(fip)
        return ret

    def create(self, path, mode, fip):
        ret = super().create(path, mode, fip)
        self._direct_io(fip)
        return ret

    def _direct_io(self, fip) -> None:
        """A file opened only to write bypasses the page cache: each write(2) reaches FaultFS as it is
        made, whole, with no page left for the kernel to write back later. One opened to read goes
        through the page cache, which a shared mmap needs (the kernel refuses one on a direct_io file:
        ENODEV), and is dropped at every open (no keep_cache), so a reader sees what a crash left; its
        write(2)s, opened to read and write, still reach FaultFS as they are made (no writeback_cache:
        the kernel writes through), a mapping's stores as its pages are written back (msync, munmap).
        But while a rule on reads is armed, one opened only to read bypasses the cache too, so that each
        read(2) reaches FaultFS as the reader makes it and an error a rule injects is the reader's
        (through the cache, a readahead takes it and the kernel drops it)."""
        fi = fip.contents
        mode = fi.flags & os.O_ACCMODE
        fi.direct_io = int(mode == os.O_WRONLY or (mode == os.O_RDONLY and self.operations.reads_ruled()))

    def truncate_fuse_3(self, path, length, fip):
        fh = fip.contents.fh if fip else None
        return self.operations.truncate(None if path is None else path.decode(self.encoding, self.errors),
                                        length, fh)


# ---- control socket ----------------------------------------------------------------------------

def _serve(fs: FaultFS, address: str) -> None:
    """JSON lines: {"cmd": "arm", "rule": {...}} | disarm | lazy | crash | status | report | ping."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(socket_address(address))
    srv.listen(8)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=_client, args=(fs, conn), daemon=True).start()


def _client(fs: FaultFS, conn: socket.socket) -> None:
    with conn, conn.makefile("rw") as f:
        for line in f:
            try:
                req = json.loads(line)
                cmd = req["cmd"]
                if cmd == "arm":
                    out = {"id": fs.arm(req["rule"])}
                elif cmd == "disarm":
                    fs.disarm(req.get("id"))
                    out = {}
                elif cmd == "lazy":
                    fs.set_lazy(bool(req["on"]))
                    out = {}
                elif cmd == "crash":
                    out = fs.crash(req.get("mode", "undo"))
                elif cmd == "status":
                    out = fs.status()
                elif cmd == "report":
                    fs.report(req.get("controller"), req.get("points", FAULTFS_POINTS), req.get("planned"),
                              req.get("prefix", ""))
                    out = {}
                elif cmd == "ping":
                    out = {}
                else:
                    raise ValueError(f"unknown command {cmd!r}")
                reply = {"ok": True, **out}
            except Exception as e:  # the caller gets the error; the file system keeps serving
                reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            f.write(json.dumps(reply) + "\n")
            f.flush()


def main(argv: list[str]) -> None:
    backing, mountpoint, control, fsname = argv
    fs = FaultFS(backing)
    threading.Thread(target=_serve, args=(fs, control), daemon=True).start()
    # direct_io for files opened write-only (``_FUSE._direct_io``) and zero cache timeouts: every call
    # reaches this layer, and what a crash changes underneath is what the next reader sees. hard_remove: an unlink is an unlink, as on a local file
    # system, even of a file still open or memory-mapped (without it libfuse renames such a file to
    # .fuse_hidden* until its last close, and the folder it was in cannot be removed meanwhile); the
    # calls on it then come with no path, which FaultFS answers through the handle. Not nullpath_ok:
    # libfuse passes None only where the file has no path left, and the rules and points want paths.
    _FUSE(fs, mountpoint, foreground=True, nothreads=False, fsname=fsname,
          attr_timeout=0, entry_timeout=0, negative_timeout=0, hard_remove=True)


if __name__ == "__main__":
    main(sys.argv[1:])
