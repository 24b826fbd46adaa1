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
import re
import select
import signal
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from importlib.machinery import PathFinder
from pathlib import Path

import psutil

from ckpt_chaos.env.lifetime import die_with_parent
from ckpt_chaos.probe import ENV_CONTROLLER
from ckpt_chaos.probe.run_files import TORCHRUN_LOG

JOB_MARKER = "CKPT_CHAOS_JOB"
ENV_LAUNCHER = "CKPT_CHAOS_LAUNCHER"
LAUNCHERS = ("agent", "torchrun")


# ---- where the workers' code comes from ------------------------------------------------------------

def _inherited_pythonpath() -> list[str]:
    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def _top_spec(name: str, cwd: str | None = None):
    """The spec of top-level module ``name`` as a worker finds it: the current directory (or ``cwd``)
    and $PYTHONPATH first, then the harness's own import system (site-packages, editable installs)."""
    return (PathFinder.find_spec(name, [cwd or os.getcwd(), *_inherited_pythonpath()])
            or importlib.util.find_spec(name))


def module_path(module: str, cwd: str | None = None) -> Path | None:
    """The file (a module) or folder (a package) that ``python -m MODULE`` runs in a worker (started
    in ``cwd``, default the current directory), found without importing it or its parents (a
    trainer's package may import torch)."""
    top, *rest = module.split(".")
    spec = _top_spec(top, cwd)
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


def harness_pythonpath() -> str:
    """PYTHONPATH for a worker of the harness itself (a parallel run's, a fan-out job's): ``worker_pythonpath``,
    behind the folder this process imported ckpt-chaos from where that is a source tree or an editable
    install. A worker then runs its parent's harness even where the current directory holds another
    ckpt_chaos: a copy of this checkout whose trainer, and ``ckpt_chaos.probe.layout``, carry a mutant
    (``ckpt_chaos.mutation``), which the trainer's ranks must import and the checks must not."""
    import ckpt_chaos

    here = Path(ckpt_chaos.__file__).resolve().parent.parent
    entries = worker_pythonpath().split(os.pathsep)
    if here not in {Path(p).resolve() for p in site.getsitepackages()}:
        entries.insert(0, str(here))
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


def kill_pending(pid: int) -> bool:
    """SIGKILL is queued for the process (its thread or its thread group): it runs no more of its
    own code, though a call it is blocked in (held by faultfs) may not have returned yet."""
    try:
        with open(f"/proc/{pid}/status") as f:
            masks = [int(line.split()[1], 16) for line in f if line.startswith(("SigPnd:", "ShdPnd:"))]
    except (OSError, ValueError, IndexError):
        return False
    return any(m & (1 << (signal.SIGKILL - 1)) for m in masks)


def poll_until(poll, timeout: float | None, interval: float) -> int | None:
    """``poll()``'s first answer that is not None, or None once ``timeout`` seconds have passed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        rc = poll()
        if rc is not None or (deadline is not None and time.monotonic() >= deadline):
            return rc
        time.sleep(interval)


# How torchrun and faulthandler report a worker killed by a signal of its own making; the nemesis
# sends SIGKILL, SIGTERM and SIGSTOP only, so these are never an injected fault.
_NATIVE_CRASH = re.compile(r"Signal \d+ \((SIGSEGV|SIGABRT|SIGBUS|SIGILL|SIGFPE)\)|Fatal Python error")


def native_crash(log: Path) -> str | None:
    """What a launch's log says a rank died of, if it crashed natively (torch, gloo, the C++ runtime):
    on a loaded 2-core machine gloo now and then aborts a worker at exit ("terminate called without
    an active exception"), about once in a few hundred launches."""
    return native_crash_in(log.read_text(errors="replace")) if log.exists() else None


def native_crash_in(text: str) -> str | None:
    """``native_crash`` of a launch log's text."""
    found = _NATIVE_CRASH.findall(text)
    return next((f"{sig} in a rank" for sig in found if sig), "Fatal Python error" if found else None)


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

    def processes(self) -> list[psutil.Process]:
        """Every live process of this launch: its launcher and its workers, wherever they are now."""
        return job_processes(self.marker)

    def workers(self) -> list[psutil.Process]:
        return [p for p in self.processes() if p.pid != self.popen.pid]

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


def chosen_launcher(max_restarts: int = 0, rendezvous: str | None = None, launcher: str | None = None) -> str:
    """``torchrun`` where the launch tests torchrun's own behaviour or the user asks for it, else ``agent``."""
    if max_restarts > 0 or rendezvous is not None:
        return "torchrun"
    chosen = launcher or os.environ.get(ENV_LAUNCHER) or "agent"
    if chosen not in LAUNCHERS:
        raise ValueError(f"{ENV_LAUNCHER}={chosen!r}: use one of {', '.join(LAUNCHERS)}")
    return chosen


def torchrun_log_dir(run_dir: Path) -> str:
    """torchrun's ``--log-dir`` for a run: without one it makes a ``/tmp/torchelastic_*`` folder per
    launch and never removes it, thousands a night; under the run directory it goes with the run."""
    return f"--log-dir={Path(run_dir).resolve() / 'torchelastic'}"


def _base_env(module: str) -> dict[str, str]:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": worker_pythonpath(module)}
    full_env.pop(ENV_CONTROLLER, None)
    full_env.pop(JOB_MARKER, None)
    return full_env


def launch(run_dir: Path, nproc: int, trainer_args: list[str], *, module: str = "reference_trainer",
           controller: str | None = None, max_restarts: int = 0, env: dict[str, str] | None = None,
           log_name: str = TORCHRUN_LOG, rendezvous: str | None = None, rdzv_id: str = "none",
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
           f"--max-restarts={max_restarts}", torchrun_log_dir(run_dir), "-m", module, *trainer_args]
    return _start(cmd, run_dir, full_env, marker, log_name)


def _start(cmd: list[str], run_dir: Path, env: dict[str, str], marker: str, log_name: str) -> Job:
    log = open(run_dir / log_name, "ab")
    log.write(f"$ {' '.join(cmd)}\n".encode())
    log.flush()
    popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True, preexec_fn=die_with_parent)
    log.close()
    return Job(popen, marker, run_dir / log_name)


def launch_command(run_dir: Path, nproc: int, argv: list[str], *, launcher: str = "torchrun",
                   env: dict[str, str] | None = None, max_restarts: int = 0, log_name: str = TORCHRUN_LOG) -> Job:
    """Start a trainer of its own: ``torchrun`` with ``nproc`` ranks running ``argv`` (a script and its
    arguments, or ``-m MODULE ...``), or ``argv`` itself where the trainer starts its own ranks
    (``launcher="self"``: Lightning, ``accelerate launch``). ``env`` comes on top of the harness's.

    Never the launcher agent: the file-event recorder and faultfs tell a ``[command]`` job's processes
    by ``/proc/PID/environ`` (the run directory, the rank, the controller), which a rank forked from a
    spare does not carry (it shows the spare's environment as it was exec'd)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    marker = uuid.uuid4().hex
    full_env = {**_base_env("ckpt_chaos"), JOB_MARKER: marker, **(env or {})}
    if launcher == "torchrun":
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                f"--max-restarts={max_restarts}", torchrun_log_dir(run_dir), *argv]
    return _start(argv, run_dir, full_env, marker, log_name)


# ---- the agent launcher: spares with torch imported ---------------------------------------------

# Variables read when the interpreter, a preloaded library or torch starts: a spare is started
# with them (LD_PRELOAD and FIU_* for libfiu, COVERAGE_PROCESS_START for coverage.py's .pth). Any other variable (the harness's CKPT_CHAOS_*, the
# remote tier's AWS_*) is read later, by the code that needs it, and is given to a rank after the fork.
EXEC_TIME = ("LD_", "PYTHON", "FIU_", "OMP_", "MKL_", "MALLOC", "GLIBC", "TORCH", "CUDA", "NCCL", "GLOO",
             "COVERAGE_")


def _late(key: str) -> bool:
    return not key.startswith(EXEC_TIME)


READY_TIMEOUT_S = 120.0  # to import torch and the trainer's modules, even on a loaded machine


@dataclass
class _Spare:
    """A warm agent (``ckpt_chaos.env.agent``): forks one agent per launch while it has one thread."""

    popen: subprocess.Popen
    marker: str
    status: int  # read end of its status pipe: {"ready": ...}
    control: socket.socket  # SOCK_SEQPACKET: a launch spec out, the launch's agent pid back
    errors: object  # its stderr: why it died, if it dies importing
    ready: dict | None = None
    job: "AgentJob | None" = None  # the launch it serves; one at a time, since a job is its marker's processes

    def read_ready(self, timeout: float | None) -> dict | None:
        """The spare's ready message, waiting at most ``timeout`` seconds (None: as long as it takes)."""
        if self.ready is None and select.select([self.status], [], [], timeout)[0]:
            line = b""
            while not line.endswith(b"\n"):
                chunk = os.read(self.status, 65536)
                if not chunk:
                    break
                line += chunk
            self.ready = json.loads(line) if line.endswith(b"\n") else {"died": True}
        return self.ready

    def why_dead(self) -> str:
        self.errors.seek(0)
        return self.errors.read().decode(errors="replace")[-3000:]

    def stale(self) -> bool:
        """Dead, or imported a project file that has changed since (its forks would run old code)."""
        if self.popen.poll() is not None:
            return True
        ready = self.read_ready(0)
        if ready is None:
            return False
        if ready.get("died"):
            return True
        for path, mtime in ready.get("sources", {}).items():
            try:
                if os.stat(path).st_mtime != mtime:
                    return True
            except OSError:
                return True
        return False

    def idle(self) -> bool:
        if self.job is None:
            return True
        # A kill still in progress finds the job's processes by the spare's marker, pass after pass:
        # a launch started on this spare meanwhile would be taken for them and killed too.
        if self.job.killing or self.job.processes():
            return False
        self.job = None
        return True

    def close(self) -> None:
        self.control.close()
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()
        if self.status >= 0:
            os.close(self.status)
            self.status = -1
        self.errors.close()


class AgentJob(Job):
    """A launch served by a spare: its agent is a fork of the spare (or the spare itself, where it
    could not fork), so the spare, not the harness, reaps it and reports its exit status."""

    def __init__(self, spare: _Spare, agent_pid: int, status: int, log_path: Path):
        super().__init__(spare.popen, spare.marker, log_path)
        self.agent_pid, self._spare = agent_pid, spare
        self._status, self._buf, self._ranks, self._rc = status, b"", {}, None
        self.killing = False  # kill() is under way (from a nemesis or timer thread, maybe)
        # One kill at a time: a grace timer's kill and the supervisor's overlap when the grace runs out
        # as the launch ends. The second must wait for the first, or it returns (and clears
        # ``killing``) while the first still sweeps the spare's marker, and the next launch forked
        # from the spare meanwhile is killed with this one.
        self._kill_lock = threading.Lock()
        # the supervisor polls the job while a nemesis thread may kill it: the status pipe must not
        # be closed by one between the other's check and its read
        self._lock = threading.RLock()
        os.set_blocking(self._status, False)

    @property
    def _in_spare(self) -> bool:
        return self.agent_pid == self.popen.pid

    def _read(self) -> None:
        with self._lock:
            self._read_locked()

    def _read_locked(self) -> None:
        if self._status < 0:
            return
        eof = False
        try:
            while chunk := os.read(self._status, 65536):
                self._buf += chunk
            eof = True
        except BlockingIOError:
            pass
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            msg = json.loads(line)
            if "ranks" in msg:
                self._ranks = {int(r): pid for r, pid in msg["ranks"].items()}
            if "exit" in msg:
                self._rc = int(msg["exit"])
        if eof:
            os.close(self._status)
            self._status = -1
            if self._rc is None and not self._in_spare:
                self._rc = 1  # the spare died before it could say: the agent was killed with it

    def launcher_pids(self) -> list[int]:
        return [self.agent_pid]

    def poll(self) -> int | None:
        if self._in_spare:
            return self.popen.poll()
        self._read()
        return self._rc

    def wait(self, timeout: float | None = None) -> int | None:
        end = None if timeout is None else time.monotonic() + timeout
        while (rc := self.poll()) is None:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return None
            if self._in_spare:
                try:
                    return self.popen.wait(left)
                except subprocess.TimeoutExpired:
                    return None
            try:
                select.select([self._status] if self._status >= 0 else [], [], [], min(left or 0.1, 0.1))
            except (OSError, ValueError):  # closed meanwhile by a kill in another thread: poll says
                time.sleep(0.01)
        return rc

    def signal(self, sig: signal.Signals) -> None:
        try:
            os.kill(self.agent_pid, sig)
        except ProcessLookupError:
            pass

    def processes(self) -> list[psutil.Process]:
        if self._in_spare:
            return super().processes()
        return [q for q in job_processes(self.marker) if q.pid != self.popen.pid]

    def workers(self) -> list[psutil.Process]:
        return [p for p in self.processes() if p.pid != self.agent_pid]

    def rank_pids(self) -> dict[int, int]:
        self._read()
        return dict(self._ranks)

    def kill(self) -> None:
        """SIGKILL the agent and every rank (not the spare, which serves the next launch)."""
        if self._in_spare:
            super().kill()
            self._spare.close()  # it served this launch itself, and is gone with it
        else:
            with self._kill_lock:
                self.killing = True
                try:
                    for _ in range(3):
                        procs = self.processes()
                        if not procs:
                            break
                        kill_processes(procs)
                        psutil.wait_procs([q for q in procs if q.pid != self.agent_pid], timeout=5)
                    self.wait(5)  # the spare reaps the agent and says how it ended
                finally:
                    self.killing = False
        with self._lock:
            self._read_locked()
            if self._status >= 0:
                os.close(self._status)
                self._status = -1


class _Spares:
    """Warm agents, one per (module, start environment, directory), each serving launch after launch:
    a relaunch, or the next scenario with the same trainer, finds one ready."""

    KEEP = 2  # environments kept warm: the usual one, and one with LD_PRELOAD (libfiu)

    def __init__(self):
        self._warm: dict[tuple, list[_Spare]] = {}
        atexit.register(self.close)

    @staticmethod
    def _key(module: str, env: dict[str, str]) -> tuple:
        return module, os.getcwd(), tuple(sorted(env.items()))

    def _start(self, module: str, env: dict[str, str]) -> _Spare:
        marker = uuid.uuid4().hex
        r, w = os.pipe()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        errors = tempfile.TemporaryFile()
        popen = subprocess.Popen([sys.executable, "-m", "ckpt_chaos.env.agent", module, str(w), str(theirs.fileno())],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors,
                                 env={**env, JOB_MARKER: marker}, pass_fds=(w, theirs.fileno()),
                                 start_new_session=True, preexec_fn=die_with_parent)
        os.close(w)
        theirs.close()
        return _Spare(popen, marker, r, ours, errors)

    def _usable(self, key: tuple) -> list[_Spare]:
        spares = self._warm.get(key, [])
        for spare in [sp for sp in spares if sp.stale()]:
            spares.remove(spare)
            spare.close()
        return spares

    def take(self, module: str, env: dict[str, str]) -> _Spare:
        key = self._key(module, env)
        spares = self._usable(key)
        spare = next((sp for sp in spares if sp.idle()), None)
        if spare is None:
            spare = self._start(module, env)
            spares.append(spare)
        self._warm[key] = self._warm.pop(key, spares)  # most recently used last
        while len(self._warm) > self.KEEP:  # the least recently used environments go cold
            for old in self._warm.pop(next(iter(self._warm))):
                old.close()
        return spare

    def used_up(self, spare: _Spare, module: str, env: dict[str, str]) -> None:
        """``spare`` served its launch itself (it could not fork): start the next one in its place."""
        key = self._key(module, env)
        spares = self._warm.setdefault(key, [])
        if spare in spares:
            spares.remove(spare)
        spares.append(self._start(module, env))

    def prewarm(self, module: str, env: dict[str, str], wait: bool) -> None:
        key = self._key(module, env)
        spares = self._usable(key)
        if not spares:
            spares.append(self._start(module, env))
            self._warm[key] = spares
        if wait:
            ready = spares[0].read_ready(READY_TIMEOUT_S)
            if ready is None:
                raise RuntimeError(f"the launcher agent for {module} was not ready after {READY_TIMEOUT_S:g} s")
            if ready.get("died"):
                raise RuntimeError(f"the launcher agent for {module} died while importing:\n{spares[0].why_dead()}")

    def close(self) -> None:
        while self._warm:
            for spare in self._warm.popitem()[1]:
                spare.close()


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
    pool, start_env = _spares_pool(), _start_env(module, extra)
    spare = pool.take(module, start_env)
    # Wait for the spare's ready message before the launch: the spare may not answer a launch while
    # the harness leaves that message unread in the pipe.
    ready = spare.read_ready(READY_TIMEOUT_S)
    if ready is None or ready.get("died"):
        pool.used_up(spare, module, start_env)
        spare.close()
        raise RuntimeError(f"the launcher agent for {module} " + (f"was not ready after {READY_TIMEOUT_S:g} s"
                           if ready is None else f"died while importing:\n{spare.why_dead()}"))
    log_path = run_dir / log_name
    spec = {"nproc": nproc, "module": module, "argv": trainer_args, "log": str(log_path), "run_id": rdzv_id,
            "env": {k: v for k, v in extra.items() if _late(k)}}
    with open(log_path, "ab") as log:
        log.write(f"$ [ckpt-chaos agent of spare {spare.popen.pid}] python -m {module} {' '.join(trainer_args)} "
                  f"(x{nproc})\n".encode())
    r, w = os.pipe()
    try:
        socket.send_fds(spare.control, [json.dumps(spec).encode()], [w])
        reply = spare.control.recv(4096)  # once the spare is warm, and has forked the launch's agent
    except OSError:
        reply = b""
    finally:
        os.close(w)
    if not reply:
        os.close(r)
        pool.used_up(spare, module, start_env)
        why = f"died before its launch (exit {spare.popen.wait()}):\n{spare.why_dead()}"
        spare.close()
        raise RuntimeError(f"the launcher agent for {module} {why}")
    agent = int(json.loads(reply)["agent"])
    job = AgentJob(spare, agent, r, log_path)
    if agent == spare.popen.pid:
        pool.used_up(spare, module, start_env)
    else:
        spare.job = job
    return job


def run_to_end(run_dir: Path, nproc: int, trainer_args: list[str], timeout: float = 300, **kwargs) -> int:
    """Launch, wait at most ``timeout`` seconds, always clean up; the exit status (or -9 on timeout)."""
    job = launch(run_dir, nproc, trainer_args, **kwargs)
    try:
        rc = job.wait(timeout)
        return -9 if rc is None else rc
    finally:
        job.kill()
