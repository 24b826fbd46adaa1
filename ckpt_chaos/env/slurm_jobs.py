"""A job on a private Slurm cluster (``env/slurm.py``), and each of its runs, with
``launcher.Job``'s interface: Slurm's requeues are its relaunches."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil

from ckpt_chaos.env.launcher import job_processes, poll_until


# scontrol's JobState values after which Slurm does nothing more with a job (unless requeued)
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
            "OUT_OF_MEMORY"}


class Cluster(Protocol):
    """What a job asks of the cluster it runs on: ``env/slurm.py``'s ``SlurmCluster``, which submits
    the jobs, so sits above this module."""

    config: Any  # its SlurmConfig: a job gives Slurm its kill_wait_s to end the tasks

    def run(self, tool: str, *args: str, check: bool = True, timeout: float = 30,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess: ...

    def job(self, job_id: int) -> dict[str, str]: ...


@dataclass
class SlurmJob:
    """A job on the cluster, with ``launcher.Job``'s interface; its relaunches are Slurm's requeues."""

    cluster: Cluster
    job_id: int
    marker: str  # in every task's environment (JOB_MARKER): how its processes are found
    log_path: Path
    run_dir: Path
    torn_down: list[int] = field(default_factory=list)
    torn_down_after_s: float = 0.0

    def state(self) -> dict[str, str]:
        return self.cluster.job(self.job_id)

    def poll(self) -> int | None:
        """The exit status once Slurm is done with the job (a failed or cancelled job without one: 1);
        None while it is pending, running, being requeued."""
        info = self.state()
        state = info.get("JobState")
        if state is None:
            return 1  # slurmctld forgot the job: it ended long ago, or the cluster is gone
        if state not in TERMINAL:
            return None
        code = int(info.get("ExitCode", "0:0").split(":")[0] or 0)
        return 0 if state == "COMPLETED" else (code or 1)

    def wait(self, timeout: float | None = None) -> int | None:
        return poll_until(self.poll, timeout, 0.1)

    def restarts(self) -> int:
        """How often Slurm has requeued it (SLURM_RESTART_COUNT of its current run)."""
        return int(self.state().get("Restarts", "0") or 0)

    def attempt_rc(self, attempt: int) -> int | None:
        """The exit status run ``attempt`` of the batch script recorded, if it lived to record it."""
        try:
            return int((self.run_dir / f"slurm-attempt-{attempt}.rc").read_text().strip())
        except (OSError, ValueError):
            return None

    def attempt(self, number: int) -> "SlurmAttempt":
        return SlurmAttempt(self, number)

    def workers(self) -> list[psutil.Process]:
        return job_processes(self.marker)

    def launcher_pids(self) -> list[int]:
        return [p.pid for p in self.workers() if _cmdline(p)[1:3] == ["-m", "torch.distributed.run"]]

    def host_pid(self, rank: int, pid: int) -> int:
        return pid  # one host, one pid namespace

    def signal(self, sig: signal.Signals) -> None:
        """To every task of the job's steps, as ``scancel --signal`` does for a preemption notice."""
        self.cluster.run("scancel", f"--signal={sig.name.removeprefix('SIG')}", str(self.job_id), check=False)

    def kill(self) -> None:
        """Cancel it and wait until none of its processes is left."""
        self.cluster.run("scancel", str(self.job_id), check=False)
        end = time.monotonic() + self.cluster.config.kill_wait_s + 5
        while (self.workers() or self.poll() is None) and time.monotonic() < end:
            time.sleep(0.1)
        for p in self.workers():
            try:
                p.kill()
            except psutil.Error:
                pass


@dataclass
class SlurmAttempt:
    """Run ``number`` of a job (its SLURM_RESTART_COUNT), with ``launcher.Job``'s interface: it
    ends when Slurm is done with it (requeued, or finished) and none of its processes is left."""

    job: SlurmJob
    number: int
    torn_down: list[int] = field(default_factory=list)
    torn_down_after_s: float = 0.0
    slurm_ended: float | None = None  # when Slurm was done with this run (monotonic)
    leftovers_killed: list[int] = field(default_factory=list)  # its processes Slurm's pgid tracking missed
    final: dict[str, str] = field(default_factory=dict)  # scontrol's fields when it ended

    @property
    def log_path(self) -> Path:
        return self.job.log_path

    def state(self) -> dict[str, str]:
        return self.job.state()

    def running(self) -> bool:
        """Slurm runs this very attempt and its torchrun has started."""
        info = self.state()
        return (info.get("JobState") == "RUNNING" and int(info.get("Restarts", "0") or 0) == self.number
                and bool(self.launcher_pids()))

    def requeued_itself(self) -> bool:
        """The batch script of this run requeued the job after a preemption it survived."""
        line = f"job {self.job.job_id} attempt {self.number} requeues itself"
        return self.log_path.exists() and line in self.log_path.read_text(errors="replace")

    def _kill_orphans(self) -> None:
        """Kill the ranks whose torchrun is gone. Slurm's SIGKILL at the end of a grace period (or of
        KillWait) reaches torchrun's process group only: its workers have sessions of their own,
        which proctrack/pgid does not follow, and would go on writing. proctrack/cgroup on a real
        cluster kills them with it."""
        procs = self.workers()
        ours = {p.pid for p in procs}
        for p in procs:
            try:
                if "RANK" in p.environ() and p.ppid() not in ours:  # re-parented: its torchrun is gone
                    p.kill()
                    self.leftovers_killed.append(p.pid)
            except psutil.Error:
                pass

    def poll(self) -> int | None:
        self._kill_orphans()
        if self.slurm_ended is None:
            info = self.state()
            restarts = int(info.get("Restarts", "0") or 0)
            if info and restarts == self.number and info.get("JobState") not in TERMINAL:
                return None
            self.slurm_ended, self.final = time.monotonic(), info
        if self.workers():
            if time.monotonic() - self.slurm_ended < self.job.cluster.config.kill_wait_s + 3:
                return None
            for p in self.workers():  # what outlived Slurm's own kill by more than KillWait
                try:
                    p.kill()
                    self.leftovers_killed.append(p.pid)
                except psutil.Error:
                    pass
            return None
        rc = self.job.attempt_rc(self.number)
        if rc is not None:
            return rc
        # killed before it could say (SIGKILL at the end of a grace period, a lost node)
        code = int(self.final.get("ExitCode", "0:9").split(":")[0] or 0) if self.final else 0
        return code or -signal.SIGKILL

    def wait(self, timeout: float | None = None) -> int | None:
        return poll_until(self.poll, timeout, 0.05)

    def workers(self) -> list[psutil.Process]:
        out = []
        for p in self.job.workers():
            try:
                if p.environ().get("CKPT_CHAOS_ATTEMPT") == str(self.number):
                    out.append(p)
            except psutil.Error:
                pass
        return out

    def launcher_pids(self) -> list[int]:
        return [p.pid for p in self.workers() if _cmdline(p)[1:3] == ["-m", "torch.distributed.run"]]

    def rank_pids(self) -> dict[int, int]:
        return {}

    def host_pid(self, rank: int, pid: int) -> int:
        return pid

    def node_of(self, rank: int) -> int:
        for p in self.workers():
            try:
                env = p.environ()
            except psutil.Error:
                continue
            if env.get("RANK") == str(rank):
                return int(env.get("SLURM_NODEID", "0"))
        raise LookupError(f"rank {rank} of attempt {self.number} is not running")

    def node_name(self, index: int) -> str | None:
        """The Slurm node (n1, ...) that holds the job's node ``index`` (SLURM_NODEID) in this run."""
        for p in self.workers():
            try:
                env = p.environ()
            except psutil.Error:
                continue
            if env.get("SLURM_NODEID") == str(index) and env.get("SLURMD_NODENAME"):
                return env["SLURMD_NODENAME"]
        return None

    def signal(self, sig: signal.Signals) -> None:
        self.job.signal(sig)

    def kill(self) -> None:
        """Nothing: the job lives on into its next run; ``SlurmJob.kill`` ends it."""


def expand_nodes(node_list: str) -> list[str]:
    """Slurm's compact node list (``n[1-2,4]``, ``n1,n3``) as names, as ``scontrol show hostnames``
    would print them, without asking a cluster that may be gone."""
    out = []
    for prefix, ranges, single in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", node_list):
        if single:
            out.append(single)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            out += [f"{prefix}{i:0{len(lo)}d}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []
