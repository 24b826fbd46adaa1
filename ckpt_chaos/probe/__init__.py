"""Named fault points that a trainer calls, so a controller can act at exactly that point.

A trainer calls ``probe.point("ckpt.commit", step=20)`` at each place where a fault is
interesting. Without a controller (the environment variable ``CKPT_CHAOS_CONTROLLER`` unset)
``point`` returns at once: one global lookup and a comparison, nothing measurable.

With a controller, the calling thread sends the event (one JSON line over a Unix socket) and
blocks until the controller answers. While it blocks the controller may do anything to the
process: SIGKILL it (a kill *exactly here*), SIGSTOP it, fill a disk, or simply hold it while
another rank reaches its own point. The answer is one of:

* ``{"do": "continue"}``: go on;
* ``{"do": "raise", "error": "oom" | "io" | "runtime", "message": "..."}``: raise an
  exception from the call site (a simulated OOM or I/O error inside the trainer).

The trainer keeps no knowledge of faults: it only names its points. Point names used by the
reference trainer are listed in ``POINTS``; third-party trainers may add their own.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import threading
import time

ENV_CONTROLLER = "CKPT_CHAOS_CONTROLLER"
ENV_ATTEMPT = "CKPT_CHAOS_ATTEMPT"  # set by the harness on each relaunch

# The points the reference trainer reports, in the order a save goes through them.
POINTS = (
    "train.start",  # process group up, before resume
    "load.begin",  # a checkpoint was chosen, before dcp.load
    "load.end",  # state loaded and verified
    "step.begin",  # an optimizer step starts (step = the step about to run)
    "microstep.end",  # one micro-batch forward/backward done
    "step.end",  # optimizer step done, trajectory record written
    "ckpt.stage",  # a save starts: state captured (and, for async saves, staged)
    "ckpt.shard.write",  # bytes of this rank's shard file written; fires at each 10% of the plan
    "ckpt.shard.done",  # this rank's shard file closed
    "ckpt.metadata",  # DCP wrote .metadata (all shards are complete)
    "ckpt.fsync",  # every file and the temporary directory fsynced (rank 0)
    "ckpt.manifest",  # manifest written and fsynced (rank 0)
    "ckpt.commit",  # temporary directory renamed to step_XXXXXXXX, parent fsynced (rank 0)
    "ckpt.latest",  # `latest` pointer moved (rank 0)
    "ckpt.retention",  # old checkpoints deleted (rank 0)
    "ckpt.async.done",  # an async save finished writing and was committed
    "ckpt.failed",  # a save failed and was abandoned
    "sigterm.received",  # this rank noticed its SIGTERM at a micro-step boundary
    "sigterm.agreed",  # all ranks agreed to stop at this boundary
    "train.end",  # training finished, before the process group is destroyed
    # the remote tier's uploader process (role "uploader", reference_trainer/remote.py)
    "upload.begin",  # an upload of a committed checkpoint starts
    "upload.write",  # bytes of one object sent; fires at each 10% of the file
    "upload.object",  # one object put
    "upload.verify",  # every object put; checking them against the manifest
    "upload.durable",  # manifest.json put: the remote copy is durable
    "upload.failed",  # an attempt failed (it is retried with backoff)
    "upload.end",  # done with a checkpoint, whatever the outcome (`durable` in its info)
    "remote.retention",  # old remote checkpoints deleted
    "remote.download",  # rank 0, at start: a newer durable remote checkpoint is being downloaded
    "remote.restored",  # ... validated and committed locally
)
ENV_ROLE = "CKPT_CHAOS_ROLE"  # "uploader" for the remote tier's uploader; ranks leave it unset


class InjectedFault(RuntimeError):
    """An error raised on the controller's order at a probe point."""


class _Controller:
    def __init__(self, address: str):
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(address)
        self._file = self._sock.makefile("rwb", buffering=0)
        self._lock = threading.Lock()
        self._rank = _rank()
        self._role = os.environ.get(ENV_ROLE, "rank")
        self._pid = os.getpid()
        self._seq = 0
        self._lost = False
        # Which launch this process belongs to: a harness relaunch, or a restart by torchrun.
        self._attempt = int(os.environ.get(ENV_ATTEMPT, "0"))
        self._restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    def report(self, name: str, info: dict) -> None:
        with self._lock:
            self._seq += 1
            if self._rank is None:  # a launcher of its own may make the process group before telling the rank
                self._rank = _rank()
            msg = {"rank": 0 if self._rank is None else self._rank, "role": self._role, "pid": self._pid,
                   "seq": self._seq, "attempt": self._attempt, "restart": self._restart,
                   "point": name, "t": time.time(), "info": info}
            try:
                self._file.write(json.dumps(msg).encode() + b"\n")
                line = self._file.readline()
                problem = "" if line else "the controller closed the connection"
            except OSError as e:
                line, problem = b"", repr(e)
        if not line:
            # A probe never changes behaviour on its own: go on, unprobed, but say so once (the
            # harness's faults can no longer fire at this rank).
            if not self._lost:
                self._lost = True
                print(f"ckpt-chaos probe: rank {self._rank} (pid {self._pid}) lost its controller at {name}: "
                      f"{problem}; going on unprobed", file=sys.stderr, flush=True)
            return
        answer = json.loads(line)
        if answer.get("do") == "raise":
            raise _exception(answer.get("error", "runtime"), answer.get("message", "injected fault"))


def _rank() -> int | None:
    """This process's global rank: torchrun's RANK, else the process group's once it exists (Lightning
    starts its ranks itself and gives them only LOCAL_RANK), else None (not known yet)."""
    if "RANK" in os.environ:
        return int(os.environ["RANK"])
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return None


def _exception(kind: str, message: str) -> BaseException:
    if kind == "oom":
        import torch  # only on the fault path

        return torch.OutOfMemoryError(f"[ckpt-chaos] simulated out of memory: {message}")
    if kind == "io":
        return OSError(errno.EIO, f"[ckpt-chaos] injected I/O error: {message}")
    return InjectedFault(message)


def _connect() -> _Controller | None:
    address = os.environ.get(ENV_CONTROLLER)
    if not address:
        return None
    return _Controller(address)


_controller: _Controller | None = None
_controller_pid: int | None = None
_connecting = threading.Lock()


def _this_process() -> _Controller | None:
    """The controller connection of this process, made at its first probe point: a process forked
    from one that imported the probe (a rank forked by the launcher agent, a data loader worker)
    reads its own environment and gets its own connection, never its parent's."""
    global _controller, _controller_pid
    pid = os.getpid()
    if _controller_pid != pid:
        with _connecting:
            if _controller_pid != pid:
                _controller = _connect()
                _controller_pid = pid
    return _controller


def _after_fork_in_child() -> None:
    global _connecting, _saving_coverage
    _connecting = threading.Lock()  # another thread of the parent may have held it at the fork
    _saving_coverage = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


# Where a save captures each rank's random streams and where a load has restored them: the probe
# digests this process's streams there, so that a check can tell, rank by rank, whose stream each rank
# went on with after a resume at another world size (check/trajectory.py: resize_rng).
RNG_POINTS = ("ckpt.stage", "load.end")


def rng_digest() -> str:
    """One digest of the random streams this process draws from on the CPU: torch's and NumPy's where
    the process imported them, and Python's. Neither imports nor draws from any of them."""
    import hashlib
    import random

    h = hashlib.sha256(repr(random.getstate()).encode())
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_rng_state"):
        h.update(torch.get_rng_state().numpy().tobytes())
    np = sys.modules.get("numpy")
    if np is not None and hasattr(np, "random"):
        h.update(repr(np.random.get_state()).encode())
    return h.hexdigest()[:16]


def point(name: str, /, **info) -> None:
    """Report that this process reached the named point; returns when the controller says so."""
    controller = _this_process()
    if controller is None:
        return
    _save_coverage()
    if name in RNG_POINTS and "rng" not in info:
        info["rng"] = rng_digest()
    controller.report(name, info)


_saving_coverage = threading.Lock()


def _save_coverage() -> None:
    """Under ``ckpt-chaos run --coverage``: write the lines measured so far, since the controller's
    answer may be a SIGKILL that would take them with the process."""
    coverage = sys.modules.get("coverage")
    cov = coverage.Coverage.current() if coverage is not None else None
    if cov is not None:
        try:
            # one thread at a time: an async save probes from its writer thread while the loop
            # probes too, and coverage.py's save is not thread-safe (concurrent saves failed with
            # "database is locked" and left a rank stuck until the collective timeout)
            with _saving_coverage:
                cov.save()
        except Exception as e:  # measuring must never change the job
            print(f"ckpt-chaos probe: coverage data not saved: {e!r}", file=sys.stderr, flush=True)


def active() -> bool:
    """True when a controller is listening (lets callers skip work done only for the probe)."""
    return _this_process() is not None
