"""A throwaway Slurm cluster on this one machine, for jobs that a real scheduler requeues.

``SlurmCluster`` starts ``slurmctld`` and one ``slurmd -N nX`` per node as children of the
harness (Debian's build runs several slurmd on one host, each on a port of its own), with a
private configuration, state and ports, and waits until every node is idle. Jobs go in with
``sbatch`` against ``env`` (``SLURM_CONF`` names the generated file); the faults are Slurm's own:
``scontrol requeue``, a node set down, a job cancelled.

Layout: ``ROOT/slurm.conf`` and ``ROOT/log/`` (kept for post-mortem), and the state under a short
directory of its own, ``$TMPDIR/ckpt-chaos-slurm-<pid of the harness>-<random>`` (slurmctld's
state, each slurmd's spool, pid files, a private munged's key and socket where one is needed):
slurmstepd puts Unix sockets in the spool, and a socket's path must fit in 108 bytes, which a
pytest ``tmp_path`` does not promise.

``close`` cancels the jobs, stops the daemons, kills whatever is left (slurmstepd and job
processes leave the daemons' process tree: slurmd double-forks slurmstepd, and each task gets a
process group of its own) and removes the state. The state directory's name carries the
harness's pid, which is how ``remove_leftovers`` finds what a SIGKILLed harness left behind,
without touching a live harness's cluster (``env/slurm_procs.py``). A job submitted here, and each
of its runs, is a ``SlurmJob`` and a ``SlurmAttempt`` (``env/slurm_jobs.py``).
"""

from __future__ import annotations

import glob
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ckpt_chaos.env.launcher import JOB_MARKER, torchrun_log_dir
# what other modules import from here: the jobs and the clean-up live in modules of their own
from ckpt_chaos.env.slurm_jobs import TERMINAL, SlurmAttempt, SlurmJob, expand_nodes  # noqa: F401
from ckpt_chaos.env.slurm_procs import (STATE_ENV, STATE_PREFIX, TMP, foreign_listeners,  # noqa: F401
                                        kill_until_none, leftovers, listening, remove_leftovers, tagged,
                                        wait_ports)
from toxiproxy_server import free_ports

DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin")
# Debian's multiarch directory first; the others are where upstream and RPM builds put plugins.
PLUGIN_DIRS = ("/usr/lib/*/slurm-wlm", "/usr/lib/slurm-wlm", "/usr/lib64/slurm", "/usr/lib/slurm",
               "/usr/local/lib/slurm")
PACKAGES = "slurm-wlm and munge"
URGENT = "urgent"  # the partition whose jobs preempt the others


class SlurmError(RuntimeError):
    """The cluster could not be started or stopped; the message says what to do."""


# ---- what this machine can do -------------------------------------------------------------------

def _which(name: str) -> str | None:
    """sbin is not on every PATH (a non-login root shell, CI): look there too."""
    return shutil.which(name) or next((f"{d}/{name}" for d in SBIN if os.access(f"{d}/{name}", os.X_OK)), None)


def plugin_dir() -> Path | None:
    """Where this Slurm build keeps its plugins (the directory that holds select_linear.so)."""
    for pattern in PLUGIN_DIRS:
        for d in sorted(glob.glob(pattern)):
            if os.path.exists(f"{d}/select_linear.so"):
                return Path(d)
    return None


def auth_method() -> str | None:
    """``none`` where the build has auth/none and cred/none (no daemon to run), ``munge`` where a
    private munged can be started, None where neither works."""
    plugins = plugin_dir()
    if plugins and all((plugins / f"{p}.so").exists() for p in ("auth_none", "cred_none")):
        return "none"
    if plugins and (plugins / "auth_munge.so").exists() and _which("munged"):
        return "munge"
    return None


def version() -> str | None:
    """``slurm-wlm 22.05.8`` or the like; None where Slurm is not installed. Asked of the daemon:
    the clients' --version wants a configuration to read first."""
    path = _which("slurmctld")
    return subprocess.run([path, "-V"], capture_output=True, text=True).stdout.strip() or None if path else None


def missing() -> str | None:
    """Why this machine cannot run a private Slurm cluster (None: it can). Used to skip loudly."""
    if os.geteuid() != 0:
        return "a private Slurm cluster runs slurmd as root (it starts jobs as their user); run as root (CI does)"
    for name in DAEMONS + CLIENTS:
        if _which(name) is None:
            return f"{name} is not installed; install the Debian packages {PACKAGES} (make setup does)"
    if plugin_dir() is None:
        return f"Slurm's plugins (select_linear.so) were not found in {', '.join(PLUGIN_DIRS)}; reinstall {PACKAGES}"
    if auth_method() is None:
        return "this Slurm build has no auth/none plugin and munged is not installed; install munge (make setup does)"
    return None


# ---- configuration ------------------------------------------------------------------------------

@dataclass
class SlurmConfig:
    """What the generated slurm.conf says. The defaults make a requeued job start again within
    seconds; Slurm's own are tuned for clusters where minutes do not matter."""

    # Nodes n1..nN, each one slurmd on its own port of this host.
    nodes: int = 2
    # CPUs each node declares. slurmd sees the whole machine either way; SlurmdParameters=
    # config_overrides makes Slurm believe this, so four nodes fit on two cores.
    cpus_per_node: int = 1
    # "none" (auth/none and cred/none: nothing to run), "munge" (a private munged with its own key
    # and socket), or "auto": none where the build has the plugins, else munge.
    auth: str = "auto"
    # AuthInfo=cred_expire: how long a job credential lives, and so how long slurmctld holds a
    # requeued job back (its old credential must expire on the nodes first). Slurm's default, 120 s,
    # makes every requeue cost two minutes. 5 is the least Slurm takes: below it logs
    # "AuthInfo=cred_expire=N invalid" and goes back to 120 s without a word to the client.
    cred_expire_s: int = 5
    # SchedulerParameters=sched_interval: how often the main scheduling loop looks at pending jobs;
    # a requeued job becomes eligible on a timer, and only this loop notices (default 60 s).
    sched_interval_s: int = 1
    # KillWait: SIGTERM to SIGKILL for a cancelled or requeued job's tasks (default 30 s).
    kill_wait_s: int = 2
    # SlurmdTimeout: how long a silent slurmd stays up in slurmctld's eyes (default 300 s): node
    # loss by a killed slurmd is noticed within this.
    slurmd_timeout_s: int = 10
    # MessageTimeout: one RPC's round trip (default 10 s); everything here is on loopback.
    message_timeout_s: int = 5
    # How long start() waits for every node to be idle before it gives up with the daemons' logs.
    start_timeout_s: float = 60.0
    # ReturnToService: 1, a node that went down because its slurmd stopped answering comes back when
    # the slurmd registers again (a restarted or replaced node), and one set down on purpose (scontrol
    # update state=down) stays down until resumed. With 2 a node set down is back within one ping
    # (about SlurmdTimeout / 3), whatever the fault meant to hold.
    return_to_service: int = 1
    # Partitions: jobs go to "main" (the default); a job in "urgent" (higher PriorityTier, never
    # preempted itself) preempts them with PreemptMode=REQUEUE: SIGTERM to their tasks, GraceTime
    # seconds, SIGKILL, requeue. GraceTime of "main" at start (scontrol update changes it later).
    grace_time_s: int = 0
    # More slurm.conf lines, written after the generated ones (a later line wins in Slurm).
    extra: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.auth not in ("auto", "none", "munge"):
            raise ValueError(f"auth must be auto, none or munge, not {self.auth!r}")
        if self.nodes < 1:
            raise ValueError(f"a cluster needs at least one node, not {self.nodes}")
        if self.cred_expire_s < 5:  # Slurm would run with 120 s instead, and every requeue would wait for it
            raise ValueError(f"cred_expire_s must be at least 5 (Slurm ignores {self.cred_expire_s} and uses 120)")


def _clean_env() -> dict[str, str]:
    """The harness's environment without Slurm's variables: a harness that itself runs inside a
    Slurm job must not hand its job's SLURM_JOB_ID or SLURM_CONF to the private cluster."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}


# ---- the clients, and the cluster ---------------------------------------------------------------

class SlurmClient:
    """Slurm's commands against one cluster: the one ``env``'s ``SLURM_CONF`` names (or the system's
    default). For a cluster someone else runs, the harness only submits and watches through this;
    ``SlurmCluster`` is one that also starts and stops the daemons. ``scripts``: where ``sbatch``
    writes a script given as text (None: a temporary file, removed once submitted; sbatch hands the
    script to slurmctld, so it need not outlive the call)."""

    def __init__(self, env: dict[str, str] | None = None, scripts: Path | None = None):
        self.env = env if env is not None else _clean_env()
        self.scripts = scripts

    def run(self, tool: str, *args: str, check: bool = True, timeout: float = 30,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """One Slurm command against this cluster; with ``check`` a failure raises with its output.
        ``env`` comes on top of the cluster's (``sbatch`` exports it to the job)."""
        path = _which(tool)
        if path is None:
            raise SlurmError(f"{tool} is not installed; install the Debian packages {PACKAGES} (make setup does)")
        p = subprocess.run([path, *args], env={**self.env, **(env or {})}, capture_output=True, text=True,
                           timeout=timeout)
        if check and p.returncode != 0:
            raise SlurmError(f"{tool} {' '.join(args)} failed ({p.returncode}): {(p.stderr or p.stdout).strip()}")
        return p

    def sbatch(self, script: str | Path, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> int:
        """Submit a batch script (its text, or a file) and return the job id; ``env`` goes to the job."""
        if isinstance(script, str):
            fd, name = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=self.scripts)
            with os.fdopen(fd, "w") as f:
                f.write(script)
            path = Path(name)
        else:
            path = Path(script)
        chdir = [f"--chdir={cwd}"] if cwd else []
        try:
            out = self.run("sbatch", "--parsable", *chdir, *args, str(path), env=env).stdout.strip()
        finally:
            if isinstance(script, str) and self.scripts is None:
                path.unlink(missing_ok=True)
        return int(out.split(";")[0])

    def scontrol(self, *args: str) -> str:
        return self.run("scontrol", *args).stdout

    def scancel(self, *args: str) -> str:
        return self.run("scancel", *args).stdout

    def squeue(self, *args: str) -> str:
        return self.run("squeue", *args).stdout

    def node_states(self) -> dict[str, str]:
        """Node -> its state as sinfo prints it (``idle``, ``alloc``, ``down*``, ...); {} while
        slurmctld does not answer."""
        p = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        if p.returncode != 0:
            return {}
        return dict(line.split(None, 1) for line in p.stdout.splitlines() if line.strip())

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Restarts, NodeList, Reason, ...); {} once slurmctld
        has forgotten the job."""
        p = self.run("scontrol", "show", "job", "-o", str(job_id), check=False)
        if p.returncode != 0:
            return {}
        return dict(re.findall(r"(\w[\w:/]*)=(\S*)", p.stdout))

    def jobs(self) -> list[int]:
        """Ids of the jobs slurmctld has not finished with (pending, running, completing)."""
        p = self.run("squeue", "-h", "-o", "%i", check=False)
        return [int(x) for x in p.stdout.split() if x.isdigit()] if p.returncode == 0 else []


class SlurmCluster(SlurmClient):
    """slurmctld and ``config.nodes`` slurmd on this machine. Use as a context manager: ``close``
    removes every process, port and state file it made, whatever happened."""

    backend = "slurm"

    def __init__(self, root: Path, config: SlurmConfig | None = None, ranks_per_node: int = 1):
        self.root = Path(root).resolve()  # slurmctld runs in its state directory: a relative conf is lost
        self.ranks_per_node = ranks_per_node  # of the jobs the harness runs here: rank -> node
        self.config = config or SlurmConfig()
        self.conf = self.root / "slurm.conf"
        self.logs = self.root / "log"
        self.state = Path(TMP) / f"{STATE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        self.nodes = [f"n{i + 1}" for i in range(self.config.nodes)]
        self.auth = self.config.auth if self.config.auth != "auto" else (auth_method() or "none")
        self.ctld_port, *self.node_ports = free_ports(1 + self.config.nodes)
        super().__init__({**_clean_env(), "SLURM_CONF": str(self.conf), STATE_ENV: str(self.state)},
                         scripts=self.state)
        self._daemons: dict[str, subprocess.Popen] = {}  # name (munged, slurmctld, n1, ...) -> process

    @property
    def ports(self) -> list[int]:
        """Every TCP port the configuration names (slurmctld's, then each node's)."""
        return [self.ctld_port, *self.node_ports]

    def __enter__(self) -> "SlurmCluster":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- start

    def slurm_conf(self) -> str:
        c, s, host = self.config, self.state, socket.gethostname().split(".")[0]
        auth_info = [f"cred_expire={c.cred_expire_s}"]
        if self.auth == "munge":
            auth_info.insert(0, f"socket={s / 'munge' / 'munge.socket'}")
        lines = [
            "# generated by ckpt_chaos.env.slurm for one run; removed with it",
            "ClusterName=ckptchaos",
            # slurmctld starts only on a host that SlurmctldHost names; the address keeps it on loopback
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"AuthType=auth/{self.auth}",
            f"CredType=cred/{self.auth}",
            f"AuthInfo={','.join(auth_info)}",
            f"StateSaveLocation={s / 'ctld'}",
            f"SlurmdSpoolDir={s / 'spool' / '%n'}",
            f"SlurmctldPidFile={s / 'slurmctld.pid'}",
            f"SlurmdPidFile={s / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.logs / 'slurmctld.log'}",
            f"SlurmdLogFile={self.logs / 'slurmd-%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # pgid: a requeue or cancel kills the task's whole process group; linuxproc lets a
            # re-parented child escape, cgroup needs a cgroup hierarchy a container may not give
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            # whole nodes: one node is one host of the job, as the harness's node faults assume
            "SelectType=select/linear",
            "SchedulerType=sched/builtin",
            f"SchedulerParameters=batch_sched_delay=0,sched_interval={c.sched_interval_s}",
            f"KillWait={c.kill_wait_s}",
            f"SlurmdTimeout={c.slurmd_timeout_s}",
            f"MessageTimeout={c.message_timeout_s}",
            "InactiveLimit=0",
            "Waittime=0",
            f"ReturnToService={c.return_to_service}",
            "SlurmdParameters=config_overrides",
            "PropagateResourceLimits=NONE",
            "MailProg=/bin/true",
            f"NodeName=DEFAULT CPUs={c.cpus_per_node} State=UNKNOWN",
            *(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p}"
              for n, p in zip(self.nodes, self.node_ports)),
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
            f"PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 "
            f"GraceTime={c.grace_time_s}",
            f"PartitionName={URGENT} Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF",
            *c.extra,
        ]
        return "\n".join(lines) + "\n"

    def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        # munged wants its socket reachable by every user along the whole path (0755); what is secret
        # is its key (0400), and the rest is 0700
        self.state.mkdir(mode=0o755)
        (self.state / "munge").mkdir(mode=0o755)
        for d in ("ctld", "spool"):
            (self.state / d).mkdir(mode=0o700)
        for n in self.nodes:
            (self.state / "spool" / n).mkdir(mode=0o700, exist_ok=True)
        self.conf.write_text(self.slurm_conf())
        if self.auth == "munge":
            self._start_munged()
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-f", str(self.conf)])
        self._wait("slurmctld to answer", lambda: self.run("scontrol", "ping", check=False).returncode == 0)
        for n in self.nodes:
            self._spawn(n, [_which("slurmd"), "-D", "-N", n, "-f", str(self.conf)])
        self._wait(f"all {len(self.nodes)} nodes to be idle", self.all_idle)

    def all_idle(self) -> bool:
        states = self.node_states()
        return sorted(states) == sorted(self.nodes) and set(states.values()) == {"idle"}

    def _start_munged(self) -> None:
        d = self.state / "munge"
        key = d / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)  # munged refuses a key that others can read
        self._spawn("munged", [_which("munged"), "--foreground", f"--key-file={key}", f"--socket={d / 'munge.socket'}",
                               f"--pid-file={d / 'munged.pid'}", f"--seed-file={d / 'munged.seed'}",
                               f"--log-file={self.logs / 'munged.log'}"])
        self._wait("munged's socket", lambda: (d / "munge.socket").exists())

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.logs / f"{name}.out", "ab")
        # A session of its own: a Ctrl-C in the harness's terminal reaches the harness, which tears
        # the cluster down in order, not the daemons directly. The working directory is the state:
        # slurmstepd inherits it from slurmd, and it is how a leftover slurmstepd is recognised.
        self._daemons[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               env=self.env, start_new_session=True, cwd=self.state)
        log.close()

    def _wait(self, what: str, ready, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.config.start_timeout_s)
        while time.monotonic() < deadline:
            dead = {n: p.returncode for n, p in self._daemons.items() if p.poll() is not None}
            if dead:
                raise SlurmError(f"{', '.join(f'{n} exited ({rc})' for n, rc in dead.items())} while waiting for "
                                 f"{what}{self._log_tails()}")
            if ready():
                return
            time.sleep(0.1)
        taken = foreign_listeners(self.ports, {p.pid for p in self._daemons.values()})
        hint = f"; another process listens on {taken}: run again (the ports are drawn anew)" if taken else ""
        raise SlurmError(f"timed out after {timeout or self.config.start_timeout_s:.0f}s waiting for {what}"
                         f"{hint}{self._log_tails()}")

    def _log_tails(self, n: int = 15) -> str:
        out = []
        for path in sorted(self.logs.glob("*")):
            lines = path.read_text(errors="replace").splitlines()[-n:]
            if lines:
                out.append(f"\n--- {path} ---\n" + "\n".join(lines))
        return "".join(out) + f"\n(the logs are in {self.logs})"

    def submit_torchrun(self, run_dir: Path, nodes: int, ranks_per_node: int, module: str, trainer_args: list[str],
                        env: dict[str, str], min_nodes: int | None = None, sbatch_args: tuple[str, ...] = ()
                        ) -> "SlurmJob":
        """Submit a requeueable job of ``nodes`` nodes (or anything from ``min_nodes`` up: a requeued
        job then starts on what is left), one ``srun`` task per node running the trainer under
        torchrun (``ranks_per_node`` ranks, ``--nnodes`` the nodes this run got), the tasks meeting at
        a c10d store on the first node. A requeue runs the same script again: the trainer sees
        ``SLURM_RESTART_COUNT``, which the script also exports as ``CKPT_CHAOS_ATTEMPT`` (the launch
        the harness counts), and each run's exit status goes to ``slurm-attempt-N.rc``."""
        marker = secrets.token_hex(16)
        port = free_ports(1)[0]
        task = " ".join([
            shlex.quote(sys.executable), "-m", "torch.distributed.run", '--nnodes="$SLURM_JOB_NUM_NODES"',
            f"--nproc-per-node={ranks_per_node}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
            '--rdzv-id="$SLURM_JOB_ID-$SLURM_RESTART_COUNT"',
            '--rdzv-conf="is_host=$([ "$SLURM_NODEID" = 0 ] && echo true || echo false),join_timeout=60"',
            shlex.quote(torchrun_log_dir(run_dir)), "-m", shlex.quote(module), *map(shlex.quote, trainer_args)])
        log = Path(run_dir) / "slurm-job.log"
        rc_file = shlex.quote(str(Path(run_dir) / "slurm-attempt-")) + '"$CKPT_CHAOS_ATTEMPT.rc"'
        script = "\n".join([
            "#!/bin/bash",
            "export CKPT_CHAOS_ATTEMPT=${SLURM_RESTART_COUNT:-0}",
            'echo "ckpt-chaos: job $SLURM_JOB_ID attempt $CKPT_CHAOS_ATTEMPT on $SLURM_JOB_NODELIST"',
            # A preemption or requeue signals this script too: it outlives srun (until the SIGKILL at
            # the end of the grace period) so that the run's exit status is kept.
            "told=",
            "trap 'told=1; echo \"ckpt-chaos: the batch script got SIGTERM\"' TERM",
            # no --kill-on-bad-exit: torchrun exits non-zero after a SIGTERM however cleanly its workers
            # stopped, and that must not cut short the other nodes' emergency saves (a node that dies
            # is noticed by its peers' collectives, as without Slurm)
            f"srun --ntasks-per-node=1 bash -c {shlex.quote(task)} &",
            "pid=$!",
            'while :; do wait "$pid"; rc=$?; kill -0 "$pid" 2>/dev/null || break; done',
            f'echo "$rc" > {rc_file}',
            # Preempted (Slurm signals the steps, not this script, and sets PreemptTime) and stopped
            # within the grace period: Slurm would let the job end there, so it requeues itself, as
            # submitit and Lightning's SLURM plugin do. Past the grace period Slurm requeues it
            # (PreemptMode=REQUEUE); after an operator's requeue this one is refused.
            'scontrol show job "$SLURM_JOB_ID" | grep -q "PreemptTime=[0-9]" && told=1',
            'if [ -n "$told" ] && scontrol requeue "$SLURM_JOB_ID" 2>/dev/null; then',
            '  echo "ckpt-chaos: job $SLURM_JOB_ID attempt $CKPT_CHAOS_ATTEMPT requeues itself (exit status $rc)"',
            'fi',
            'exit "$rc"', ""])
        size = f"{min_nodes}-{nodes}" if min_nodes and min_nodes < nodes else str(nodes)
        job_id = self.sbatch(script, f"--nodes={size}", "--ntasks-per-node=1", "--requeue", "--open-mode=append",
                             f"--output={log}", "--export=ALL", *sbatch_args, cwd=Path.cwd(),
                             env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", JOB_MARKER: marker, **env})
        return SlurmJob(self, job_id, marker, log, Path(run_dir))

    def node_processes(self, node: str) -> list[psutil.Process]:
        """The processes of node ``node`` (n1, ...): its slurmd, the step daemons it started and its
        tasks (slurmstepd gives each task ``SLURMD_NODENAME``; its children inherit it)."""
        out = []
        daemon = self._daemons.get(node)
        for p in self.processes():
            try:
                if p.environ().get("SLURMD_NODENAME") == node or (daemon is not None and p.pid == daemon.pid):
                    out.append(p)
                elif p.name() == "slurmstepd" and any(f"/spool/{node}/" in str(c.laddr)
                                                      for c in p.net_connections("unix")):
                    out.append(p)
            except (psutil.Error, OSError):
                pass
        return out

    def kill_node(self, node: str) -> list[int]:
        """A node's hardware lost: SIGKILL its slurmd, step daemons and tasks; the pids killed."""
        procs = _sigkill(self.node_processes(node))
        daemon = self._daemons.get(node)
        if daemon is not None:
            daemon.wait(5)
        return sorted(p.pid for p in procs)

    def kill_nodes(self, nodes: list[int], job: "SlurmAttempt") -> None:
        """The job's nodes ``nodes`` (SLURM_NODEID) lose its processes, torchrun and ranks, at once;
        their slurmd lives on and reports the step's end (``kill_node`` loses the whole node)."""
        _sigkill([p for p in job.workers() if _node_id(p) in nodes])

    def restart_node(self, node: str) -> None:
        """Start a lost node's slurmd again (a repaired node); Slurm takes it back as ReturnToService says."""
        self._spawn(node, [_which("slurmd"), "-D", "-N", node, "-f", str(self.conf)])

    def processes(self) -> list[psutil.Process]:
        """Every live process of this cluster: daemons, step daemons and job tasks."""
        return tagged(lambda state: state == str(self.state))

    # -- teardown

    def close(self) -> None:
        """Cancel the jobs, stop the daemons, kill what is left, remove the state. It tries every
        step and raises at the end with what could not be done."""
        problems = []
        ctld = self._daemons.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            # let slurmctld end the jobs while it can: their steps go through their own epilogue
            # instead of being orphaned by a killed slurmd
            try:
                if self.jobs():
                    self.run("scancel", *map(str, self.jobs()), check=False, timeout=10)
                    end = time.monotonic() + self.config.kill_wait_s + 3
                    while self.jobs() and time.monotonic() < end:
                        time.sleep(0.1)
            except (subprocess.TimeoutExpired, OSError):
                pass
        # nodes first, munged last: a daemon still running needs munged to say goodbye
        order = [n for n in self._daemons if n not in ("slurmctld", "munged")] + ["slurmctld", "munged"]
        for name in order:
            p = self._daemons.get(name)
            if p is not None and p.poll() is None:
                p.terminate()
        for name in order:
            p = self._daemons.get(name)
            if p is None:
                continue
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._daemons.clear()
        left = kill_until_none(self.processes)
        if left:
            problems.append(f"processes that survived SIGKILL: {left}")
        if busy := wait_ports(self.ports):
            problems.append(f"ports {busy} still listening")
        shutil.rmtree(self.state, ignore_errors=True)
        if self.state.exists():
            problems.append(f"cannot remove {self.state}; remove it by hand")
        if problems:
            raise SlurmError("; ".join(problems))


def _sigkill(procs: list[psutil.Process]) -> list[psutil.Process]:
    """SIGKILL ``procs`` at once and wait (5 s at most) until they are gone; returns them."""
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)
    return procs


def _node_id(p: psutil.Process) -> int | None:
    try:
        return int(p.environ().get("SLURM_NODEID", ""))
    except (psutil.Error, ValueError):
        return None
