"""faultfs's probe points (``env/faultfs.py``): a job's calls on the mount, reported to the job's
controller and held until it answers, and which process of which job made a call."""

from __future__ import annotations

import errno
import json
import socket
import sys
import threading
import time

from mfusepy import FuseOSError

from ckpt_chaos.env.launcher import kill_pending
from ckpt_chaos.probe import follow

PF_EXITING = 0x4  # <linux/sched.h>: the task is in do_exit()


def tgid(tid: int) -> int:
    try:
        with open(f"/proc/{tid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return tid


def _environ(pid: int) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return dict(kv.decode(errors="replace").partition("=")[::2] for kv in raw.split(b"\0") if b"=" in kv)


def _rank(env: dict[str, str]) -> int:
    rank = env.get("RANK", env.get("LOCAL_RANK", "0"))
    return int(rank) if rank.isdigit() else 0


def _alive(pid: int) -> bool:
    """Neither dead nor dying: a process held here does not die of a SIGKILL before the answer, but
    the call it is held in must not happen."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X") and not kill_pending(pid)


def exiting(tid: int) -> bool:
    """The thread is ending its process (``PF_EXITING``): a call it makes now is the kernel closing what
    the process left open, not the process's own (a writer killed mid-file closes it this way)."""
    try:
        with open(f"/proc/{tid}/stat") as f:
            flags = int(f.read().rpartition(")")[2].split()[6])
    except (OSError, IndexError, ValueError):
        return False
    return bool(flags & PF_EXITING)


class Reporter:
    """The probe events of one controller: a job's calls on this mount, reported and held."""

    MIB = 1 << 20  # without a plan, a write is reported at each MiB it crosses

    def __init__(self, controller: str, points, planned: dict | None, prefix: str):
        self.controller = controller
        self.points = frozenset(points)
        self.follow = follow.Follower(planned)  # the golden run's file of each file written (probe/follow.py)
        self.prefix = prefix.strip("/")
        self._lock = threading.Lock()
        self._file = None
        self._seq = 0
        self._lost = False
        self._env: dict[int, dict[str, str] | None] = {}

    def path(self, path: str) -> str:
        """A path inside the mount as the probe layer names it: relative to the run directory."""
        return f"{self.prefix}/{path.lstrip('/')}" if self.prefix else path.lstrip("/")

    def begin(self, tid: int, path: str) -> tuple[int | None, list[str]]:
        """A handle's first write, under ``path`` (inside the mount): the file's planned size and its
        other names in the golden run (``follow.Follower.open``; a process not of the job counts not)."""
        job = self._job(tid)
        if job is None:
            return follow.planned_size(self.follow.sizes, self.path(path)), []
        env = job[1]
        launch = int(env.get("CKPT_CHAOS_ATTEMPT", "0") or 0) + int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        return self.follow.open("faultfs", _rank(env), self.path(path), launch)

    def cuts(self, planned: int | None, offset: int, size: int) -> list[tuple[int, float | None]]:
        """Where a write of ``size`` bytes at ``offset`` to a file of ``planned`` bytes is reported:
        (file offset, fraction of the plan)."""
        if planned:
            tenths = [-(-k * planned // 10) for k in range(1, 10)]
            return [(b, b / planned) for b in tenths if offset < b <= offset + size]
        return [(b, None) for b in range((offset // self.MIB + 1) * self.MIB, offset + size + 1, self.MIB)]

    def hold(self, point: str, tid: int, **info) -> None:
        """Report ``point`` for the calling process and wait for the controller's answer: raises
        EIO where it says so, EINTR where the caller died meanwhile (the call must not happen)."""
        if point not in self.points:
            return
        job = self._job(tid)
        if job is None:
            return  # not a process of the job (the harness, a shell looking around)
        pid, env = job
        answer = self._send({"rank": _rank(env), "role": env.get("CKPT_CHAOS_ROLE", "rank"),
                             "pid": pid, "attempt": int(env.get("CKPT_CHAOS_ATTEMPT", "0") or 0),
                             "restart": int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0), "point": point,
                             "t": time.time(), "info": {**info, "source": "faultfs"}})
        if not _alive(pid):
            raise FuseOSError(errno.EINTR)
        if answer and answer.get("do") == "raise":
            raise FuseOSError(errno.EIO)

    def of_job(self, tid: int) -> bool:
        """Whether the calling thread is a process of the job's."""
        return self._job(tid) is not None

    def _job(self, tid: int) -> tuple[int, dict[str, str]] | None:
        """The calling process and its environment, when it is one of the job's (the controller's
        address in its environment)."""
        pid = tgid(tid)
        if pid not in self._env:
            self._env[pid] = _environ(pid)
        env = self._env[pid]
        if not env or not env.get("CKPT_CHAOS_CONTROLLER"):
            return None
        return pid, env

    def _send(self, msg: dict) -> dict | None:
        with self._lock:
            self._seq += 1
            msg["seq"] = self._seq
            try:
                if self._file is None:
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    sock.connect(self.controller)
                    self._file = sock.makefile("rwb", buffering=0)
                self._file.write(json.dumps(msg).encode() + b"\n")
                line = self._file.readline()
                if not line:
                    raise ConnectionError("the controller closed the connection")
                return json.loads(line)
            except (OSError, ValueError) as e:
                self._file = None
                if not self._lost:  # the job goes on, unprobed here, and the log says why
                    self._lost = True
                    print(f"faultfs: lost the controller at {msg['point']}: {e!r}", file=sys.stderr, flush=True)
                return None

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
