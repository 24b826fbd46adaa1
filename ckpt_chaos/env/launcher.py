"""Launch a training job, and make sure it is gone afterwards.

Two launchers start the ranks of a single-host job. ``torchrun`` (``torch.distributed.run``) is the
real elastic launcher; scenarios that test its own behaviour (``--max-restarts``, a rendezvous
through the harness's store proxy) always use it. Otherwise the ranks are forked from a spare
``ckpt_chaos.env.agent`` that has torch imported already and supervises them as torchrun does: the
same environment, the same SIGTERM-then-SIGKILL teardown, the same exit statuses, in a fraction of
the start-up time. ``CKPT_CHAOS_LAUNCHER=torchrun`` makes every launch use torchrun.

torchrun starts each worker in a session of its own, and a worker whose torchrun died keeps
running. So every process of a job carries an environment marker (``CKPT_CHAOS_JOB``) and
``Job.kill`` sends SIGKILL to every process that has it, whoever its parent is now.

Workers run in the harness's current directory (the project under test), with that directory
first on their ``PYTHONPATH``, so that a project's own trainer module is found, then wherever
ckpt-chaos and the trainer are installed (``worker_pythonpath``).
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import signal
import site
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from importlib.machinery import PathFinder
from pathlib import Path

import psutil

from ckpt_chaos.probe import ENV_CONTROLLER

JOB_MARKER = "CKPT_CHAOS_JOB"
ENV_LAUNCHER = "CKPT_CHAOS_LAUNCHER"
LAUNCHERS = ("agent", "torchrun")


# ---- where the workers' code comes from ------------------------------------------------------------

def _inherited_pythonpath() -> list[str]:
    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def _top_spec(name: str):
    """The spec of top-level module ``name`` as a worker finds it: the current directory and
    $PYTHONPATH first, then the harness's own import system (site-packages, editable installs)."""
    return PathFinder.find_spec(name, [os.getcwd(), *_inherited_pythonpath()]) or importlib.util.find_spec(name)


def module_path(module: str) -> Path | None:
    """The file (a module) or folder (a package) that ``python -m MODULE`` runs in a worker, found
    without importing it or its parents (a trainer's package may import torch)."""
    top, *rest = module.split(".")
    spec = _top_spec(top)
    name = top
    for part in rest:
        if spec is None or not spec.submodule_search_locations:
            return None
        name = f"{name}.{part}"
        spec = PathFinder.find_spec(name, list(spec.submodule_search_locations))
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).resolve()
    return Path(spec.origin).resolve() if spec.origin and os.path.isfile(spec.origin) else None


def import_root(module: str) -> Path | None:
    """The folder on the import path that holds top-level module ``module`` (site-packages for an
    installed one, the checkout for a source tree)."""
    where = module_path(module.split(".")[0])
    return where.parent if where is not None else None


def worker_pythonpath(module: str = "reference_trainer") -> str:
    """PYTHONPATH for the processes of a job: the current directory (the project under test), then
    the folders ckpt-chaos and the trainer were imported from when a plain interpreter would not
    look there (a source tree, an editable install), then the inherited PYTHONPATH."""
    default = {Path(p).resolve() for p in site.getsitepackages()}
    entries = [os.getcwd()]
    for name in ("ckpt_chaos", module):
        root = import_root(name)
        if root is not None and root not in default:
            entries.append(str(root))
    entries += _inherited_pythonpath()
    return os.pathsep.join(dict.fromkeys(entries))


def _carries(proc: psutil.Process, marker: str) -> bool:
    try:
        return proc.environ().get(JOB_MARKER) == marker
    except (psutil.Error, OSError):
        return False


def job_processes(marker: str) -> list[psutil.Process]:
    """Every live process (torchrun and workers) started for the job with this marker."""
    return [p for p in psutil.process_iter() if _carries(p, marker)]


def kill_processes(procs: list[psutil.Process]) -> None:
    """SIGKILL each process, those gone already aside; a stopped one is continued so it does not linger."""
    for p in procs:
        try:
            p.send_signal(signal.SIGCONT)
            p.kill()
        except psutil.Error:
            pass


@dataclass
class Job:
    popen: subprocess.Popen
    marker: str
    log_path: Path
    started: float = field(default_factory=time.monotonic)

    def launcher_pids(self) -> list[int]:
        return [self.popen.pid]

    def host_pid(self, rank: int, pid: int) -> int:
        return pid  # one host, one pid namespace

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        """Exit status of torchrun, or None if it is still running after ``timeout`` seconds."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, sig: signal.Signals) -> None:
        """Send a signal to torchrun only (a cluster's preemption notice reaches the launcher)."""
        try:
            self.popen.send_signal(sig)
        except ProcessLookupError:
            pass

    def workers(self) -> list[psutil.Process]:
        return [p for p in job_processes(self.marker) if p.pid != self.popen.pid]

    def rank_pids(self) -> dict[int, int]:
        """rank -> pid, where the launcher says so (torchrun does not: read ``RANK`` of ``workers()``)."""
        return {}

    def kill(self) -> None:
        """SIGKILL every process of the job (launcher and workers), then reap torchrun."""
        for _ in range(3):
            procs = job_processes(self.marker)
            if not procs:
                break
            kill_processes(procs)
            # torchrun is our child: only Popen may reap it. If psutil reaped it, Popen would later
            # get ECHILD and report exit status 0 for a launcher that was SIGKILLed.
            psutil.wait_procs([p for p in procs if p.pid != self.popen.pid], timeout=5)
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass


def _load_prctl():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        return None


# Loaded here, in the parent: a preexec_fn runs between fork and exec in a copy of a process that has
# threads (the probe server, an import in the background), so it must neither import nor dlopen,
# whose locks another thread may have held at the fork (a child hung in preexec_fn seen here).
_PRCTL = _load_prctl()


def _term_when_parent_dies() -> None:
    """In the child: if the harness dies without cleaning up (SIGKILL, crash), torchrun gets SIGTERM
    and takes its workers down with it (Linux PR_SET_PDEATHSIG)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def chosen_launcher(max_restarts: int = 0, rendezvous: str | None = None, launcher: str | None = None) -> str:
    """``torchrun`` where the launch tests torchrun's own behaviour or the user asks for it, else ``agent``."""
    if max_restarts > 0 or rendezvous is not None:
        return "torchrun"
    chosen = launcher or os.environ.get(ENV_LAUNCHER) or "agent"
    if chosen not in LAUNCHERS:
        raise ValueError(f"{ENV_LAUNCHER}={chosen!r}: use one of {', '.join(LAUNCHERS)}")
    return chosen


def _base_env(module: str) -> dict[str, str]:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": worker_pythonpath(module)}
    full_env.pop(ENV_CONTROLLER, None)
    full_env.pop(JOB_MARKER, None)
    return full_env


def launch(run_dir: Path, nproc: int, trainer_args: list[str], *, module: str = "reference_trainer",
           controller: str | None = None, max_restarts: int = 0, env: dict[str, str] | None = None,
           log_name: str = "torchrun.log", rendezvous: str | None = None, rdzv_id: str = "none",
           launcher: str | None = None) -> Job:
    """Start ``python -m MODULE ARGS`` on ``nproc`` ranks with the launcher's output in run_dir.

    ``rendezvous`` ("host:port"): instead of a store of its own, torchrun joins the c10d store that
    already listens there (the harness's, reached through the fault proxy). ``launcher``: ``agent``
    or ``torchrun`` (default: ``chosen_launcher``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    extra = dict(env or {})
    if controller:
        extra[ENV_CONTROLLER] = controller
    if chosen_launcher(max_restarts, rendezvous, launcher) == "agent":
        return _launch_agent(run_dir, nproc, trainer_args, module, extra, log_name, rdzv_id)
    marker = uuid.uuid4().hex
    full_env = {**_base_env(module), JOB_MARKER: marker, **extra}
    where = (["--standalone"] if rendezvous is None else
             ["--nnodes=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={rendezvous}", f"--rdzv-id={rdzv_id}",
              "--rdzv-conf=is_host=false"])
    cmd = [sys.executable, "-m", "torch.distributed.run", *where, f"--nproc_per_node={nproc}",
           f"--max-restarts={max_restarts}", "-m", module, *trainer_args]
    log = open(run_dir / log_name, "ab")
    log.write(f"$ {' '.join(cmd)}\n".encode())
    log.flush()
    popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                             start_new_session=True, preexec_fn=_term_when_parent_dies)
    log.close()
    return Job(popen, marker, run_dir / log_name)


# ---- the agent launcher: spares with torch imported ---------------------------------------------

# Variables read when the interpreter, a preloaded library or torch starts: a spare is started
# with them (LD_PRELOAD and FIU_* for libfiu). Any other variable (the harness's CKPT_CHAOS_*, the
# remote tier's AWS_*) is read later, by the code that needs it, and is given to a rank after the fork.
EXEC_TIME = ("LD_", "PYTHON", "FIU_", "OMP_", "MKL_", "MALLOC", "GLIBC", "TORCH", "CUDA", "NCCL", "GLOO")


def _late(key: str) -> bool:
    return not key.startswith(EXEC_TIME)


@dataclass
class _Spare:
    popen: subprocess.Popen
    marker: str
    status: int  # read end of the agent's status pipe
    errors: object  # the agent's own stderr until it is given a launch


class AgentJob(Job):
    """A launch whose ranks were forked by ``ckpt_chaos.env.agent``."""

    def __init__(self, spare: _Spare, log_path: Path):
        super().__init__(spare.popen, spare.marker, log_path)
        self._status, self._buf, self._ranks = spare.status, b"", {}
        os.set_blocking(self._status, False)

    def rank_pids(self) -> dict[int, int]:
        if not self._ranks and self._status >= 0:
            try:
                while chunk := os.read(self._status, 65536):
                    self._buf += chunk
            except BlockingIOError:
                pass
            for line in self._buf.splitlines():
                msg = json.loads(line)
                if "ranks" in msg:
                    self._ranks = {int(r): pid for r, pid in msg["ranks"].items()}
        return dict(self._ranks)

    def kill(self) -> None:
        super().kill()
        self.rank_pids()  # what the agent said before it died stays known
        if self._status >= 0:
            os.close(self._status)
            self._status = -1


class _Spares:
    """One warm agent per (module, start environment, directory), started as the last one is taken:
    a relaunch, or the next scenario with the same trainer, finds it ready."""

    KEEP = 2  # environments kept warm: the usual one, and one with LD_PRELOAD (libfiu)

    def __init__(self):
        self._idle: dict[tuple, _Spare] = {}
        atexit.register(self.close)

    @staticmethod
    def _key(module: str, env: dict[str, str]) -> tuple:
        return module, os.getcwd(), tuple(sorted(env.items()))

    def _start(self, module: str, env: dict[str, str]) -> _Spare:
        marker = uuid.uuid4().hex
        r, w = os.pipe()
        errors = tempfile.TemporaryFile()
        popen = subprocess.Popen([sys.executable, "-m", "ckpt_chaos.env.agent", module, str(w)],
                                 stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors,
                                 env={**env, JOB_MARKER: marker}, pass_fds=(w,), start_new_session=True,
                                 preexec_fn=_term_when_parent_dies)
        os.close(w)
        return _Spare(popen, marker, r, errors)

    def take(self, module: str, env: dict[str, str]) -> _Spare:
        key = self._key(module, env)
        spare = self._idle.pop(key, None)
        if spare is None or spare.popen.poll() is not None:
            if spare is not None:
                self._discard(spare)
            spare = self._start(module, env)
        while len(self._idle) >= self.KEEP:  # the least recently used environments go cold
            self._discard(self._idle.pop(next(iter(self._idle))))
        self._idle[key] = self._start(module, env)
        return spare

    def prewarm(self, module: str, env: dict[str, str], wait: bool) -> None:
        key = self._key(module, env)
        spare = self._idle.get(key)
        if spare is None or spare.popen.poll() is not None:
            if spare is not None:
                self._discard(spare)
            spare = self._idle[key] = self._start(module, env)
        if wait:
            import select

            buf = b""
            while not buf.endswith(b"\n"):
                if not select.select([spare.status], [], [], 120)[0]:
                    raise RuntimeError(f"the launcher agent for {module} was not ready after 120 s")
                chunk = os.read(spare.status, 4096)
                if not chunk:
                    spare.errors.seek(0)
                    raise RuntimeError(f"the launcher agent for {module} died while importing:\n"
                                       + spare.errors.read().decode(errors="replace")[-3000:])
                buf += chunk

    @staticmethod
    def _discard(spare: _Spare) -> None:
        spare.popen.kill()
        spare.popen.wait()
        os.close(spare.status)
        spare.errors.close()

    def close(self) -> None:
        while self._idle:
            self._discard(self._idle.popitem()[1])


_spares: _Spares | None = None


def close_spares() -> None:
    """Stop the warm agents (also done at exit)."""
    if _spares is not None:
        _spares.close()


def _spares_pool() -> _Spares:
    global _spares
    if _spares is None:
        _spares = _Spares()
    return _spares


def _start_env(module: str, extra: dict[str, str]) -> dict[str, str]:
    """The environment a spare for this launch starts with: the variables read at exec (``_late``)."""
    return {**_base_env(module), **{k: v for k, v in extra.items() if not _late(k)}}


def prewarm(module: str = "reference_trainer", env: dict[str, str] | None = None, wait: bool = False) -> None:
    """Start a spare agent for ``module`` now, so that the next launch with the same start
    environment finds torch imported (``wait``: return once it is)."""
    _spares_pool().prewarm(module, _start_env(module, env or {}), wait)


def _launch_agent(run_dir: Path, nproc: int, trainer_args: list[str], module: str, extra: dict[str, str],
                  log_name: str, rdzv_id: str) -> AgentJob:
    spare = _spares_pool().take(module, _start_env(module, extra))
    log_path = run_dir / log_name
    with open(log_path, "ab") as log:
        log.write(f"$ [ckpt-chaos agent, pid {spare.popen.pid}] python -m {module} {' '.join(trainer_args)} "
                  f"(x{nproc})\n".encode())
    spec = {"nproc": nproc, "module": module, "argv": trainer_args, "log": str(log_path), "run_id": rdzv_id,
            "env": {k: v for k, v in extra.items() if _late(k)}}
    try:
        spare.popen.stdin.write((json.dumps(spec) + "\n").encode())
        spare.popen.stdin.close()
    except BrokenPipeError:
        spare.errors.seek(0)
        raise RuntimeError(f"the launcher agent for {module} died before its launch (exit {spare.popen.wait()}):\n"
                           + spare.errors.read().decode(errors="replace")[-3000:]) from None
    spare.errors.close()
    return AgentJob(spare, log_path)


def run_to_end(run_dir: Path, nproc: int, trainer_args: list[str], timeout: float = 300, **kwargs) -> int:
    """Launch, wait at most ``timeout`` seconds, always clean up; the exit status (or -9 on timeout)."""
    job = launch(run_dir, nproc, trainer_args, **kwargs)
    try:
        rc = job.wait(timeout)
        return -9 if rc is None else rc
    finally:
        job.kill()
