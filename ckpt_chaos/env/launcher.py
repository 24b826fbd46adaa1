"""Launch a training job under the real elastic launcher, and make sure it is gone afterwards.

torchrun starts each worker in a session of its own, and a worker whose torchrun died keeps
running. So every process of a job carries an environment marker (``CKPT_CHAOS_JOB``) and
``Job.kill`` sends SIGKILL to every process that has it, whoever its parent is now.

Workers run in the harness's current directory (the project under test), with that directory
first on their ``PYTHONPATH``, so that a project's own trainer module is found, then wherever
ckpt-chaos and the trainer are installed (``worker_pythonpath``).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import site
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from importlib.machinery import PathFinder
from pathlib import Path

import psutil

from ckpt_chaos.probe import ENV_CONTROLLER

JOB_MARKER = "CKPT_CHAOS_JOB"


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

    def kill(self) -> None:
        """SIGKILL every process of the job (launcher and workers), then reap torchrun."""
        for _ in range(3):
            procs = job_processes(self.marker)
            if not procs:
                break
            for p in procs:
                try:
                    p.send_signal(signal.SIGCONT)  # a stopped process must not linger after SIGKILL
                    p.kill()
                except psutil.Error:
                    pass
            # torchrun is our child: only Popen may reap it. If psutil reaped it, Popen would later
            # get ECHILD and report exit status 0 for a launcher that was SIGKILLed.
            psutil.wait_procs([p for p in procs if p.pid != self.popen.pid], timeout=5)
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass


def _term_when_parent_dies() -> None:
    """In the child: if the harness dies without cleaning up (SIGKILL, crash), torchrun gets SIGTERM
    and takes its workers down with it (Linux PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass


def launch(run_dir: Path, nproc: int, trainer_args: list[str], *, module: str = "reference_trainer",
           controller: str | None = None, max_restarts: int = 0, env: dict[str, str] | None = None,
           log_name: str = "torchrun.log", rendezvous: str | None = None, rdzv_id: str = "none") -> Job:
    """Start ``torchrun --standalone --nproc_per_node N -m MODULE ARGS`` with its output in run_dir.

    ``rendezvous`` ("host:port"): instead of a store of its own, torchrun joins the c10d store that
    already listens there (the harness's, reached through the fault proxy)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    marker = uuid.uuid4().hex
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", JOB_MARKER: marker,
                "PYTHONPATH": worker_pythonpath(module)}
    full_env.pop(ENV_CONTROLLER, None)
    if controller:
        full_env[ENV_CONTROLLER] = controller
    full_env.update(env or {})
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


def run_to_end(run_dir: Path, nproc: int, trainer_args: list[str], timeout: float = 300, **kwargs) -> int:
    """Launch, wait at most ``timeout`` seconds, always clean up; the exit status (or -9 on timeout)."""
    job = launch(run_dir, nproc, trainer_args, **kwargs)
    try:
        rc = job.wait(timeout)
        return -9 if rc is None else rc
    finally:
        job.kill()
