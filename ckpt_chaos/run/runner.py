"""Run one scenario: the golden run (cached), the chaos run with its faults and relaunches, the checks.

The chaos run is a loop of launches. Every rank reports to a probe server; the generator decides
on each event whether a fault fires; the nemesis of its kind (``ckpt_chaos/faults/``) acts while
the triggering rank waits. When a launch ends without finishing training, the harness takes a snapshot of the checkpoint
directory (what a resume will find) and relaunches, possibly at another world size, as an
orchestrator would. In ``torchrun`` mode the launcher's own ``--max-restarts`` does that instead.

Nothing outlives a scenario: every process of a launch carries the job marker and is killed on
the way out, whether the scenario passed, failed, hit its deadline or was interrupted.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import statistics
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
from filelock import FileLock

from ckpt_chaos.check.judge import check_run
from ckpt_chaos.run import command
from ckpt_chaos.run.controller import ProbeServer
from ckpt_chaos.run.triggers import HOLD_IDLE_S, Generator, Holds, launch_of
from ckpt_chaos.check.history import (DeadlineHit, Exited, FaultFired, HarnessError, Healed, History, LaunchStarted,
                                     ProbeEvent, RankExited, Reaped, TornDown, final_state, launch_logs, of,
                                     read_history, snapshot_checkpoints, trainer_events)
from ckpt_chaos.config import golden_dir, golden_tree, refuse_golden_elsewhere
from ckpt_chaos.env.launcher import Job, launch, module_path, native_crash, native_crash_in, prewarm, worker_pythonpath
from ckpt_chaos.env import cluster as cluster_module, slurm as slurm_env
from ckpt_chaos.env.cluster import Cluster
from ckpt_chaos.faults import Launch, Nemeses, Setting, requirements
from ckpt_chaos.faults.process import ProcessNemesis
from ckpt_chaos.faults.slurm import SlurmNemesis
from ckpt_chaos.env.objectstore import RemoteTier
from ckpt_chaos.probe import ENV_ATTEMPT, ENV_CONTROLLER
from ckpt_chaos.report import trainer_coverage
from ckpt_chaos.scenario import Scenario
from ckpt_chaos.env.storage import Storage, remove_leftovers
from ckpt_chaos.env.fileevents import FileEvents
from ckpt_chaos.extras import missing_extra
from ckpt_chaos.probe.run_files import EVENTS, GOLDEN, HISTORY, RESULT, SCENARIO, TORCHRUN_LOG

# torchrun's line when it begins to close a worker group (torch/distributed/elastic/multiprocessing/api.py).
CLOSING = re.compile(r"Sending process (\d+) closing signal SIGTERM")


@dataclass
class Result:
    """One row of the results table."""

    scenario: str
    verdict: str  # pass | fail (a check failed) | unknown (one could not tell, none failed) | skipped
    reason: str = ""
    families: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    checks: list[dict] = field(default_factory=list)
    launches: int = 0
    steps_lost: int | None = None
    time_to_detect_s: float | None = None
    time_to_recover_s: float | None = None
    save_s: float | None = None  # median wall time of a checkpoint save in the chaos run
    save_stall_s: float | None = None  # median time training waited for a save (less than save_s when async)
    resumed_from: list[str] = field(default_factory=list)  # per relaunch: the checkpoint it loaded, or "scratch"
    timings_why: dict[str, str] = field(default_factory=dict)  # a timing left empty (None) -> why
    wall_s: float = 0.0
    run_dir: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def trainer_args(cfg: dict) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in cfg.items()]


# ---- golden runs ----------------------------------------------------------------------------

def _code_hash(module: str) -> str:
    """Hash of the trainer's code (its module or package, the reference trainer it may build on, and
    the probe it calls), wherever the workers will import them from, so a code change invalidates
    goldens; from the pinned tree instead when ``config.golden_tree`` names one."""
    h = hashlib.sha256()
    tree = golden_tree()
    where = str(tree) if tree else None
    roots = dict.fromkeys(filter(None, (module_path(m, where)
                                        for m in ("ckpt_chaos.probe", "reference_trainer", module))))
    for root in roots:
        for p in sorted([root] if root.is_file() else root.rglob("*.py")):
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()


# Trainer options that pace a run without touching its numbers: scenarios slow a run down so that a
# fault from outside (a timeout, Slurm's time-limit pass, an upload) lands mid-run, but the golden run
# only supplies the trajectory, so it runs at full speed and is shared with the unpaced scenarios.
PACING = ("step_delay_s",)


def golden_config(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k not in PACING}


def torch_version() -> str | None:
    """torch's version from its metadata (importing torch would cost the harness a second), or None
    where this environment has none (the core installs without it)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def trainer_missing(s: Scenario) -> str | None:
    """Why the scenario's trainer cannot start here (None: it can): a ``[command]`` trainer's modules,
    else the reference trainer's torch, which the core does not install (the ``trainer`` extra)."""
    if s.command is not None:
        return command.missing(s)
    return missing_extra("trainer")


def golden_key(module: str, cfg: dict, world_size: int) -> str:
    cfg = golden_config(cfg)
    blob = json.dumps({"module": module, "cfg": cfg, "world_size": world_size, "code": _code_hash(module),
                       "torch": torch_version(), "python": platform.python_version()},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def golden_run(module: str, cfg: dict, world_size: int, root: Path | None = None,
               timeout: float = 600) -> Path:
    """The fault-free run for this trainer, config and world size; computed once, then reused.

    Parallel workers asking for the same golden run wait on a file lock instead of computing it twice.
    ``root``: the cache (default ``config.golden_dir()``).
    """
    root = Path(root) if root else golden_dir()
    root.mkdir(parents=True, exist_ok=True)
    cfg = golden_config(cfg)
    key = golden_key(module, cfg, world_size)
    final = root / key
    with FileLock(str(root / f"{key}.lock")):
        if final_state(final) is not None:
            return final
        refuse_golden_elsewhere(key, root)
        for attempt in (1, 2):
            work = root / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
            job = launch(work, world_size, trainer_args({**cfg, "run_dir": str(work)}), module=module)
            try:
                rc = job.wait(timeout)
            finally:
                job.kill()
            if rc == 0 and final_state(work) is not None:
                break
            log = (work / TORCHRUN_LOG).read_text()[-3000:] if (work / TORCHRUN_LOG).exists() else ""
            if attempt == 2:
                raise RuntimeError(f"golden run of {module} at world size {world_size} failed twice (exit {rc}):\n{log}")
            # A fault-free run that fails is not what a scenario tests: on a loaded 2-core machine gloo
            # occasionally aborts a worker ("terminate called without an active exception"). Say so and
            # retry once; a trainer that fails deterministically fails again and stops the scenario.
            print(f"ckpt-chaos: WARNING: golden run of {module} at world size {world_size} failed (exit {rc}), "
                  f"retrying once; its log: {work / TORCHRUN_LOG}", file=sys.stderr, flush=True)
        _keep_manifests(work / "checkpoints")  # the records and each file's size are all that is needed
        if final.exists():
            shutil.rmtree(final)
        os.rename(work, final)
        (final / GOLDEN).write_text(json.dumps({"module": module, "cfg": cfg, "world_size": world_size}))
    return final


def _keep_manifests(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True):
        if path.is_file() and path.name != "manifest.json":
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


# ---- the chaos run --------------------------------------------------------------------------

def _environ(pid: int) -> dict[str, str]:
    try:
        return psutil.Process(pid).environ()
    except psutil.Error:
        return {}


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class ChaosRun:
    """The state of one chaos run while it goes: launches, faults fired, snapshots."""

    def __init__(self, scenario: Scenario, run_dir: Path, storage: Storage, cluster: Cluster | None = None,
                 remote: RemoteTier | None = None, planned: Path | None = None):
        self.s = scenario
        self.planned = planned  # a [command] trainer's file sizes in its golden run
        self.remote = remote
        self.roles: dict[str, int] = {}  # job processes that are not ranks: "uploader" -> pid
        self.cluster = cluster
        self.job = None
        self.run_dir = run_dir
        self.storage = storage
        self.ckpt_root = storage.view  # what the harness reads; the trainer writes to run_dir/checkpoints
        self.history = History(run_dir / HISTORY)
        self.generator = Generator(scenario.faults)
        # senders of held triggers wait there (when.after); a held rank's peers wait for it in their next
        # collective, so a hold is let go before the trainer's collective timeout would end the launch
        timeout = scenario.trainer.get("collective_timeout_s") if scenario.command is None else None
        self.holds = Holds(self.generator, self.history,
                           idle_s=min(HOLD_IDLE_S, timeout / 2) if timeout else HOLD_IDLE_S)
        self.lock = threading.Lock()
        self.pids: dict[int, int] = {}
        # (launch, rank) -> pid as each rank reported it, noted before the lock is taken: a fault that
        # holds the lock may be waiting for a target's pid (``_await_pids``)
        self.reported = threading.Condition()
        self.reported_pids: dict[tuple[int, int], int] = {}
        self.launch_no = 0
        self.nemeses = Nemeses(Setting(run_dir, storage, cluster, remote))
        # the supervisor's own business with processes: stopped ranks to reap, a preemption's grace
        self.process: ProcessNemesis = self.nemeses[ProcessNemesis]
        self.errors: list[str] = []
        self.reaped: set[int] = set()  # stopped ranks the harness SIGKILLed as the launcher closed them

    def on_event(self, event: dict) -> dict | None:
        if event["point"] != "fs.created" and event.get("role", "rank") == "rank":
            with self.reported:
                self.reported_pids[(launch_of(event), event["rank"])] = event["pid"]
                self.reported.notify_all()
        self.holds.heard(event)
        with self.lock:
            try:
                answer = self._on_event(event)
            except Exception as e:  # a harness bug must show up in the verdict, not vanish in a thread
                self._harness_error(f"{type(e).__name__}: {e}")
                return None
            if not self.generator.waiting(event):
                return answer
        try:  # outside the lock: the process that reaches the earlier fault's trigger must be heard
            held = self.holds.wait(event, self.lock,
                                   lambda i, fault, held_s: self._fire(i, fault, event, held_s=held_s))
        except Exception as e:
            self._harness_error(f"{type(e).__name__}: {e}")
            return answer
        return held or answer

    def _await_pids(self, ranks: list[int], event: dict, timeout: float) -> None:
        """Called by a nemesis, under ``lock``, while the rank that sent ``event`` waits at its probe
        point: until each of ``ranks`` has reported its pid in the event's launch (or ``timeout``
        passes), then those pids are in ``pids`` as the host sees them."""
        launch_no = launch_of(event)
        if launch_no != self.launch_no or self.job is None:
            return
        with self.reported:
            self.reported.wait_for(lambda: all((launch_no, r) in self.reported_pids for r in ranks), timeout)
            found = {r: self.reported_pids[(launch_no, r)] for r in ranks if (launch_no, r) in self.reported_pids}
        for r, pid in found.items():
            self.pids.setdefault(r, self.job.host_pid(r, pid))

    def _harness_error(self, message: str) -> None:
        self.errors.append(message)
        self.history.add(HarnessError(error=message))

    def _watch_files(self, stop: threading.Event, launch_no: int) -> None:
        """Report each new path under the run directory as an ``fs.created`` event (every ~5 ms).

        This is how trainers that do not call the probe are driven: the fault lands within a few
        milliseconds of the file appearing, not at an exact byte of it."""
        seen: set[str] = set()
        while not stop.wait(0.005):
            found = []
            for dirpath, dirnames, filenames in os.walk(self.run_dir):
                if dirpath == str(self.run_dir) and ".storage" in dirnames:
                    dirnames.remove(".storage")  # the storage stack's own files
                for n in dirnames + filenames:
                    rel = os.path.relpath(os.path.join(dirpath, n), self.run_dir)
                    if rel not in seen:
                        seen.add(rel)
                        found.append(rel)
            for rel in sorted(found):
                self.on_event({"point": "fs.created", "rank": -1, "pid": 0, "attempt": launch_no, "restart": 0,
                               "t": time.time(), "info": {"path": rel}})

    def _on_event(self, event: dict) -> dict | None:
        launch_no = launch_of(event)
        external = event["point"] == "fs.created"
        if not external:  # a rank's own probe event (external ones have no rank)
            if launch_no > self.launch_no:  # torchrun restarted its workers: new processes
                if self.s.recovery.relaunch == "self" and self.job is not None:
                    self._restarted(self.launch_no)
                self.launch_no = launch_no
                self.pids.clear()
            role = event.get("role", "rank")
            if launch_no == self.launch_no and self.job is not None and role != "rank":
                self.roles[role] = self.job.host_pid(event["rank"], event["pid"])
            elif launch_no == self.launch_no and self.job is not None:
                # a rank in a container reports its pid there; signals need the host's
                self.pids[event["rank"]] = self.job.host_pid(event["rank"], event["pid"])
            self.history.add(ProbeEvent(t=event["t"], point=event["point"], rank=event["rank"], pid=event["pid"],
                                        launch=launch_no, info=event.get("info", {}), role=role))
        answer = None
        for index, fault in self.generator.observe(event):
            answer = self._fire(index, fault, event) or answer
        return answer

    def _restarted(self, launch: int) -> None:
        """The trainer restarted its workers (``relaunch = "self"``) after launch ``launch``: what the new
        group finds, recorded as that launch's end, while its first process waits at its first point."""
        s = self.s
        self.history.add(Exited(launch=launch, rc=None, restarted=True, snapshot=snapshot_checkpoints(self.ckpt_root),
                                grace_expired=list(self.process.grace_expired),
                                complete=command.complete(s, self.run_dir), pointer=command.pointer(s, self.run_dir),
                                files=command.listing(s, self.run_dir)))

    def _fire(self, index: int, fault, event: dict, held_s: float | None = None) -> dict | None:
        """Fault ``index`` acts on ``event`` (under ``lock``, its sender waiting at its point); its answer
        to the sender. ``held_s``: how long the trigger was held for the fault it waits for."""
        external = event["point"] == "fs.created"
        # A probe event holds its rank, so a snapshot first costs nothing; an external event holds
        # nobody, and the time a snapshot takes would let the trainer run past the trigger.
        snap = None if external else snapshot_checkpoints(self.ckpt_root, verify_checksums=False)
        fired_at = time.time()
        act, record = self.nemeses.fire(fault, event)
        if held_s is not None:
            record = {**record, "held_s": round(held_s, 3), "after": fault.when.after}
        # what the remote tier holds right after the fault acted
        remote_after = self.remote.snapshot() if self.remote is not None else None
        self.history.add(FaultFired(t=fired_at, index=index, fault=fault.kind, target=fault.target,
                                    launch=launch_of(event), at={"point": event["point"], "rank": event["rank"],
                                                                 "info": event.get("info", {})},
                                    snapshot_before=snap or None, remote_after=remote_after, detail=record))
        self.holds.changed()
        return act

    def run(self) -> None:
        if self.s.cluster.backend == "slurm":
            return self._run_slurm()
        s = self.s
        deadline = time.monotonic() + s.expect.deadline_s
        base_cfg = {**s.trainer, "run_dir": str(self.run_dir)}
        if self.remote is not None:  # not in the golden run: the remote tier does not shape the trajectory
            base_cfg.update(s.remote.trainer_config(self.remote.url, self.remote.endpoint))
        mode = s.recovery.relaunch
        launches = 1 if mode == "none" or s.recovery.in_launch else s.recovery.max_restarts + 1
        # files.jsonl: what each process did to a [command] trainer's files (the reference trainer reports its own)
        with ProbeServer(self.on_event, on_error=self._harness_error) as server, \
                (FileEvents(self.run_dir, command.recorded(s, self.run_dir)) if s.command is not None
                 else contextlib.nullcontext()) as files:
            if s.command is not None:
                command.report_to(self.storage, s, server.address, self.planned)
            for n in range(launches):
                world = s.launch_world_size(n)
                self.launch_no = n
                self.pids.clear()
                env = {ENV_ATTEMPT: str(n), **(self.storage.fiu_env() if self.storage.spec.libfiu else {}),
                       **(self.remote.env if self.remote else {})}
                restarts = s.recovery.max_restarts if mode == "torchrun" else 0
                controller = server.address if s.probe else None
                cfg = {**base_cfg, **(s.recovery.changes[n - 1] if 0 < n <= len(s.recovery.changes) else {})}
                if files is not None:
                    files.launch(n)
                with self.lock:  # events of the new launch must find its job
                    if s.command is not None:
                        job = command.launch(s, self.run_dir, n, world, server.address, planned=self.planned,
                                             env=env, max_restarts=restarts)
                    elif self.cluster:
                        elastic = mode == "torchrun" and s.resumed_world_size() != s.world_size
                        job = self.cluster.launch(n, world, s.trainer_module, trainer_args(cfg),
                                                  controller=controller, env=env, max_restarts=restarts,
                                                  min_world_size=s.resumed_world_size() if elastic else None)
                    else:
                        store = self.remote.store_endpoint if self.remote else ""
                        job = launch(self.run_dir, world, trainer_args(cfg), module=s.trainer_module,
                                     controller=controller, env=env, max_restarts=restarts,
                                     rendezvous=store or None, rdzv_id=f"{self.run_dir.name}-{n}")
                    self.job = job
                    self.roles.clear()
                    self.nemeses.new_launch(Launch(n, job, world, self.pids, self.roles,
                                                    self._await_pids if s.probe else None,
                                                    restarts_itself=s.recovery.relaunch == "self"))
                self.history.add(LaunchStarted(launch=n, world_size=world, pid=job.launcher_pids()[0], mode=mode,
                                               probe=s.probe,
                                               **({"backend": self.cluster.backend, "nodes": len(job.agents),
                                                   "launcher_pids": job.launcher_pids()} if self.cluster else {})))
                stop_watching = threading.Event()
                if any(f.when.point == "fs.created" and f.attempt == n for f in s.faults):
                    threading.Thread(target=self._watch_files, args=(stop_watching, n), daemon=True).start()
                rc = None
                try:
                    rc = self._watch(job, deadline)
                finally:
                    stop_watching.set()
                    job.kill()
                    self.holds.launch_over(n)
                    healed = self.nemeses.heal()
                if files is not None:
                    files.drain()  # everything the launch's processes did is in files.jsonl before its end is
                torn_down = getattr(job, "torn_down", [])
                # nodes still running teardown_s after another failed: the orchestrator killed them
                also = [TornDown(launch=n, nodes=torn_down, after_s=round(job.torn_down_after_s, 2))] if torn_down else []
                # the trainer's own restarts are launches too: the exit is the last one's
                last = self.launch_no if s.recovery.relaunch == "self" else n
                if self._launch_ended(last, rc, healed, also, remote=self.remote.snapshot() if self.remote else None,
                                      complete=command.complete(s, self.run_dir) if s.command else None,
                                      pointer=command.pointer(s, self.run_dir) if s.command else None,
                                      files=command.listing(s, self.run_dir) if s.command else None):
                    break

    def _launch_ended(self, n: int, rc: int | None, healed: dict, also: list, **exit_fields) -> bool:
        """Record launch ``n``'s end (what was healed, ``also``, its exit and what a resume would
        find); whether the run is over: the deadline hit (``rc`` None) or training done."""
        if healed:
            self.history.add(Healed(launch=n, detail=healed))
        for record in also:
            self.history.add(record)
        self.history.add(Exited(launch=n, rc=rc, deadline_hit=rc is None, grace_expired=self.process.grace_expired,
                                snapshot=snapshot_checkpoints(self.ckpt_root), **exit_fields))
        if rc is None:
            self.history.add(DeadlineHit(launch=n, deadline_s=self.s.expect.deadline_s))
            return True
        return rc == 0 and self._finished(n)

    def _run_slurm(self) -> None:
        """The job submitted once; each of its runs under Slurm is a launch. Slurm requeues it after
        a preemption or a lost node; a run that ends without finishing training (a killed rank, a
        signal) is requeued by the harness with ``scontrol requeue``, as an operator would. Either
        way the trainer sees ``SLURM_RESTART_COUNT`` go up, and the history says who requeued it."""
        s, cluster = self.s, self.cluster
        deadline = time.monotonic() + s.expect.deadline_s
        launches = 1 if s.recovery.relaunch == "none" else s.recovery.max_restarts + 1
        cfg = {**s.trainer, "run_dir": str(self.run_dir)}
        requeued_by = None
        with ProbeServer(self.on_event, on_error=self._harness_error) as server:
            env = {"PYTHONPATH": worker_pythonpath(s.trainer_module), **(self.storage.fiu_env() if self.storage.spec.libfiu else {}),
                   **({ENV_CONTROLLER: server.address} if s.probe else {})}
            job = cluster.submit_torchrun(self.run_dir, s.nodes(), s.cluster.ranks_per_node, s.trainer_module,
                                          trainer_args(cfg), env, min_nodes=s.nodes(s.resumed_world_size()),
                                          sbatch_args=tuple(SlurmNemesis.sbatch_args(s)))
            try:
                for n in range(launches):
                    attempt = job.attempt(n)
                    with self.lock:  # events of the new run must find its launch
                        self.launch_no = n
                        self.pids.clear()
                        self.job = attempt
                        self.roles.clear()
                        current = Launch(n, attempt, s.world_size, self.pids, self.roles,
                                         self._await_pids if s.probe else None)
                        self.nemeses.new_launch(current)
                    while not attempt.running() and attempt.poll() is None and time.monotonic() < deadline:
                        time.sleep(0.05)
                    info = attempt.state()
                    if not attempt.launcher_pids():  # Slurm never ran it again: the job is over
                        self._harness_error(f"Slurm did not run job {job.job_id} again for launch {n}: "
                                            f"state {info.get('JobState')}, reason {info.get('Reason')}")
                        break
                    env0 = _environ(attempt.launcher_pids()[0])
                    # the nodes Slurm gave this run (fewer after a node was lost) make the world size
                    world = current.world_size = int(env0.get("SLURM_JOB_NUM_NODES", "1")) * s.cluster.ranks_per_node
                    self.history.add(LaunchStarted(
                        launch=n, world_size=world, pid=attempt.launcher_pids()[0], mode=s.recovery.relaunch,
                        probe=s.probe, backend="slurm", nodes=int(env0.get("SLURM_JOB_NUM_NODES", "0")),
                        launcher_pids=attempt.launcher_pids(),
                        slurm={"job_id": job.job_id, "restart_count": int(env0.get("SLURM_RESTART_COUNT", "0")),
                               "node_list": env0.get("SLURM_JOB_NODELIST"), "requeued_by": requeued_by}))
                    rc = None
                    try:
                        rc = self._watch(attempt, deadline)
                    finally:
                        self.holds.launch_over(n)
                        healed = self.nemeses.heal()
                    also = [Reaped(launch=n, pids=attempt.leftovers_killed,
                                   why="ranks whose torchrun Slurm had killed (they have sessions of their own, "
                                       "which proctrack/pgid misses; proctrack/cgroup kills them with it)")
                            ] if attempt.leftovers_killed else []
                    if self._launch_ended(n, rc, healed, also, slurm={k: attempt.final.get(k) for k in
                                                                      ("JobState", "Reason", "ExitCode", "Restarts")}):
                        break
                    requeued_by = ("job" if attempt.requeued_itself() else
                                   "slurm" if int(attempt.final.get("Restarts", "0") or 0) > n else "harness")
                    if requeued_by == "harness" and n + 1 < launches:
                        cluster.scontrol("requeue", str(job.job_id))
            finally:
                job.kill()

    def _watch(self, job: Job, deadline: float) -> int | None:
        """Wait for the launch to end (None at the deadline), noting when each rank's process dies.

        The first death of a rank the nemesis did not kill is when the job noticed the fault;
        torchrun may take much longer to tear the rest down (it waits for stopped workers)."""
        seen: dict[int, psutil.Process] = {}
        log = getattr(job, "log_path", None)
        offset = log.stat().st_size if log is not None and log.exists() else 0
        while time.monotonic() < deadline:
            rc = job.wait(0.1)
            if log is not None and self.process.stopped:
                offset = self._reap_stopped(log, offset)
            with self.lock:
                if not self.s.probe:  # no events tell us the ranks' pids: the launcher's, or the processes'
                    for rank, pid in job.rank_pids().items():
                        self.pids.setdefault(rank, pid)
                    for proc in job.workers():
                        try:
                            rank = proc.environ().get("RANK")
                        except psutil.Error:
                            continue
                        if rank is not None:
                            self.pids.setdefault(int(rank), proc.pid)
                pids = dict(self.pids)
            gone = []
            for rank, pid in pids.items():
                if pid not in seen:
                    try:
                        seen[pid] = psutil.Process(pid)
                    except psutil.NoSuchProcess:
                        seen[pid] = None
                        gone.append((rank, pid))
                        continue
                proc = seen[pid]
                if proc is not None and not _alive(proc):
                    seen[pid] = None
                    gone.append((rank, pid))
            # Ranks found dead in one look died in an unknown order, except those the harness killed in
            # this look (stopped ranks reaped): they died last, after their peers had noticed.
            for rank, pid in sorted(gone, key=lambda g: g[1] in self.reaped):
                self.history.add(RankExited(launch=self.launch_no, rank=rank, pid=pid))
            if rc is not None:
                return rc
        return None

    def _reap_stopped(self, log: Path, offset: int) -> int:
        """Kill the stopped ranks torchrun has begun to close (``ProcessNemesis.reap_stopped``), reading
        its log's complete lines from ``offset``; returns the offset read up to."""
        with log.open("rb") as fh:
            fh.seek(offset)
            chunk = fh.read()
        end = chunk.rfind(b"\n") + 1
        closing = {int(pid) for pid in CLOSING.findall(chunk[:end].decode(errors="replace"))}
        if closing:
            with self.lock:
                reaped = self.process.reap_stopped(closing)
            if reaped:
                self.reaped.update(reaped)
                self.history.add(Reaped(launch=self.launch_no, pids=reaped,
                                        why="torchrun is closing the stopped worker(s); it would SIGKILL them after 30 s"))
        return offset + end

    def _finished(self, launch: int) -> bool:
        """Launch ``launch`` trained to its last step (a restart inside torchrun counts as the same launch).

        Only with exit status 0 does that end the job: a launch that finished training and then died (its
        node lost while rank 0 drained the uploads) failed, and a scheduler starts it again, as the
        checker's crash states already assume (found by ``ckpt-chaos explore --families remote``).
        A ``[command]`` trainer that exits 0 is done."""
        if self.s.command is not None:
            return True
        return any(e.get("attempt", 0) >= launch for e in trainer_events(self.run_dir, "finished"))


def native_crash_where_no_fault_fired(run_dir: Path) -> str | None:
    """The crash line, if a rank died of a native crash (torch, gloo, the C++ runtime) in a launch in
    which no fault fired: before the first fault, or in a relaunch (gloo's abort at exit, after the
    job trained to its last step). Such a run says nothing about fault handling, and the scenario is
    run once more; a crash that the faults cause comes back on the second run and fails it. Where the
    log cannot be split by launch, only a crash before any fault counts."""
    history = read_history(run_dir)
    fired = {f.launch for f in of(history, FaultFired)}
    if not fired:
        return native_crash(run_dir / TORCHRUN_LOG)
    parts = launch_logs(run_dir, history) or {}
    return next((crash for n, part in parts.items() if n not in fired and (crash := native_crash_in(part))), None)


_SEGFAULT = re.compile(r"Signal 11 \(SIGSEGV\)|Fatal Python error: Segmentation fault")


def segfault_in_a_rank(run_dir: Path) -> str | None:
    """The crash line, if a rank died of SIGSEGV at any time. The nemesis never sends it, and a
    segmentation fault is no job's reaction to a fault: torch 2.13's functional all-gather under gloo
    segfaults now and then (in ``get_optimizer_state_dict(full_state_dict=True)``, seen here about
    once in a few hundred launches, fault or none)."""
    log = run_dir / TORCHRUN_LOG
    return "SIGSEGV in a rank" if log.exists() and _SEGFAULT.search(log.read_text(errors="replace")) else None


def run_scenario(s: Scenario, out_root: Path, golden_root: Path | None = None) -> Result:
    """Run one scenario end to end and return its row; never raises for a failed scenario.

    A failed run whose trainer crashed natively in a launch where no fault fired, or segfaulted at any time
    (about one launch in several hundred here: a SIGSEGV inside torch/gloo), is kept as
    ``NAME.crashed`` and run once more, loudly; the result carries a ``retried_after_native_crash``
    check naming the crash. A second crash fails: a crash the faults cause comes back."""
    result = _run_scenario_once(s, out_root, golden_root)
    failed = result.verdict in ("fail", "unknown") and result.run_dir
    crash = (native_crash_where_no_fault_fired(Path(result.run_dir)) or segfault_in_a_rank(Path(result.run_dir))
             if failed else None)
    if crash is None:
        return result
    kept = Path(result.run_dir).with_name(f"{s.name}.crashed")
    if kept.exists():
        shutil.rmtree(kept)
    Path(result.run_dir).rename(kept)
    print(f"ckpt-chaos: WARNING: {s.name}: the trainer crashed natively ({crash}); "
          f"running the scenario once more; the crashed run: {kept}", file=sys.stderr, flush=True)
    again = _run_scenario_once(s, out_root, golden_root)
    again.checks.insert(0, {"name": "retried_after_native_crash", "check": "retried_after_native_crash",
                            "fault": None, "at": None, "verdict": "pass",
                            "detail": f"the first run crashed natively ({crash}); kept in {kept}"})
    again.wall_s += result.wall_s
    (Path(again.run_dir) / RESULT).write_text(json.dumps(again.to_dict(), indent=1))
    return again


def _run_scenario_once(s: Scenario, out_root: Path, golden_root: Path | None) -> Result:
    started = time.monotonic()
    base = Result(scenario=s.name, verdict="skipped", families=s.families, kinds=s.kinds, tags=s.tags)
    why = requirements(s)
    if why:
        base.reason = f"cannot inject {why}"
        return base
    why = trainer_missing(s)
    if why:
        base.reason = f"cannot train: {why}"
        return base
    if not s.cluster.multi_node and s.recovery.relaunch != "torchrun" and s.command is None:
        with trainer_coverage.measuring(s.name):  # the spare the chaos run takes, not the golden run's
            prewarm(s.trainer_module)  # its torch import overlaps the golden run's lookup and the storage set-up
    run_dir = Path(out_root) / s.name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / SCENARIO).write_text(s.to_toml())
    base.run_dir = str(run_dir)
    if s.command is not None:
        golden = command.golden_run(s, golden_root)
        command.check_triggers(s, golden)
    else:
        golden = golden_run(s.trainer_module, s.trainer, s.world_size, golden_root)
    (run_dir / "golden").symlink_to(golden.resolve())
    spec = s.storage_spec()
    if spec.fs != "host" or spec.faultfs:
        remove_leftovers()  # of harnesses killed before they could clean up
    if s.cluster.backend == "slurm":
        slurm_env.remove_leftovers()
    elif s.cluster.multi_node:
        cluster_module.remove_leftovers()
    with trainer_coverage.measuring(s.name), Storage(run_dir, spec) as storage, \
            _cluster_for(s, run_dir) as cluster, _remote_for(s, run_dir, out_root) as remote:
        chaos = ChaosRun(s, run_dir, storage, cluster, remote,
                         planned=command.plan(s, golden, run_dir) if s.command is not None else None)
        try:
            chaos.run()
        finally:
            chaos.history.close()
    result = evaluate(s, run_dir, golden, harness_errors=chaos.errors)
    result.wall_s = time.monotonic() - started
    (run_dir / RESULT).write_text(json.dumps(result.to_dict(), indent=1))
    return result


def _remote_for(s: Scenario, run_dir: Path, out_root: Path):
    """The scenario's remote tier (S3 endpoint + fault proxy), or a null context without one."""
    import contextlib

    if s.remote is None:
        return contextlib.nullcontext()
    prefix = f"{Path(out_root).name}/{s.name}-{uuid.uuid4().hex[:6]}"  # unique in a shared bucket
    store = any("store_proxy" in f.needs for f in s.faults)
    return RemoteTier(run_dir, prefix, s.remote.proxy, store=store)


def _cluster_for(s: Scenario, run_dir: Path):
    """The scenario's nodes (a context manager), or a null context on the local backend."""
    import contextlib

    if not s.cluster.multi_node:
        return contextlib.nullcontext()
    if s.cluster.backend == "slurm":
        return slurm_env.SlurmCluster(run_dir / "slurm", slurm_env.SlurmConfig(nodes=s.nodes()),
                                      ranks_per_node=s.cluster.ranks_per_node)
    from reference_trainer.config import TrainConfig

    timeout = s.trainer.get("collective_timeout_s", TrainConfig().collective_timeout_s)
    return Cluster(run_dir, s.cluster.backend, s.cluster.ranks_per_node,
                   max(s.nodes(), s.nodes(s.resumed_world_size())), timeout_s=timeout)


def evaluate(s: Scenario, run_dir: Path, golden: Path, harness_errors: list[str] = ()) -> Result:
    """Run the checkers over a stored run (also used by ``ckpt-chaos check`` to re-check later)."""
    report = check_run(s, Path(run_dir), Path(golden), list(harness_errors))
    events = trainer_events(run_dir, "saved")
    saves = [e["total_s"] for e in events if e.get("total_s") is not None]
    stalls = [e["stall_s"] for e in events if e.get("stall_s") is not None]
    for key, measure, found in (("save_s", "total_s", saves), ("save_stall_s", "stall_s", stalls)):
        if not found and getattr(report, key) is None:
            report.timings_why.setdefault(key, f"the trainer reported no save with its {measure} (a saved event in "
                                               f"{EVENTS})")
    # A scenario passes only if every check that applies passed; one that could not tell makes it unknown
    # (it fails a suite as fail does, unless the scenario allows it: expect.may_be_unknown).
    result = Result(scenario=s.name, verdict=report.verdict, reason=report.reason,
                  families=s.families,
                  kinds=s.kinds, tags=s.tags, checks=[asdict(c) for c in report.checks],
                  launches=report.launches, steps_lost=report.steps_lost,
                  time_to_detect_s=report.time_to_detect_s, time_to_recover_s=report.time_to_recover_s,
                  save_s=statistics.median(saves) if saves else report.save_s,
                  save_stall_s=statistics.median(stalls) if stalls else report.save_stall_s,
                  resumed_from=report.resumed_from, timings_why=report.timings_why, run_dir=str(run_dir))
    versions = probe_versions(read_history(run_dir))
    if versions is not None:
        result.checks.append(versions)
    return result


def probe_versions(history: list) -> dict | None:
    """The ``probe_versions`` check of a run whose trainer the automatic probe layer patched: the
    framework releases its processes reported (``probe.armed``), and a warning for each outside the
    releases the layer supports (``ckpt_chaos/probe/versions.py``). A warning does not change the
    verdict; it says why a point may not have fired. None where no process reported a release."""
    found: dict[str, str | None] = {}
    lines: list[str] = []
    for e in of(history, ProbeEvent):
        if e.point == "probe.armed":
            found.update(e.info.get("versions") or {})
            lines += [line for line in e.info.get("unsupported") or () if line not in lines]
    if not found:
        return None
    seen = ", ".join(f"{name} {version}" for name, version in sorted(found.items()))
    return {"name": "probe_versions", "check": "probe_versions", "fault": None, "at": None,
            "verdict": "warn" if lines else "pass",
            "detail": "; ".join(lines) if lines else f"{seen}: releases the probe layer supports"}
