"""What each process of a job did to the checkpoint files, whatever code wrote or read them: a
fanotify recorder.

The probe layer sees what Python does; faultfs sees every call, but only where it is mounted. A
C++ or Rust writer (safetensors), a reader that only maps a file, ``cat`` or ``dd`` run by the
trainer: the kernel's fanotify sees their opens, closes, creations, renames and deletions, for
every process. One group per run, in FID mode (``FAN_REPORT_DFID_NAME | FAN_REPORT_FID |
FAN_REPORT_TARGET_FID``), marks the whole file system under each watched root
(``FAN_MARK_FILESYSTEM``: a mark on a directory would miss a folder made and written at once, as a
save does). Events are kept by their folder's file handle, named once per folder
(``open_by_handle_at``, ``/proc/self/fd``), and written to ``RUN_DIR/files.jsonl``::

  {"t", "launch", "pid", "rank", "job", "op": open|close|create|delete|rename, "path",
   "wrote" (close), "size" (close), "src" (rename), "dir", "source": fanotify|fanotify-mount}

plus a ``watch`` record per mechanism at the start of each launch (``roots``: what it watches),
``unavailable`` (``why``) when it cannot watch (not root, no fanotify, a file system that refuses
the mark, ``CKPT_CHAOS_FILE_EVENTS=off``), and ``overflow`` if the kernel dropped events. Paths are
relative to the run directory (absolute outside it).

Why it is built this way:

* Not ``FAN_ACCESS``/``FAN_MODIFY``: on a whole file system that is every read and write of the
  machine. The close says whether the file was open for writing (``FAN_CLOSE_WRITE``), and its size
  is read as the event is (through the file handle, so a file renamed or removed since still has
  one; null once its inode is gone). No byte counts, no fsync: the probe layer and faultfs have those.
* The handles this module opens are ``O_PATH``: such an open makes no fanotify event (two runs
  recording side by side do not feed each other) and no open call to the file system.
* A folder's path is learned at its creation (``FAN_REPORT_TARGET_FID``: the event carries the new
  folder's handle) and kept through renames (cached paths under a renamed folder are rewritten, not
  dropped): an event is named by the path its folder had when it happened, even if the reader comes
  to it after the trainer renamed ``step_8.tmp`` to ``step_8``. Folders that existed before a launch
  are looked up at the launch.
* Cost. Nearly every event of a whole file system is elsewhere, and each wake-up of the reader costs
  ~30 us of CPU on a 2-core VM: read one by one, the events of a shared machine cost the reader 1 to 1.8 s
  of CPU per run of ``plain-ddp-kill-rank0-mid-file-write`` (28,000 to 71,000 events read). So the
  first event from a folder away from the roots (or above them, but not a root's own parent) has the
  kernel drop that folder's opens and closes from then on (an ignore mark, ``FAN_MARK_IGNORE``,
  evictable); its creations, deletions and renames still come, and a folder renamed into a root is
  heard again (the opens in it between the rename and the reader reaching it are lost). Events read
  per run: 730 to 890; see "What it costs" below.
* The process is named by ``/proc/PID/environ``, read once per pid and launch: a job's process
  carries ``CKPT_CHAOS_RUN_DIR`` (this run) and ``RANK`` or ``LOCAL_RANK`` as it was started (null
  for torchrun's agent). The reader runs beside the job, so it reads that while the process lives;
  a process gone before its first event was read (a ``cat`` that lasts a millisecond) is ``job:
  null``. The harness's own process is left out.
* ``t`` is when the reader read the event (fanotify has no time stamp): milliseconds after it. The
  kernel merges a process's events on one file while they wait unread, each kind once whatever the
  count: a merged event is written as its parts, an ``OPEN|CLOSE_WRITE`` after an open not yet
  closed as that close and then a new open; both kinds of close as the written one first. The
  reader does not pause to gather events, which would merge more of them.
* FUSE (faultfs, mounted over the checkpoint folder when a scenario aims at its points) reports a
  zero fsid, and the kernel refuses FID marks on a whole FUSE file system or mount (``ENODEV``),
  so that mount gets a second group in fd mode with ``FAN_MARK_MOUNT`` (``source:
  "fanotify-mount"``): opens and closes of every process, each with an open file whose path is read
  from ``/proc/self/fd`` (its name when the event is read: a file opened as ``.tmpXYZ`` may close
  as ``model.safetensors``); creations, renames and deletions are not reported in fd mode, faultfs's
  ``faultfs.rename``/``faultfs.remove`` points have them. The kernel opens that file in the harness,
  as the event is read: faultfs does not count the harness's opens against its rules.
* ctypes, not PyPI's ``pyfanotify`` 0.3.0: it has FID/DFID_NAME mode, but it names every event of
  the file system by opening the file itself (``O_RDONLY``, no cache), which on a whole-file-system
  mark opens every file any process touches (and through faultfs, where that open is a call); it
  runs in a forked process that hands events over a datagram socket it drops them from when full,
  and cannot say that the queue was read to its end (``drain``).

What it costs (a 2-core VM shared with other test runs; ``ckpt-chaos run --scenarios
examples/plain_ddp/scenarios plain-ddp-kill-rank0-mid-file-write``, 2 launches, the mark on ``/``),
four runs with the recorder and four without, alternating:

* wall time 11.5 to 13.5 s with it, 12.4 to 14.0 s without: no difference beyond the noise;
* the reader thread: 0.07 to 0.08 s of CPU per run, for 690 to 760 events read, 57 to 63 of
  them in the checkpoint folder (76 to 77 records); the harness's CPU 0.54 to 0.68 s against 0.46
  to 0.60 s without (+0.09 s on average);
* any other process's open and close of a file (4,000 files in 200 folders, best of 5): 4.70 us
  against 4.69 us without, once the folder is quiet; the first event of each folder is read.

Before folders were quieted the reader read 28,000 to 71,000 events (most of them other developers'
work on the same machine) and took 0.9 to 1.8 s of CPU per run, and another process's open and
close of a file in a folder above the run (``/tmp``) took 5.5 to 7.3 us against 2.4 to 3.0 us.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import select
import stat
import struct
import sys
import threading
import time
from pathlib import Path

from ckpt_chaos.probe.auto_state import ENV_RUN_DIR
from ckpt_chaos.probe.run_files import FILES

ENV_SWITCH = "CKPT_CHAOS_FILE_EVENTS"  # "off": record nothing (an "unavailable" record says so)

# <linux/fanotify.h>
FAN_CLOEXEC, FAN_NONBLOCK, FAN_UNLIMITED_QUEUE = 0x1, 0x2, 0x10
FAN_REPORT_FID, FAN_REPORT_DIR_FID, FAN_REPORT_NAME, FAN_REPORT_TARGET_FID = 0x200, 0x400, 0x800, 0x1000
FAN_REPORT_FD_ERROR = 0x2000
FAN_CLOSE_WRITE, FAN_CLOSE_NOWRITE, FAN_OPEN = 0x08, 0x10, 0x20
FAN_CREATE, FAN_DELETE, FAN_Q_OVERFLOW = 0x100, 0x200, 0x4000
FAN_RENAME, FAN_ONDIR = 0x10000000, 0x40000000
FAN_EVENT_ON_CHILD = 0x08000000
FAN_MARK_ADD, FAN_MARK_REMOVE, FAN_MARK_MOUNT, FAN_MARK_FILESYSTEM = 0x1, 0x2, 0x10, 0x100
FAN_MARK_IGNORED_SURV_MODIFY, FAN_MARK_EVICTABLE, FAN_MARK_IGNORE = 0x40, 0x200, 0x400
INFO_FID, INFO_DFID_NAME, INFO_DFID, INFO_OLD_DFID_NAME, INFO_NEW_DFID_NAME = 1, 2, 3, 10, 12
AT_HANDLE_FID = 0x200  # name_to_handle_at: the handle fanotify reports
MAX_HANDLE_SZ = 128

# TARGET_FID: a creation carries the new entry's handle too (a new folder's, to name what is made in it)
FID_FLAGS = (FAN_CLOEXEC | FAN_NONBLOCK | FAN_UNLIMITED_QUEUE | FAN_REPORT_FID | FAN_REPORT_DIR_FID | FAN_REPORT_NAME
             | FAN_REPORT_TARGET_FID)
FID_MASK = FAN_OPEN | FAN_CLOSE_WRITE | FAN_CLOSE_NOWRITE | FAN_CREATE | FAN_DELETE | FAN_RENAME | FAN_ONDIR
# A folder away from the roots: the kernel drops its opens and closes (its creations, deletions and
# renames still come: a folder renamed into a root says so, and its opens are then watched again).
QUIET_MASK = FAN_OPEN | FAN_CLOSE_WRITE | FAN_CLOSE_NOWRITE | FAN_EVENT_ON_CHILD | FAN_ONDIR
FD_FLAGS = FAN_CLOEXEC | FAN_NONBLOCK | FAN_UNLIMITED_QUEUE
FD_MASK = FAN_OPEN | FAN_CLOSE_WRITE | FAN_CLOSE_NOWRITE | FAN_ONDIR

EVENT = struct.Struct("=IBBHQii")  # struct fanotify_event_metadata
HANDLE_BYTES = struct.Struct("=I")
INFO = struct.Struct("=BBH")  # struct fanotify_event_info_header
FID_BUFFER = 1 << 18
FD_BUFFER = EVENT.size * 64  # fd mode: every event read is a file opened, keep few at a time
MAX_EVENT = 2 * (20 + MAX_HANDLE_SZ + 256) + 20 + MAX_HANDLE_SZ + EVENT.size  # a rename's: two names, three handles

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
_libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
_libc.open_by_handle_at.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
_libc.name_to_handle_at.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p,
                                    ctypes.POINTER(ctypes.c_int), ctypes.c_int]


def _oserror(what: str) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, f"{what}: {os.strerror(e)}")


def _init(flags: int, event_flags: int = os.O_RDONLY | os.O_CLOEXEC | os.O_LARGEFILE) -> int:
    fd = _libc.fanotify_init(flags, event_flags)
    if fd < 0:
        raise _oserror("fanotify_init")
    return fd


def _mark(fd: int, flags: int, mask: int, path: str) -> None:
    if _libc.fanotify_mark(fd, FAN_MARK_ADD | flags, mask, -100, os.fsencode(path)) != 0:
        raise _oserror(f"fanotify_mark {path}")


def _fsid(path: str) -> bytes:
    """The fsid an FID record carries for ``path``'s file system (statfs's two 32-bit words)."""
    f = os.statvfs(path).f_fsid
    return struct.pack("=II", f & 0xFFFFFFFF, (f >> 32) & 0xFFFFFFFF)


_why: list[str | None] = []


def available() -> str | None:
    """Why the recorder cannot run here (None: it can): one line, with what to do."""
    if os.environ.get(ENV_SWITCH, "").lower() in ("0", "off", "no", "false"):
        return f"turned off ({ENV_SWITCH}={os.environ[ENV_SWITCH]}); unset it to record file events"
    if _why:
        return _why[0]
    why = None
    if not sys.platform.startswith("linux"):
        why = "fanotify is Linux's; file events are recorded on Linux only"
    elif os.geteuid() != 0:
        why = "fanotify's whole-file-system marks need root (CAP_SYS_ADMIN); run the harness as root (CI does)"
    else:
        try:
            fd = _init(FID_FLAGS)
        except OSError as e:
            why = {errno.ENOSYS: "this kernel has no fanotify (CONFIG_FANOTIFY); use a kernel built with it",
                   errno.EPERM: "fanotify_init was refused (EPERM): the harness needs CAP_SYS_ADMIN "
                                "(a container: --cap-add SYS_ADMIN)",
                   errno.EINVAL: "this kernel's fanotify cannot report file handles and names (Linux >= 5.17 "
                                 "needed)"}.get(e.errno, f"fanotify_init failed: {e.strerror}")
        else:
            try:  # an inode mark on / costs nothing, and says whether the kernel knows FAN_RENAME
                _mark(fd, 0, FID_MASK, "/")
            except OSError as e:
                why = (f"this kernel's fanotify refuses the events recorded ({e.strerror}): FAN_RENAME needs "
                       "Linux >= 5.17")
            finally:
                os.close(fd)
    _why.append(why)
    return why


class FileEvents:
    """Record the file events under ``roots`` to ``run_dir/files.jsonl`` (a context manager).

    ``launch(n)`` before each launch, ``drain()`` once its processes are gone (every event they made
    is then written), ``close()`` at the end. A reader thread drains the queue all along."""

    def __init__(self, run_dir: Path, roots: list[Path]):
        self.run_dir = os.path.realpath(run_dir)
        self.roots = sorted({os.path.realpath(r) for r in roots})
        self._parents = {os.path.dirname(r) for r in self.roots}
        self.pid = os.getpid()
        self.why = available()
        # events read, kept (in a root), in a folder gone before it was named, lost (fd mode: the file
        # could not be opened for us), overflows, misread; the reader thread's CPU seconds
        self.stats = {"events": 0, "kept": 0, "unresolved": 0, "lost": 0, "overflow": 0, "errors": 0,
                      "cpu_s": 0.0}
        self._launch = 0
        self._lock = threading.Lock()  # the reader's state (caches, launch number) and the output file
        self._done = threading.Condition()
        self._asked = self._answered = 0
        self._stop = False
        self._procs: dict[int, tuple[bool | None, int | None]] = {}
        self._dirs: dict[bytes, str | None] = {}  # fsid + file handle of a directory -> its path
        self._outside: set[bytes] = set()  # the directories neither in a root nor above one
        self._toward: dict[bytes, set[bytes]] = {}  # a directory above roots -> its entries on the way
        self._quiet: set[bytes] = set()  # directories whose opens and closes the kernel drops (_hush)
        self._unclosed: dict[tuple[int, str], int] = {}  # (pid, path) -> its opens not closed yet
        self._quieting = True
        self._mount_fds: dict[bytes, int] = {}  # fsid -> a directory on that file system
        self._fid_fd = self._fd_fd = -1
        self._watched: dict[str, list[str]] = {}  # source -> roots it watches
        self._refused: list[str] = []
        self._thread: threading.Thread | None = None
        self._wake = os.pipe()
        for fd in self._wake:
            os.set_blocking(fd, False)
        self._out = open(Path(run_dir) / FILES, "a")
        if self.why is None:
            try:
                self._mark_all()
            except BaseException:
                self.close()
                raise
            if self._watched:
                self._thread = threading.Thread(target=self._read, name="fileevents", daemon=True)
                self._thread.start()
            else:
                self.why = "; ".join(self._refused)

    def __enter__(self) -> "FileEvents":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- marks ----------------------------------------------------------------------------------

    def _places(self) -> list[tuple[str, str]]:
        """(root, path to mark): each root's nearest existing folder, and every mount inside a root."""
        places = []
        for root in self.roots:
            p = root
            while not os.path.exists(p):  # made by the launch; the file system under it is marked now
                p = os.path.dirname(p)
            places.append((root, p))
        try:
            with open("/proc/self/mountinfo") as f:
                mounts = [line.split()[4].replace("\\040", " ") for line in f]
        except OSError:
            mounts = []
        places += [(m, m) for m in mounts for r in self.roots if m.startswith(r + "/")]
        return places

    def _mark_all(self) -> None:
        done_fs: set[bytes] = set()
        done_mounts: set[str] = set()
        for root, place in self._places():
            fsid = _fsid(place)
            try:
                if fsid not in done_fs:
                    if self._fid_fd < 0:
                        self._fid_fd = _init(FID_FLAGS)
                    _mark(self._fid_fd, FAN_MARK_FILESYSTEM, FID_MASK, place)
                    done_fs.add(fsid)
                    self._mount_fds.setdefault(fsid, os.open(place, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
                self._watched.setdefault("fanotify", []).append(root)
                continue
            except OSError as e:
                if e.errno not in (errno.ENODEV, errno.EXDEV, errno.EOPNOTSUPP):
                    self._refused.append(f"the file system under {place} refuses a fanotify mark ({e.strerror})")
                    continue
            # a file system without a usable fsid (FUSE): its mount, in fd mode
            mount = _mount_of(place)
            try:
                if mount not in done_mounts:
                    if self._fd_fd < 0:
                        try:
                            self._fd_fd = _init(FD_FLAGS | FAN_REPORT_FD_ERROR)
                        except OSError:  # before Linux 6.13: an fd that cannot be opened fails the read
                            self._fd_fd = _init(FD_FLAGS)
                    _mark(self._fd_fd, FAN_MARK_MOUNT, FD_MASK, mount)
                    done_mounts.add(mount)
                self._watched.setdefault("fanotify-mount", []).append(root)
            except OSError as e:
                self._refused.append(f"the file system under {place} refuses fanotify marks ({e.strerror})")

    # ---- the harness's side -----------------------------------------------------------------------

    def launch(self, n: int) -> None:
        """Attribute what follows to launch ``n``; write its ``watch`` (or ``unavailable``) record."""
        self.drain()
        known = self._known_dirs() if self._thread is not None else {}
        t = time.time()
        with self._lock:
            self._launch = n
            self._procs.clear()  # a pid of the last launch may be another process now
            self._unclosed.clear()
            self._dirs.update(known)
            self._outside.clear()
            self._toward.clear()
            if self.why is not None and not self._watched:
                self._write([{"op": "unavailable", "launch": n, "why": self.why}])
                return
            self._write([{"op": "watch", "launch": n, "t": t, "source": source,
                          "roots": [self._rel(r) for r in roots]} for source, roots in self._watched.items()]
                        + ([{"op": "unavailable", "launch": n, "why": "; ".join(self._refused)}]
                           if self._refused else []))

    def drain(self, timeout: float = 60.0) -> bool:
        """Return once every event queued before the call is written (False: not within ``timeout``)."""
        if self._thread is None or not self._thread.is_alive():
            return self._thread is None
        with self._done:
            self._asked += 1
            asked = self._asked
        self._poke(b"d")
        with self._done:
            return self._done.wait_for(lambda: self._answered >= asked or not self._thread.is_alive(), timeout) \
                and self._answered >= asked

    def _poke(self, what: bytes) -> None:
        try:
            os.write(self._wake[1], what)
        except BlockingIOError:  # the reader has plenty to wake it already
            pass

    def close(self) -> None:
        if self._thread is not None:
            self.drain()
            self._stop = True
            self._poke(b"s")
            self._thread.join(10)
            self._thread = None
        for fd in (self._fid_fd, self._fd_fd, *self._mount_fds.values(), *self._wake):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fid_fd = self._fd_fd = -1
        self._mount_fds.clear()
        self._wake = (-1, -1)
        if not self._out.closed:
            self._out.close()

    # ---- the reader -------------------------------------------------------------------------------

    def _read(self) -> None:
        # fd -> read size, the largest event there, parser
        sources = {fd: how for fd, how in ((self._fid_fd, (FID_BUFFER, MAX_EVENT, self._fid_events)),
                                           (self._fd_fd, (FD_BUFFER, EVENT.size, self._fd_events))) if fd >= 0}
        poll = select.poll()
        for fd in (*sources, self._wake[0]):
            poll.register(fd, select.POLLIN)
        # A whole file system's events come a few at a time: each pass costs little besides them (no
        # pause to gather more, though: the kernel merges a process's events on a file while unread).
        while not self._stop:
            ready = [fd for fd, _ in poll.poll(1000)]
            asked = self._asked  # a drain asked for before this point is answered by this pass
            if self._wake[0] in ready:
                try:
                    os.read(self._wake[0], 4096)
                except BlockingIOError:
                    pass
            records: list[dict] = []
            with self._lock:
                try:
                    for fd, how in sources.items():
                        if fd in ready or asked != self._answered:
                            self._read_all(fd, *how, records)
                finally:
                    self._write(records)
                    self.stats["cpu_s"] = round(time.thread_time(), 4)  # this thread's, all of it
            if asked != self._answered:
                with self._done:
                    self._answered = asked
                    self._done.notify_all()

    def _read_all(self, fd: int, size: int, largest: int, parse, records: list[dict]) -> None:
        while True:
            try:
                buf = os.read(fd, size)
            except BlockingIOError:
                return
            except OSError:  # fd mode before FAN_REPORT_FD_ERROR: the kernel could not open an event's file
                self.stats["lost"] += 1
                continue
            if not buf:
                return
            parse(buf, time.time(), records)
            if len(buf) <= size - largest:  # the read took every event there was
                return

    def _fid_events(self, buf: bytes, t: float, records: list[dict]) -> None:
        off, n, count = 0, len(buf), 0
        outside, toward = self._outside, self._toward
        while off + EVENT.size <= n:
            length, _vers, _, meta, mask, _fd, pid = EVENT.unpack_from(buf, off)
            count += 1
            if mask & FAN_Q_OVERFLOW:
                self.stats["overflow"] += 1
                records.append({"op": "overflow", "launch": self._launch, "t": t, "source": "fanotify"})
            elif pid != self.pid:
                at = off + meta
                # Nearly every event of the file system is in a folder known to be away from the roots,
                # or above them with another name: its first record says so, the rest is not parsed.
                if not mask & FAN_RENAME and buf[at] == INFO_DFID_NAME:
                    head = at + 20 + HANDLE_BYTES.unpack_from(buf, at + 12)[0]
                    key = buf[at + 4:head]
                    if key in outside:
                        off += length
                        continue
                    names = toward.get(key)
                    if names is not None and buf[head:buf.index(b"\0", head)] not in names:
                        off += length
                        continue
                try:
                    self._fid_event(buf, at, off + length, mask, pid, t, records)
                except Exception as e:  # one event misread must not end the recording
                    self._failed(e)
            off += length
        self.stats["events"] += count

    def _fid_event(self, buf: bytes, at: int, end: int, mask: int, pid: int, t: float, records: list[dict]) -> None:
        info: dict[int, tuple[bytes, str | None]] = {}
        while at + INFO.size <= end:
            kind, _, length = INFO.unpack_from(buf, at)
            if not length:
                break
            if kind in (INFO_FID, INFO_DFID, INFO_DFID_NAME, INFO_OLD_DFID_NAME, INFO_NEW_DFID_NAME):
                # fsid (8 bytes), then a struct file_handle: handle_bytes, handle_type, f_handle
                size = struct.unpack_from("=I", buf, at + 12)[0]
                key = buf[at + 4:at + 20 + size]
                name = None
                if kind not in (INFO_FID, INFO_DFID):
                    raw = buf[at + 20 + size:at + length]
                    name = os.fsdecode(raw[:raw.index(b"\0")] if b"\0" in raw else raw)
                info[kind] = (key, name)
            at += length
        is_dir = bool(mask & FAN_ONDIR)
        if mask & FAN_RENAME:
            old, new = info.get(INFO_OLD_DFID_NAME), info.get(INFO_NEW_DFID_NAME)
            if old is None or new is None:
                return
            src, path = self._path(*old), self._path(*new)
            if is_dir and src is not None and path is not None:
                self._moved(src, path)
            if (src is not None and self._inside(src)) or (path is not None and self._inside(path)):
                records.append(self._record(t, pid, "rename", path or "?", is_dir, src=src or "?"))
                self.stats["kept"] += 1
            return
        where = info.get(INFO_DFID_NAME) or info.get(INFO_DFID)
        if where is None:
            return
        path = self._path(*where)
        if path is None or not self._inside(path):
            return
        self.stats["kept"] += 1
        own = info.get(INFO_FID)
        if mask & FAN_CREATE:
            if is_dir and own is not None:
                self._dirs[own[0]] = path  # its path now, before anything in it is read
            records.append(self._record(t, pid, "create", path, is_dir))
        size = None if is_dir or own is None or not mask & (FAN_CLOSE_WRITE | FAN_CLOSE_NOWRITE) else self._size(own[0])
        for op, wrote in self._opens_and_closes(pid, path, mask):
            records.append(self._record(t, pid, op, path, is_dir, wrote=wrote, size=size))
        if mask & FAN_DELETE:
            records.append(self._record(t, pid, "delete", path, is_dir))

    def _fd_events(self, buf: bytes, t: float, records: list[dict]) -> None:
        off, n = 0, len(buf)
        while off + EVENT.size <= n:
            length, _vers, _, _meta, mask, fd, pid = EVENT.unpack_from(buf, off)
            off += length
            self.stats["events"] += 1
            if mask & FAN_Q_OVERFLOW:
                self.stats["overflow"] += 1
                records.append({"op": "overflow", "launch": self._launch, "t": t, "source": "fanotify-mount"})
            if fd < 0:
                if fd != -1:  # FAN_REPORT_FD_ERROR: the kernel could not open the file for us
                    self.stats["lost"] += 1
                continue
            try:
                if pid == self.pid:
                    continue
                path = _undeleted(os.readlink(f"/proc/self/fd/{fd}"))
                if not self._inside(path):
                    continue
                st = os.fstat(fd)
            except OSError:
                self.stats["lost"] += 1
                continue
            finally:
                os.close(fd)
            self.stats["kept"] += 1
            is_dir = stat.S_ISDIR(st.st_mode) or bool(mask & FAN_ONDIR)
            try:
                for op, wrote in self._opens_and_closes(pid, path, mask):
                    records.append(self._record(t, pid, op, path, is_dir, source="fanotify-mount", wrote=wrote,
                                                size=st.st_size if stat.S_ISREG(st.st_mode) else None))
            except Exception as e:
                self._failed(e)

    def _failed(self, e: Exception) -> None:
        self.stats["errors"] += 1
        if self.stats["errors"] == 1:
            print(f"ckpt-chaos: file events: an event could not be read ({type(e).__name__}: {e}); "
                  "recording goes on", file=sys.stderr, flush=True)

    # ---- paths and processes --------------------------------------------------------------------

    def _path(self, key: bytes, name: str | None) -> str | None:
        """The path an event names: its directory's (resolved once) and the name in it."""
        try:
            folder = self._dirs[key]
        except KeyError:
            folder = self._dirs[key] = self._resolve(key)
            if folder is None:
                self.stats["unresolved"] += 1
        if folder is None:
            self._outside.add(key)
            return None
        if key not in self._toward and not self._inside(folder):
            below = self._below(folder)
            if below:
                self._toward[key] = below  # above a root: only the names on the way to one count
            else:
                self._outside.add(key)  # neither in a root nor above one: nothing in it is ever kept
            # a root's own folder is opened (listed) as its parent's child: that one stays loud
            if key not in self._quiet and self._quieting and folder.rstrip("/") not in self._parents:
                self._hush(key, True)
        if name is None or name == ".":  # an event on the directory itself
            return folder
        return folder.rstrip("/") + "/" + name

    def _opens_and_closes(self, pid: int, path: str, mask: int) -> list[tuple[str, bool | None]]:
        if not mask & (FAN_OPEN | FAN_CLOSE_WRITE | FAN_CLOSE_NOWRITE):
            return []
        out, self._unclosed[pid, path] = _opens_and_closes(mask, self._unclosed.get((pid, path), 0))
        return out

    def _below(self, folder: str) -> set[bytes]:
        """The names in ``folder`` on the way to a root (none: it is not above one)."""
        prefix = folder.rstrip("/") + "/"
        return {os.fsencode(r[len(prefix):].split("/")[0]) for r in self.roots if r.startswith(prefix)}

    def _hush(self, key: bytes, on: bool) -> None:
        """Have the kernel drop a folder's opens and closes (``on``), or deliver them again. Nearly all of
        a file system's events are in a few folders (a Python import's): each is then read once, not
        every time, and the reader is woken for little else (each wake-up costs ~30 us of CPU)."""
        fd = self._open_handle(key)
        if fd is None:
            return
        try:
            flags = (FAN_MARK_ADD | FAN_MARK_EVICTABLE if on else FAN_MARK_REMOVE) | FAN_MARK_IGNORE \
                | FAN_MARK_IGNORED_SURV_MODIFY
            # by /proc/self/fd: the mark takes no O_PATH descriptor, the path lookup follows that link
            done = _libc.fanotify_mark(self._fid_fd, flags, QUIET_MASK, -100, f"/proc/self/fd/{fd}".encode()) == 0
        finally:
            os.close(fd)
        if on and done:
            self._quiet.add(key)
        elif on and ctypes.get_errno() == errno.EINVAL:
            self._quieting = False  # before Linux 6.0 (FAN_MARK_IGNORE): every event is read
        elif not on:
            self._quiet.discard(key)

    def _open_handle(self, key: bytes) -> int | None:
        mount_fd = self._mount_fds.get(key[:8])
        if mount_fd is None:
            return None
        fd = _libc.open_by_handle_at(mount_fd, key[8:], os.O_PATH | os.O_CLOEXEC)
        return fd if fd >= 0 else None  # ESTALE: gone, and its inode with it

    def _resolve(self, key: bytes) -> str | None:
        fd = self._open_handle(key)
        if fd is None:
            return None
        try:
            return _undeleted(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            return None
        finally:
            os.close(fd)

    def _size(self, key: bytes) -> int | None:
        fd = self._open_handle(key)
        if fd is None:
            return None
        try:
            return os.fstat(fd).st_size
        except OSError:
            return None
        finally:
            os.close(fd)

    def _moved(self, src: str, dst: str) -> None:
        """A directory was renamed: the paths cached under it follow (dropping them would name the
        events still queued from inside it by where the directory is when they are read)."""
        prefix = src.rstrip("/") + "/"
        self._outside.clear()  # what was away from the roots may be in one now
        self._toward.clear()
        for key, path in self._dirs.items():
            if path is not None and (path == src or path.startswith(prefix)):
                self._dirs[key] = dst + path[len(src):]
                if key in self._quiet and (self._inside(self._dirs[key]) or self._dirs[key] in self._parents):
                    self._hush(key, False)  # into a root, or now holding one

    def _known_dirs(self) -> dict[bytes, str]:
        """The folders under the roots now, by handle: events from inside a folder renamed before the
        reader comes to them are named by the path the folder had."""
        found = {}
        buf = ctypes.create_string_buffer(8 + MAX_HANDLE_SZ)
        mount_id = ctypes.c_int()
        for root in self.roots:
            if not os.path.isdir(root):
                continue
            fsid = _fsid(root)
            if fsid not in self._mount_fds:
                continue
            for folder, _dirs, _files in os.walk(root):
                struct.pack_into("=I", buf, 0, MAX_HANDLE_SZ)
                if _libc.name_to_handle_at(-100, os.fsencode(folder), buf, ctypes.byref(mount_id), AT_HANDLE_FID) == 0:
                    size = struct.unpack_from("=I", buf, 0)[0]
                    found[fsid + buf.raw[:8 + size]] = folder
        return found

    def _who(self, pid: int) -> tuple[bool | None, int | None]:
        """(job, rank) of a process: whether it is one of this run's job (None: gone, unknown)."""
        try:
            return self._procs[pid]
        except KeyError:
            pass
        who: tuple[bool | None, int | None] = (None, None)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                raw = f.read()
        except OSError:
            raw = b""
        if raw:  # empty: gone, or exiting (a zombie has no memory left to read it from)
            env = dict(kv.partition(b"=")[::2] for kv in raw.split(b"\0") if b"=" in kv)
            ours = env.get(ENV_RUN_DIR.encode())
            job = False
            if ours is not None:
                value = os.fsdecode(ours)
                if not os.path.isabs(value):
                    try:
                        value = os.path.join(os.readlink(f"/proc/{pid}/cwd"), value)
                    except OSError:
                        pass
                job = os.path.realpath(value) == self.run_dir
            rank = env.get(b"RANK", env.get(b"LOCAL_RANK")) if job else None
            who = (job, int(rank) if rank is not None and rank.strip().isdigit() else None)
        self._procs[pid] = who
        return who

    def _inside(self, path: str) -> bool:
        return any(path == r or path.startswith(r + "/") for r in self.roots)

    def _rel(self, path: str) -> str:
        if path == self.run_dir:
            return "."
        if path.startswith(self.run_dir + "/"):
            return path[len(self.run_dir) + 1:]
        return path

    def _record(self, t: float, pid: int, op: str, path: str, is_dir: bool, source: str = "fanotify",
                wrote: bool | None = None, size: int | None = None, src: str | None = None) -> dict:
        job, rank = self._who(pid) if pid > 0 else (None, None)
        r = {"t": round(t, 6), "launch": self._launch, "pid": pid, "rank": rank, "job": job, "op": op,
             "path": self._rel(path)}
        if op == "close":
            r["wrote"] = wrote
            r["size"] = size
        if op == "rename":
            r["src"] = self._rel(src)
        r["dir"] = is_dir
        r["source"] = source
        return r

    def _write(self, records: list[dict]) -> None:
        if records and not self._out.closed:
            try:
                self._out.write("".join(json.dumps(r) + "\n" for r in records))
                self._out.flush()
            except (OSError, ValueError) as e:  # a full disk under the run directory: keep reading
                self._failed(e)


def _opens_and_closes(mask: int, open_before: int) -> tuple[list[tuple[str, bool | None]], int]:
    """The opens and closes one event stands for, in order, and how many of the process's opens of the
    file are left unclosed. The kernel merges a process's events on one file while they wait unread:
    ``OPEN|CLOSE_WRITE`` after an open not yet closed is that file's close, then another open; a merged
    event holds each kind once, whatever the count (both closes: one file written, one only read,
    put in the order of a save that reads back what it wrote)."""
    closes = ([True] if mask & FAN_CLOSE_WRITE else []) + ([False] if mask & FAN_CLOSE_NOWRITE else [])
    out: list[tuple[str, bool | None]] = []
    if closes and open_before > 0:
        out.append(("close", closes.pop(0)))
        open_before -= 1
    if mask & FAN_OPEN:
        out.append(("open", None))
        open_before += 1
    out += [("close", c) for c in closes]
    return out, max(0, open_before - len(closes))


def _undeleted(path: str) -> str:
    return path[:-len(" (deleted)")] if path.endswith(" (deleted)") else path


def _mount_of(path: str) -> str:
    p = os.path.realpath(path)
    while not os.path.ismount(p):
        p = os.path.dirname(p)
    return p
