"""The processes, ports and state directories of the private Slurm clusters (``env/slurm.py``):
finding every process of a cluster, killing them, and removing what killed harnesses left behind.

A cluster's state directory, ``$TMPDIR/ckpt-chaos-slurm-<pid of the harness>-<random>``, names it, and
every process of the cluster can be traced to it: the daemons and the jobs have it in their
environment (a job gets ``sbatch``'s), and slurmstepd, which slurmd starts with an empty environment,
runs in it (slurmd's working directory) and listens on sockets in it. So ``remove_leftovers`` finds
what a SIGKILLed harness left behind, without touching a live harness's cluster.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import tempfile
import time

import psutil

# In the environment of the daemons and of every job: the cluster's state directory, whose name
# carries the pid of the harness that started it (STATE_PREFIX<pid>-<random>).
STATE_ENV = "CKPT_CHAOS_SLURM_STATE"
STATE_PREFIX = "ckpt-chaos-slurm-"
TMP = os.path.realpath(tempfile.gettempdir())  # resolved: a process's cwd is, and is matched against it


def listening(ports) -> list[int]:
    """Those of ``ports`` on which some process listens (TCP, any address)."""
    wanted = set(ports)
    return sorted({c.laddr.port for c in psutil.net_connections("tcp")
                   if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port in wanted})


def wait_ports(ports, timeout: float = 5) -> list[int]:
    """The ports still listening after ``timeout`` (a killed process's sockets close as it is reaped)."""
    end = time.monotonic() + timeout
    while (busy := listening(ports)) and time.monotonic() < end:
        time.sleep(0.1)
    return busy


def foreign_listeners(ports, ours: set[int]) -> list[int]:
    """Those of ``ports`` that a process other than ``ours`` listens on."""
    wanted = set(ports)
    return sorted({c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN
                   and c.laddr and c.laddr.port in wanted and c.pid not in ours})


def _state_dir(path: str) -> str | None:
    """The cluster state directory that ``path`` lies in, if any."""
    m = _STATE.match(path)
    return m.group(0) if m else None


def tagged(wanted) -> list[psutil.Process]:
    """The live processes of the clusters whose state directory ``wanted(state)`` picks: those that
    carry it in their environment (daemons, jobs), those that run in it or hold a socket in it
    (slurmstepd: slurmd starts it with an empty environment, in slurmd's own working directory, and
    it listens in the spool), and all their descendants (a job started with ``--export=NONE``)."""
    found: dict[int, psutil.Process] = {}

    def add(p: psutil.Process) -> None:
        found[p.pid] = p
        try:
            found.update((c.pid, c) for c in p.children(recursive=True))
        except psutil.Error:
            pass

    for p in psutil.process_iter():
        try:
            state = p.environ().get(STATE_ENV) or _state_dir(p.cwd())
        except (psutil.Error, OSError):
            continue
        if state and wanted(state):
            add(p)
    try:
        sockets = psutil.net_connections("unix")
    except (psutil.Error, OSError):
        sockets = []
    for conn in sockets:
        state = _state_dir(conn.laddr) if isinstance(conn.laddr, str) else None
        if state and conn.pid and wanted(state) and conn.pid not in found:
            try:
                add(psutil.Process(conn.pid))
            except psutil.Error:
                pass
    found.pop(os.getpid(), None)
    return [p for p in found.values() if _alive(p)]


def kill_until_none(find) -> list[int]:
    """SIGKILL every process ``find()`` returns, until it returns none (a task may fork while it is
    being killed); the pids still alive at the end."""
    left: list[psutil.Process] = []
    for _ in range(3):
        procs = find()
        if not procs:
            return []
        for p in procs:
            try:
                p.send_signal(signal.SIGKILL)  # stopped processes die of it too
            except psutil.Error:
                pass
        _, left = psutil.wait_procs(procs, timeout=5)
    return [p.pid for p in left if _alive(p)]


def _alive(p: psutil.Process) -> bool:
    """Running and not a zombie: a zombie that init has not reaped yet holds no port or file."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# ---- leftovers of harnesses that were killed ----------------------------------------------------

_STATE = re.compile(rf"{re.escape(os.path.join(TMP, STATE_PREFIX))}(\d+)-[0-9a-f]+(?=/|$)")


def _owner(state: str) -> int:
    return int(_STATE.match(state).group(1))


def _owner_alive(state: str) -> bool:
    owner = _owner(state)
    return owner == os.getpid() or psutil.pid_exists(owner)


def _state_dirs() -> list[str]:
    """Every cluster's state directory on this machine."""
    return sorted(d for d in glob.glob(os.path.join(TMP, f"{STATE_PREFIX}*"))
                  if _STATE.fullmatch(d) and os.path.isdir(d))


def leftovers(owner: int | None = None) -> list[str]:
    """Processes (``process PID NAME``) and state directories (``state DIR``) of clusters whose
    harness no longer runs, or all of those of harness ``owner``."""
    def wanted(state: str) -> bool:
        return _owner(state) == owner if owner is not None else not _owner_alive(state)

    out = []
    for p in sorted(tagged(wanted), key=lambda p: p.pid):
        try:
            out.append(f"process {p.pid} {p.name()}")
        except psutil.Error:
            pass
    return out + [f"state {d}" for d in _state_dirs() if wanted(d)]


def remove_leftovers() -> list[str]:
    """Kill every process of the clusters of harnesses that no longer run, remove their state."""
    gone = leftovers()
    kill_until_none(lambda: tagged(lambda state: not _owner_alive(state)))
    for d in _state_dirs():
        if not _owner_alive(d):
            shutil.rmtree(d, ignore_errors=True)
    return gone
