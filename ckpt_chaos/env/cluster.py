"""Several hosts for one job: nodes as Docker containers, or as plain network namespaces.

A node runs one ``torchrun`` agent; the agents meet through torchrun's c10d rendezvous, hosted
by node 0, exactly as on a cluster. Each node has its own address on a private network, its own
local disk (``/local``, the ranks' TMPDIR) and sees the run directory as the shared durable
directory that holds the checkpoints.

* ``docker``: one container per node and launch on an ``internal`` Docker network (no route out).
  No image registry is needed: the image is built locally, ``docker import`` of a
  skeleton tarball (empty directories and the usual ``/lib -> usr/lib`` links), and the host's
  ``/usr``, Python installation, virtual environment, the folders the harness imports from and
  the project directory (the current one) bind-mounted read-only (``code_mounts``). A
  node's local disk is a Docker volume, kept across launches until the node is replaced.
* ``netns``: for machines where no engine runs. Each node is a network namespace with a veth
  pair to a bridge in a "switch" namespace of its own; nothing touches the host's interfaces,
  and every address lives inside namespaces the harness made. Local disks are directories.

The harness acts as the cluster's orchestrator: when a node's agent fails, the job has failed;
the other agents get ``teardown_s`` to notice on their own (that is the time to detect the
scenario measures), then whatever still runs is killed. Every object carries the harness's pid
in its name or labels, so ``remove_leftovers`` clears what a SIGKILLed harness left behind,
never a live run's.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from filelock import FileLock

from ckpt_chaos.config import cache_dir
from ckpt_chaos.env.launcher import JOB_MARKER, job_processes, poll_until, torchrun_log_dir, worker_pythonpath
from ckpt_chaos.env.lifetime import die_with_parent
from ckpt_chaos.extras import missing_extra
from ckpt_chaos.probe import ENV_CONTROLLER

STORE_PORT = 29400  # the c10d rendezvous store on node 0 (also the workers' store)
LABEL = "ckpt-chaos.owner"  # docker label: pid of the harness that made the object
NODE_ENV = "CKPT_CHAOS_NODE"
IMAGE_REPO = "ckpt-chaos-node"
SUBNET = "10.77.0"  # netns backend: node i is SUBNET.(i+1); every namespace is the run's own
LOCK = Path("/tmp/ckpt-chaos-engine.lock")
FW_TABLE = "ckpt_chaos"  # the nftables table partitions add inside a node's namespace


# ---- what a backend needs ------------------------------------------------------------------------

def _docker_client():
    import docker

    return docker.from_env(timeout=60)


def ensure_engine(log_dir: Path | None = None) -> str | None:
    """Make sure a Docker engine answers, starting ``dockerd`` if none runs; None, or why not.

    ``make setup`` installs docker.io; the engine is started here, on first use, so that CI (whose
    machine starts with no daemon) needs nothing else. Its log goes to ``log_dir`` (the cache)."""
    why = missing_extra("cluster")
    if why:
        return why
    log_dir = log_dir or cache_dir()
    with FileLock(str(LOCK)):
        try:
            _docker_client().ping()
            return None
        except Exception:
            pass
        dockerd = next((p for p in ("/usr/sbin/dockerd", "/usr/bin/dockerd") if os.access(p, os.X_OK)), None)
        if dockerd is None:
            return "no Docker engine runs and dockerd is not installed (make setup installs docker.io)"
        if os.geteuid() != 0:
            return "no Docker engine runs and starting dockerd needs root"
        log_dir.mkdir(parents=True, exist_ok=True)
        # A system daemon that outlives this process: started through a shell that exits at once, so that
        # dockerd is not our child (nothing of ours reaps it, and "no child left behind" stays true).
        subprocess.run(["/bin/sh", "-c", '"$0" >>"$1" 2>&1 </dev/null &', dockerd, str(log_dir / "dockerd.log")],
                       start_new_session=True, check=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.5)
            try:
                _docker_client().ping()
                return None
            except Exception:
                continue
        return f"dockerd did not answer within 60 s (see {log_dir / 'dockerd.log'})"


def missing(backend: str) -> str | None:
    """Why this machine cannot run the backend (None: it can)."""
    if backend == "local":
        return None
    if backend == "docker" and (why := missing_extra("cluster")):
        return why
    if os.geteuid() != 0:
        return f"the {backend} backend needs root (network namespaces, nftables)"
    for tool in ("nft", "nsenter", "ip"):
        if not any(os.access(f"{d}/{tool}", os.X_OK) for d in ("/usr/sbin", "/usr/bin", "/sbin", "/bin")):
            return f"{tool} is not installed (make setup installs nftables, iproute2, util-linux)"
    if backend == "docker":
        return ensure_engine()
    return None


def code_mounts(pythonpath: str) -> list[Path]:
    """What a node container must see read-only to run the job as the host would: ``/usr``, the
    Python installation and virtual environment, every folder the harness imports from (site-packages,
    source trees, ``.pth`` additions), the workers' PYTHONPATH and the project directory (the current
    one, where the workers run). Folders inside another are left out: the outer mount shows them."""
    wanted = ["/usr", sys.base_prefix, sys.prefix, os.getcwd(), *sys.path, *pythonpath.split(os.pathsep)]
    found: list[Path] = []
    for entry in wanted:
        if not entry or not os.path.isdir(entry):
            continue
        path = Path(entry).resolve()
        if path != Path("/") and path not in found:
            found.append(path)
    return sorted(p for p in found if not any(p != q and p.is_relative_to(q) for q in found))


def _skeleton() -> bytes:
    """The image's whole content: directories and merged-/usr links; everything else is mounted."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("etc", "tmp", "proc", "sys", "dev", "root", "run", "var", "var/tmp", "local", "work"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d in ("tmp", "var/tmp") else 0o755
            tar.addfile(info)
        for link in ("lib", "lib64", "bin", "sbin"):
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, f"usr/{link}"
            tar.addfile(info)
        for name, text in (("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"), ("etc/group", "root:x:0:\n")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def node_image(client) -> str:
    """The local node image (built once by ``docker import``; its tag is a hash of its content)."""
    import hashlib

    import docker

    data = _skeleton()
    tag = f"{IMAGE_REPO}:{hashlib.sha256(data).hexdigest()[:12]}"
    with FileLock(str(LOCK)):
        try:
            client.images.get(tag)
        except docker.errors.ImageNotFound:
            client.api.import_image_from_data(data, repository=IMAGE_REPO, tag=tag.split(":")[1])
    return tag


def _run(cmd: list[str], stdin: str | None = None) -> None:
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")


# ---- one launch across the nodes -----------------------------------------------------------------

@dataclass
class Agent:
    """One node's torchrun agent in one launch."""

    node: int
    pid: int  # host pid of the agent (the container's init process, or the Popen child)
    popen: subprocess.Popen | None = None  # netns
    container: object | None = None  # docker
    rc: int | None = None

    def poll(self) -> int | None:
        if self.rc is not None:
            return self.rc
        if self.popen is not None:
            self.rc = self.popen.poll()
        else:
            try:  # a cheap look first; the engine is asked only once the process is gone
                alive = psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                alive = False
            if not alive:
                self.container.reload()
                if self.container.status not in ("running", "paused"):
                    self.rc = self.container.attrs["State"]["ExitCode"]
        return self.rc


@dataclass
class ClusterJob:
    """A launch of the job on several nodes; the same interface as ``launcher.Job``."""

    cluster: "Cluster"
    agents: list[Agent]
    marker: str
    log_path: Path
    teardown_s: float
    elastic: bool = False  # torchrun --nnodes=MIN:MAX: a lost node is expected, the rest carry on
    max_restarts: int = 0  # torchrun's --max-restarts: with none, a failed node's peers can only exit
    started: float = field(default_factory=time.monotonic)
    first_failure: float | None = None
    torn_down: list[int] = field(default_factory=list)  # nodes the orchestrator killed after teardown_s
    torn_down_after_s: float = 0.0  # how long after the first failure (at once when only frozen nodes are left)
    _pid_cache: dict[tuple[int, int], int] = field(default_factory=dict)

    def launcher_pids(self) -> list[int]:
        return [a.pid for a in self.agents]

    def node_of(self, rank: int) -> int:
        return rank // self.cluster.ranks_per_node

    def poll(self) -> int | None:
        codes = [a.poll() for a in self.agents]
        if self.elastic:  # the job's outcome is that of the nodes still in it, once they are done
            kept = [c for a, c in zip(self.agents, codes) if a.node not in self.cluster.killed]
            return None if None in kept else max(kept, key=abs, default=0)
        failed = [c for c in codes if c not in (None, 0)]
        if None not in codes:
            return failed[0] if failed else 0
        if failed:
            now = time.monotonic()
            self.first_failure = self.first_failure or now
            # A frozen node (docker pause) cannot notice anything: waiting for it changes nothing but
            # the clock, as with a stopped rank (ProcessNemesis.reap_stopped).
            frozen = all(a.node in self.cluster.paused for a, c in zip(self.agents, codes) if c is None)
            # Without restarts, an agent whose job has no rank left has nothing to run: it only waits
            # on a store it may not reach (an isolated node) until its own timeout.
            idle = self.max_restarts == 0 and not self.workers()
            if frozen or idle or now - self.first_failure > self.teardown_s:
                self.torn_down = [a.node for a in self.agents if a.rc is None]
                self.torn_down_after_s = now - self.first_failure
                self.kill()
                return failed[0]
        return None

    def wait(self, timeout: float | None = None) -> int | None:
        return poll_until(self.poll, timeout, 0.05)

    def signal(self, sig: signal.Signals) -> None:
        """A preemption notice reaches every node's agent."""
        for a in self.agents:
            try:
                os.kill(a.pid, sig)
            except ProcessLookupError:
                pass

    def workers(self) -> list[psutil.Process]:
        agents = set(self.launcher_pids())
        return [p for p in job_processes(self.marker) if p.pid not in agents]

    def host_pid(self, rank: int, pid: int) -> int:
        """The host pid of a rank that reported ``pid`` from inside its node's pid namespace."""
        if self.cluster.backend != "docker":
            return pid
        key = (rank, pid)
        if key not in self._pid_cache:
            node = str(self.node_of(rank))
            for p in job_processes(self.marker):
                try:
                    if p.environ().get(NODE_ENV) != node:
                        continue
                    nspid = [ln for ln in open(f"/proc/{p.pid}/status") if ln.startswith("NSpid:")][0].split()
                except (OSError, IndexError, psutil.Error):
                    continue
                if int(nspid[-1]) == pid:
                    self._pid_cache[key] = p.pid
                    break
        return self._pid_cache.get(key, pid)

    def kill(self) -> None:
        """SIGKILL every node's agent and workers, and keep their logs."""
        self.cluster.kill_nodes([a.node for a in self.agents if a.rc is None], self, lost=False)
        for a in self.agents:
            if a.popen is not None:
                try:
                    a.popen.wait(10)
                except subprocess.TimeoutExpired:
                    pass
            a.poll()
        for p in job_processes(self.marker):  # nothing of the job may outlive it
            try:
                p.kill()
            except psutil.Error:
                pass
        self.cluster.collect_logs(self)


# ---- the cluster: nodes, their network and disks, for one scenario run ---------------------------

class Cluster:
    """The nodes of one chaos run. Use as a context manager: ``close`` removes everything."""

    def __init__(self, run_dir: Path, backend: str, ranks_per_node: int, max_nodes: int, timeout_s: float):
        self.run_dir = Path(run_dir)
        self.backend = backend
        self.ranks_per_node = ranks_per_node
        self.max_nodes = max_nodes
        # the job's configured timeout bounds the launcher's store operations too; an agent still running
        # this long after another node failed is torn down by the orchestrator
        self.timeout_s = timeout_s
        self.teardown_s = timeout_s + 15
        # unique per harness process (each xdist worker is one) and run; the pid lets a later harness
        # tell leftovers of a dead one from a live run's objects
        self.name = f"cc{os.getpid()}x{uuid.uuid4().hex[:6]}"
        self.disk_gen = [0] * max_nodes  # bumped when a node is replaced: a fresh, empty local disk
        self.paused: set[int] = set()
        self.unplugged: set[int] = set()
        self.killed: set[int] = set()  # nodes the nemesis took down in this launch
        self.firewalled: set[int] = set()
        self.job: ClusterJob | None = None
        self.launch_no = 0
        self._containers: dict[int, object] = {}
        self.logs = self.run_dir / "nodes"
        self.logs.mkdir(parents=True, exist_ok=True)
        if backend == "docker":
            self.client = _docker_client()
            self.image = node_image(self.client)
            self.network = self.client.networks.create(self.name, driver="bridge", internal=True,
                                                       labels={LABEL: str(os.getpid())})
        else:
            self._make_namespaces()

    # -- set-up and tear-down

    def _ns(self, node: int | str) -> str:
        return f"{self.name}-{node}"

    def _make_namespaces(self) -> None:
        sw = self._ns("sw")
        _run(["ip", "netns", "add", sw])
        _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", "br0", "up"])
        for i in range(self.max_nodes):
            ns = self._ns(i)
            _run(["ip", "netns", "add", ns])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", sw, "link", "add", f"n{i}", "type", "veth", "peer", "name", "eth0", "netns", ns])
            _run(["ip", "-n", sw, "link", "set", f"n{i}", "master", "br0", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])

    def close(self) -> None:
        if self.job is not None:
            self.job.kill()
        if self.backend == "docker":
            api = self.client.api
            for c in api.containers(all=True, filters={"label": f"{LABEL}={os.getpid()}", "name": self.name}):
                _ignore_not_found(api.remove_container, c["Id"], force=True)
            self.network.remove()
            for v in api.volumes(filters={"label": f"{LABEL}={os.getpid()}"}).get("Volumes") or []:
                if v["Name"].startswith(self.name):
                    _ignore_not_found(api.remove_volume, v["Name"], force=True)
        else:
            for i in list(range(self.max_nodes)) + ["sw"]:
                subprocess.run(["ip", "netns", "del", self._ns(i)], capture_output=True)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- nodes

    def address(self, node: int) -> str:
        if self.backend == "docker":
            c = self._containers.get(node)
            if c is None:
                raise RuntimeError(f"node {node} is not running")
            c.reload()
            nets = c.attrs["NetworkSettings"]["Networks"]
            return nets[self.name]["IPAddress"] if self.name in nets else ""
        return f"{SUBNET}.{node + 1}"

    def netns_path(self, node: int) -> str:
        """The node's network namespace, for ``nsenter --net=`` (firewall rules go there)."""
        if self.backend == "docker":
            return f"/proc/{self.job.agents[node].pid}/ns/net"
        return f"/run/netns/{self._ns(node)}"

    def local_disk(self, node: int) -> str:
        return f"{self.name}-n{node}-disk{self.disk_gen[node]}"

    def launch(self, launch_no: int, world_size: int, module: str, trainer_args: list[str], *,
               controller: str | None, env: dict[str, str], max_restarts: int = 0,
               min_world_size: int | None = None) -> ClusterJob:
        """Start one agent per node. With ``min_world_size`` the job is elastic (torchrun
        ``--nnodes=MIN:MAX``): the agents restart the workers on the nodes that are left."""
        nodes = world_size // self.ranks_per_node
        nnodes = f"{min_world_size // self.ranks_per_node}:{nodes}" if min_world_size else str(nodes)
        marker = uuid.uuid4().hex
        self.launch_no = launch_no
        self.paused.clear()
        agents = []
        pythonpath = worker_pythonpath(module)
        for node in range(nodes):
            node_env = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", JOB_MARKER: marker, NODE_ENV: str(node),
                        "PYTHONPATH": pythonpath, "GLOO_SOCKET_IFNAME": "eth0", "HOME": "/root", **env}
            if controller:
                node_env[ENV_CONTROLLER] = controller
            endpoint = "node0" if self.backend == "docker" else self.address(0)
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
                   f"--nproc-per-node={self.ranks_per_node}", f"--node-rank={node}", "--rdzv-backend=c10d",
                   f"--rdzv-endpoint={endpoint}:{STORE_PORT}", f"--rdzv-id={marker}",
                   f"--rdzv-conf=is_host={str(node == 0).lower()},join_timeout=60,"
                   f"read_timeout={int(self.timeout_s)}",
                   f"--max-restarts={max_restarts}", torchrun_log_dir(self.run_dir), "-m", module, *trainer_args]
            if self.backend == "netns":  # namespaces share the host's name: advertise the node's address
                cmd[3:3] = [f"--local-addr={self.address(node)}"]
            agents.append(self._start(node, launch_no, cmd, node_env, controller))
        if self.backend == "docker":
            for a in agents:
                a.container.start()
                a.container.reload()
                a.pid = a.container.attrs["State"]["Pid"]
        self.killed.clear()
        self.job = ClusterJob(self, agents, marker, self.logs / f"launch{launch_no}-node0.log", self.teardown_s,
                              elastic=min_world_size is not None, max_restarts=max_restarts)
        return self.job

    def _start(self, node: int, launch_no: int, cmd: list[str], env: dict[str, str],
               controller: str | None) -> Agent:
        if self.backend == "netns":
            disk = self.run_dir / "nodes" / self.local_disk(node)
            (disk / "tmp").mkdir(parents=True, exist_ok=True)
            log = open(self.logs / f"launch{launch_no}-node{node}.log", "ab")
            popen = subprocess.Popen(["ip", "netns", "exec", self._ns(node), *cmd], stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=die_with_parent,
                                     env={**os.environ, **env, "TMPDIR": str(disk / "tmp")})
            log.close()
            return Agent(node, popen.pid, popen=popen)
        import docker

        mounts = {str(p): "ro" for p in code_mounts(env.get("PYTHONPATH", ""))}
        mounts[str(self.run_dir.resolve())] = "rw"
        if controller:
            mounts[str(Path(controller).parent)] = "rw"
        volumes = {path: {"bind": path, "mode": mode} for path, mode in mounts.items()}
        disk = self.local_disk(node)
        try:
            self.client.volumes.get(disk)
        except docker.errors.NotFound:
            self.client.volumes.create(disk, labels={LABEL: str(os.getpid())})
        volumes[disk] = {"bind": "/local", "mode": "rw"}
        container = self.client.containers.create(
            self.image, cmd, name=f"{self.name}-l{launch_no}-n{node}", hostname=f"node{node}",
            environment={**env, "TMPDIR": "/local"}, working_dir=os.getcwd(), volumes=volumes,
            labels={LABEL: str(os.getpid())}, network=self.name, detach=True)
        # the alias is what the other nodes resolve: node0 stays "node0" across launches and replacements
        self.network.disconnect(container)
        self.network.connect(container, aliases=[f"node{node}"])
        self._containers[node] = container
        return Agent(node, 0, container=container)

    def kill_nodes(self, nodes: list[int], job: ClusterJob | None = None, *, lost: bool = True) -> None:
        """Node loss: every process of these nodes dies at once (docker kill / SIGKILL in the namespace).

        ``lost``: the nemesis took the nodes down, so an elastic job's outcome is that of the nodes
        left; False for the job's own teardown, whose exit statuses still count."""
        job = job or self.job
        if lost:
            self.killed.update(nodes)
        for node in nodes:
            agent = next((a for a in job.agents if a.node == node), None)
            if agent is None:
                continue
            if agent.container is not None:
                try:
                    if node in self.paused:
                        agent.container.unpause()
                    agent.container.kill()
                except Exception:  # already gone
                    pass
            else:
                for p in self._node_processes(job, node):
                    try:
                        p.send_signal(signal.SIGCONT)
                        p.kill()
                    except psutil.Error:
                        pass
            self.paused.discard(node)

    def _node_processes(self, job: ClusterJob, node: int) -> list[psutil.Process]:
        # The agent is taken by its pid: a process that has just exec'd has closed its close-on-exec
        # fds (so Popen has returned) before the kernel sets up its environment, and for that moment
        # /proc/PID/environ reads empty and the marker scan cannot see it.
        out = []
        agent = next((a for a in job.agents if a.node == node and a.popen is not None), None)
        if agent is not None and agent.rc is None:
            try:
                out.append(psutil.Process(agent.pid))
            except psutil.Error:
                pass
        for p in job_processes(job.marker):
            if p.pid == (agent.pid if agent else None):
                continue
            try:
                if p.environ().get(NODE_ENV) == str(node):
                    out.append(p)
            except psutil.Error:
                pass
        return out

    def pause(self, node: int) -> None:
        """Freeze the node: every process stops where it is, sockets stay open."""
        agent = self.job.agents[node]
        if agent.container is not None:
            agent.container.pause()
        else:
            for p in self._node_processes(self.job, node):
                try:
                    p.suspend()
                except psutil.Error:
                    pass
        self.paused.add(node)

    def replace(self, node: int) -> None:
        """The node is lost for good: kill it now; the next launch runs a fresh node with an empty disk."""
        self.kill_nodes([node])
        self.disk_gen[node] += 1

    def unplug(self, node: int) -> None:
        """Pull the node's network cable: docker network disconnect, or the veth link down."""
        self.unplugged.add(node)
        if self.backend == "docker":
            self.network.disconnect(self._containers[node], force=True)
        else:
            _run(["ip", "-n", self._ns("sw"), "link", "set", f"n{node}", "down"])

    def firewall(self, node: int, ruleset: str) -> None:
        """Load an nftables ruleset inside the node's network namespace."""
        self.firewalled.add(node)
        _run(["nsenter", f"--net={self.netns_path(node)}", "nft", "-f", "-"], stdin=ruleset)

    def heal(self) -> list[str]:
        """Lift every partition: our firewall table deleted, unplugged links back. Only our own table
        goes: Docker keeps rules of its own (the embedded DNS) in a container's namespace."""
        done = []
        for node in sorted(self.unplugged):
            if self.backend == "docker":
                try:
                    self.network.connect(self._containers[node], aliases=[f"node{node}"])
                except Exception:  # the container is gone: its replacement is plugged in at launch
                    pass
            else:
                _run(["ip", "-n", self._ns("sw"), "link", "set", f"n{node}", "up"])
            done.append(f"node{node} plugged in")
        self.unplugged.clear()
        for node in sorted(self.firewalled):
            try:
                _run(["nsenter", f"--net={self.netns_path(node)}", "nft", "delete", "table", "inet", FW_TABLE])
                done.append(f"node{node} firewall removed")
            except (RuntimeError, IndexError):  # the node is gone, and its namespace with it
                pass
        self.firewalled.clear()
        return done

    def collect_logs(self, job: ClusterJob) -> None:
        """Keep each node's output in nodes/launch<N>-node<i>.log, then remove the launch's containers."""
        for a in job.agents:
            if a.container is None:
                continue
            try:
                (self.logs / f"launch{self.launch_no}-node{a.node}.log").write_bytes(a.container.logs())
                a.container.remove(force=True)
            except Exception:
                pass


def _ignore_not_found(call, *args, **kwargs) -> None:
    import docker
    try:
        call(*args, **kwargs)
    except docker.errors.NotFound:
        pass


# ---- leftovers of harnesses that died without cleaning up ----------------------------------------

def _dead(pid: str) -> bool:
    return not pid.isdigit() or not psutil.pid_exists(int(pid))


def leftovers(owner: int | None = None) -> list[str]:
    """Names of our containers, networks, volumes and namespaces (of ``owner``, or of dead harnesses)."""
    def wanted(pid: str) -> bool:
        return str(owner) == pid if owner is not None else _dead(pid)

    found = []
    for name in os.listdir("/run/netns") if os.path.isdir("/run/netns") else []:
        if name.startswith("cc") and "x" in name and wanted(name[2:].split("x")[0]):
            found.append(f"netns {name}")
    try:
        client = _docker_client()
        client.ping()
    except Exception:
        return found
    # The low-level listings return labels in one call; the high-level ``containers.list`` inspects
    # each container afterwards and fails with NotFound when one is removed in between (as other
    # harnesses on this engine do all the time).
    api = client.api
    listings = (
        ("container", [(c["Names"][0].lstrip("/"), c.get("Labels")) for c in
                       api.containers(all=True, filters={"label": LABEL})]),
        ("network", [(n["Name"], n.get("Labels")) for n in api.networks(filters={"label": LABEL})]),
        ("volume", [(v["Name"], v.get("Labels")) for v in
                    (api.volumes(filters={"label": LABEL}).get("Volumes") or [])]),
    )
    for kind, items in listings:
        for name, labels in items:
            if wanted((labels or {}).get(LABEL, "")):
                found.append(f"{kind} {name}")
    return found


def remove_leftovers() -> list[str]:
    """Remove what dead harnesses left; returns what was removed."""
    gone = leftovers()
    client = None
    for entry in gone:
        kind, name = entry.split(" ", 1)
        if kind == "netns":
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            continue
        client = client or _docker_client()
        try:
            if kind == "container":
                client.containers.get(name).remove(force=True)
            elif kind == "network":
                client.networks.get(name).remove()
            else:
                client.volumes.get(name).remove(force=True)
        except Exception:
            pass
    return gone
