"""What breaks: the actions that inject a fault, and the heal step that undoes what can be undone.

A nemesis acts while the rank whose event triggered it is blocked at its probe point, so a
SIGKILL "mid-shard-write" lands exactly there. Each action returns the answer for that rank
(``None``: continue) and a record of what it did, which goes into the history.

Process faults need nothing beyond signals to the job's own processes; ``requirements`` says
what a kind needs so the runner can skip, loudly, a fault this machine cannot inject.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field

import psutil

from .launcher import Job
from .scenario import Fault, target_ranks


def requirements(kind: str) -> str | None:
    """Why this machine cannot inject ``kind`` (None: it can)."""
    return None  # process faults: signals to our own children always work


def _signal(pid: int, sig: signal.Signals) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _wait_gone(pids: list[int], timeout: float = 10.0) -> None:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=timeout)


@dataclass
class ProcessNemesis:
    """SIGKILL, SIGTERM-then-SIGKILL, SIGSTOP and in-process exceptions for the current launch."""

    job: Job
    world_size: int
    pids: dict[int, int]  # rank -> pid of the current launch, filled from probe events
    stopped: list[int] = field(default_factory=list)
    grace_expired: list[float] = field(default_factory=list)  # when a term's grace ran out with the job alive
    _timers: list[threading.Timer] = field(default_factory=list)

    def fire(self, fault: Fault, event: dict) -> tuple[dict | None, dict]:
        ranks = target_ranks(fault.target, self.world_size, triggering=event["rank"])
        pids = {r: self.pids[r] for r in ranks if r in self.pids}
        missing = sorted(set(ranks) - set(pids))
        record = {"ranks": ranks, "pids": sorted(pids.values()), "missing_ranks": missing}
        if fault.kind == "kill":
            if fault.target.startswith("node:"):
                # Node loss: the launcher dies with its workers, nobody is left to report it.
                record["launcher_pid"] = self.job.popen.pid
                _signal(self.job.popen.pid, signal.SIGKILL)
            for pid in pids.values():
                _signal(pid, signal.SIGKILL)
            _wait_gone(list(pids.values()))
            return None, record
        if fault.kind == "term":
            if fault.target in ("all", "node:0"):
                record["to"] = "launcher"  # as a scheduler's preemption notice reaches the job
                self.job.signal(signal.SIGTERM)
            else:
                for pid in pids.values():
                    _signal(pid, signal.SIGTERM)
            timer = threading.Timer(fault.grace_s, self._grace_expired)
            timer.daemon = True
            timer.start()
            self._timers.append(timer)
            record["grace_s"] = fault.grace_s
            return None, record
        if fault.kind == "stop":
            for pid in pids.values():
                if _signal(pid, signal.SIGSTOP):
                    self.stopped.append(pid)
            return None, record
        if fault.kind == "raise":
            return {"do": "raise", "error": fault.error, "message": f"at {event['point']}"}, record
        raise ValueError(f"not a process fault: {fault.kind}")

    def _grace_expired(self) -> None:
        if self.job.poll() is None:
            self.grace_expired.append(time.time())
            self.job.kill()

    def heal(self) -> None:
        """Cancel pending grace timers and resume stopped processes (if any are left)."""
        for t in self._timers:
            t.cancel()
        for pid in self.stopped:
            _signal(pid, signal.SIGCONT)
        self.stopped.clear()
