"""Scenarios fanned out over a Slurm cluster (``ckpt-chaos run --executor slurm``), with a local run's verdicts.

Each scenario is one Slurm job whose batch script runs the worker of a parallel run
(``python -m ckpt_chaos.run.parallel``, without ``--parent``: the harness may be on another host, and
it is Slurm that ends a job). The worker calls ``run_scenario`` exactly as a serial run does and writes
the scenario's row into ``OUT/.workers/``; the harness watches the jobs with ``squeue``, reads each row
once its job has ended, and hands the rows over by catalogue index, as ``ParallelRun`` does. The output
directory and the golden-run cache must therefore be on a file system every node shares: the goldens
are computed once, by whichever job asks first, the others waiting on the golden run's FileLock. On the
throwaway cluster every node is this host, so that holds by construction.

One job per scenario rather than one job array: an array's tasks share one resource request, and a
scenario that must run alone asks for more than one that may share. A scenario named twice waits for
its first job (``--dependency=afterany``): both would write the same run directory. The jobs go in
small first (``submission_order``), so that Slurm's FIFO scheduler does not keep the small ones
waiting behind one that needs every node.

Which cluster (``SlurmTarget``): by default a throwaway ``SlurmCluster`` on this host, started before the
first job and stopped after the last; with ``--slurm-conf`` (or ``SLURM_CONF``) an existing cluster, where
the harness only submits, watches and cancels, and never starts or stops a daemon.

What runs beside what (``request``), so that the verdicts are those of a local run:

* on the throwaway cluster every node is a slice of this one machine. A scenario gets as many nodes as
  its ranks need at ``RANKS_PER_CORE`` ranks per core, the cores shared out among the nodes (2 nodes on
  2 cores: a 2-rank scenario takes one node, a 4-rank one both), which is ``run -n``'s rank budget. A
  scenario that must run alone (``alone_because``) holds every node: the cluster allocates whole nodes
  (select/linear), so nothing else of the run can start beside it. ``--exclusive`` would not do here:
  it keeps other jobs off the job's node, but the other nodes are the same machine. A dependency chain
  (the alone job after every earlier one, every later one after it) would say the same thing in more
  jobs' terms and serialise the later ones for no reason; holding every node lets Slurm's FIFO
  scheduler (sched/builtin) start the next jobs the moment it ends;
* on an existing cluster a node is a host of its own: one task with ``--cpus-per-task`` for its ranks at
  ``RANKS_PER_CORE``, and ``--exclusive`` for one that must run alone, which keeps every other job, ours
  or anyone's, off its host.

A job that ends without a row (its node failed, its time limit struck, someone cancelled it) is a failed
row naming the job's state and reason, never a missing one. Jobs are not requeued (``--no-requeue``): a
scenario started again after its node failed would hide that failure. The worker runs with Slurm's own
variables removed (the batch script unsets ``SLURM_*``): a trainer must see the environment a local run
gives it (Lightning, for one, reads ``SLURM_NTASKS`` and would take the job for its own launcher).

Ctrl-C or SIGTERM (``FanOut._stop``): pending jobs are cancelled, each running worker gets SIGTERM
(``scancel --full --signal=TERM``: the batch shell is the worker) and ``STOP_GRACE_S`` to kill its
training job, heal and unmount, as a parallel worker does; then whatever is left is cancelled outright,
and the harness waits until Slurm has ended every job. The throwaway cluster is then stopped (which
SIGKILLs any process still carrying its state directory) and the leftovers of killed workers (mounts,
nodes) are removed; a second Ctrl-C only cuts the grace short.

Scenarios on the ``slurm`` backend (``[cluster] backend = "slurm"``) start a Slurm cluster of their own
(their faults need its daemons: a node set down has its slurmd killed). They are not nested inside a fan-out job: a second set of
daemons inside a job of the throwaway cluster would be a cluster inside a cluster on the same machine,
killed by the outer one's process tracking and competing with its jobs for the cores. They run here, in
the harness, one at a time, after the fan-out's jobs have ended and the throwaway cluster has stopped.
"""

from __future__ import annotations

import json
import math
import shlex
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from ckpt_chaos.env import slurm
from ckpt_chaos.env.slurm import SlurmClient, SlurmCluster, SlurmConfig, SlurmError
from ckpt_chaos.run.parallel import (RANKS_PER_CORE, STOP_GRACE_S, failed_row, last_line, rank_budget,
                                     remove_leftovers, tidy_work_dir, usable_cores, weight, worker_command)

POLL_S = 0.5
# After a job has ended, how long its row may take to show on a shared file system (an NFS client
# caches directory attributes for a few seconds) before the job counts as one that wrote none.
ROW_GRACE_S = 10.0
# After the final scancel, how long Slurm may take to end the jobs (KillWait, the epilogue).
END_WAIT_S = 120.0
SLURM_BACKEND = "slurm"
CLIENT_PACKAGE = "slurm-client (Debian; make setup installs slurm-wlm, which brings it)"


# sbatch options the harness sets on every job and relies on (squeue --name finds the jobs, --output
# holds the worker's log, ...), long and short: --slurm-arg may not set them.
HARNESS_OPTIONS = {"--job-name": "-J", "--output": "-o", "--error": "-e", "--export": None, "--chdir": "-D",
                   "--requeue": None, "--no-requeue": None, "--array": "-a", "--dependency": "-d",
                   "--parsable": None, "--wrap": None, "--open-mode": None}


class FanoutError(RuntimeError):
    """Slurm cannot take the scenarios (no cluster, a job refused); the message says what to do."""


@dataclass
class SlurmTarget:
    """Where ``ckpt-chaos run --executor slurm`` sends its scenarios."""

    # An existing cluster's slurm.conf (--slurm-conf, or SLURM_CONF): the harness only submits, watches
    # and cancels there. None: a throwaway cluster on this host, which the harness starts and stops.
    conf: Path | None = None
    # The throwaway cluster's nodes (--slurm-nodes): one slurmd each, all on this host.
    nodes: int = 2
    # More sbatch arguments for every job (--slurm-arg: partition, account, time limit). They come after
    # the harness's own, so that one of theirs wins where both set the same option.
    sbatch_args: list[str] = field(default_factory=list)
    # The option or variable ``conf`` came from, for messages: "--slurm-conf" or "SLURM_CONF".
    conf_from: str = "--slurm-conf"

    def describe(self) -> str:
        if self.conf is None:
            return f"a throwaway Slurm cluster of {self.nodes} node(s) on this host ({slurm.version()})"
        return f"the Slurm cluster of {self.conf} ({self.conf_from})"


def missing(target: SlurmTarget) -> str | None:
    """Why ``target`` cannot be used from this machine (None: it can). The throwaway cluster needs
    root and the daemons; an existing one only the clients."""
    if target.conf is None:
        return slurm.missing()
    for name in slurm.CLIENTS:
        if slurm._which(name) is None:
            return f"{name} is not installed; install Slurm's clients: {CLIENT_PACKAGE}"
    return None


def harness_option(arg: str) -> str | None:
    """The sbatch option of the harness's own that ``arg`` (one --slurm-arg) would set, if any."""
    for long, short in HARNESS_OPTIONS.items():
        if arg == long or arg.startswith(long + "=") or (short and arg.startswith(short)):
            return long
    return None


def nested(s) -> bool:
    """Whether scenario ``s`` runs a Slurm cluster of its own (it then runs in the harness, see above)."""
    return getattr(s.cluster, "backend", None) == SLURM_BACKEND


def request(s, target: SlurmTarget, cores: int | None = None) -> list[str]:
    """The sbatch resource options of scenario ``s`` on ``target`` (see the module's docstring)."""
    w = weight(s)
    if target.conf is None:
        per_scenario = math.ceil(w.ranks * target.nodes / rank_budget(cores or usable_cores()))
        nodes = target.nodes if w.alone else min(target.nodes, max(1, per_scenario))
        return [f"--nodes={nodes}"]
    opts = ["--nodes=1", "--ntasks=1", f"--cpus-per-task={max(1, math.ceil(w.ranks / RANKS_PER_CORE))}"]
    return opts + (["--exclusive"] if w.alone else [])


def submission_order(s, index: int) -> tuple:
    """Scenarios that share go first, then bigger ones, then those that run alone, each in catalogue order.
    The throwaway cluster's scheduler (sched/builtin) is strictly FIFO: a job waiting for every node holds
    back every job behind it, where ``run -n`` lets later scenarios that fit go first. The rows are put
    back in catalogue order whatever order the jobs ran in."""
    w = weight(s)
    return (w.alone is not None, w.ranks, index)


# ---- the jobs ----------------------------------------------------------------------------------------

@dataclass
class Job:
    """One scenario's Slurm job, as the harness follows it."""

    index: int  # the scenario's place in the catalogue order
    scenario: object
    job_id: int
    row_path: Path  # where its worker writes the row (shared file system)
    log_path: Path  # the job's stdout and stderr (sbatch --output)
    request: list[str]  # its resource options (``request``)
    state: str = "PENDING"  # JobState as squeue last showed it
    started: float | None = None  # time.monotonic() when first seen running; None: never seen running
    info: dict = field(default_factory=dict)  # ``scontrol show job`` once it ended ({}: Slurm forgot it)
    done: bool = False  # its row is collected (or, interrupted, it ended without one)


# The worker's environment is a local run's: Slurm's variables go (see the module's docstring); the
# throwaway cluster's state directory (CKPT_CHAOS_SLURM_STATE) stays, it is how its processes are found.
SCRIPT = """#!/bin/bash
for v in $(compgen -e); do case $v in SLURM_*|SBATCH_*|SRUN_*|SALLOC_*) unset "$v";; esac; done
exec {command}
"""


class FanOut:
    """Submits ``scenarios`` to ``client``'s cluster, one job each, and collects their rows by catalogue
    index (``run``). ``on_start`` is called when a job starts running, ``on_done`` with its row and what
    its worker printed."""

    def __init__(self, scenarios: list, out: Path, golden: Path | None, client: SlurmClient, target: SlurmTarget,
                 indices: list[int] | None = None,
                 on_start: Callable[[int, object], None] = lambda i, s: None,
                 on_done: Callable[[int, object, dict, str], None] = lambda i, s, row, log: None):
        self.scenarios = scenarios
        self.indices = list(range(len(scenarios))) if indices is None else indices
        self.out = Path(out).resolve()
        self.golden = Path(golden).resolve() if golden is not None else None
        self.client, self.target = client, target
        self.on_start, self.on_done = on_start, on_done
        # One name for every job of this run: squeue and scancel select them by it (--name), and a
        # person can cancel them by hand with it if the harness was killed.
        self.name = f"ckpt-chaos-{uuid.uuid4().hex[:12]}"
        self.work = self.out / ".workers"
        self.record = self.out / ".slurm" / "jobs.json"
        self.jobs: dict[int, Job] = {}
        self.rows: dict[int, dict] = {}

    @property
    def active(self) -> list[Job]:
        return [j for j in self.jobs.values() if not j.done]

    def run(self) -> dict[int, dict]:
        self.work.mkdir(parents=True, exist_ok=True)
        try:
            self._submit()
            while self.active:
                self._poll()
                if self.active:
                    time.sleep(POLL_S)
        except BaseException:  # an interrupt, a job refused half-way through, a bug: no job outlives the run
            self._stop()
            raise
        finally:
            self._write_record()
            tidy_work_dir(self.work)
        return self.rows

    # -- submit

    def _submit(self) -> None:
        from ckpt_chaos.env.launcher import harness_pythonpath

        env = {"PYTHONPATH": harness_pythonpath(), "PYTHONUNBUFFERED": "1"}
        last_of: dict[str, int] = {}  # scenario name -> its latest job: one run directory, one job at a time
        for i in sorted(self.indices, key=lambda i: submission_order(self.scenarios[i], i)):
            s = self.scenarios[i]
            cmd, row_path, log_path = worker_command(s, i, self.work, self.out, self.golden)
            opts = request(s, self.target)
            after = [f"--dependency=afterany:{last_of[s.name]}"] if s.name in last_of else []
            try:
                job_id = self.client.sbatch(
                    SCRIPT.format(command=" ".join(map(shlex.quote, cmd))), f"--job-name={self.name}",
                    f"--output={log_path}", "--no-requeue", "--export=ALL", *opts, *after, *self.target.sbatch_args,
                    cwd=Path.cwd(), env=env)
            except SlurmError as e:
                raise FanoutError(f"sbatch refused the job of scenario {s.name}: {e}; check --slurm-arg "
                                  "(partition, account, time limit) against `sinfo`") from None
            last_of[s.name] = job_id
            self.jobs[i] = Job(i, s, job_id, row_path, log_path, opts)

    # -- watch

    def _poll(self) -> None:
        p = self.client.run("squeue", "-h", "-t", "all", f"--name={self.name}", "-o", "%i %T", check=False)
        if p.returncode != 0:
            return  # slurmctld busy or restarting: nothing can be concluded from this poll
        states = dict(line.split(None, 1) for line in p.stdout.splitlines() if line.strip())
        for job in self.active:
            state = states.get(str(job.job_id), "").strip()
            if state:
                job.state = state
            if job.state in ("RUNNING", "COMPLETING") and job.started is None:
                job.started = time.monotonic()
                self.on_start(job.index, job.scenario)
            # COMPLETING: the worker has exited, Slurm is still ending the job's processes; wait for it
            if state in slurm.TERMINAL or not state:
                self._finish(job)

    def _finish(self, job: Job) -> None:
        job.info = self.client.job(job.job_id)
        if job.info.get("JobState") and job.info["JobState"] not in slurm.TERMINAL:
            return  # squeue missed it for a moment
        job.state = job.info.get("JobState", job.state)
        if job.started is None:  # it ran between two polls, or never: the caller still hears of its start first
            self.on_start(job.index, job.scenario)
        row = _read_row(job.row_path, ROW_GRACE_S)
        log = job.log_path.read_text(errors="replace") if job.log_path.exists() else ""
        s, wall = job.scenario, time.monotonic() - job.started if job.started is not None else 0.0
        code = job.info.get("ExitCode", "?")
        if row and "harness_error" not in row:
            job.log_path.unlink(missing_ok=True)
        elif row:  # a harness error (a serial run would stop with its traceback): a failed row, log kept
            row = failed_row(s, self.out, f"harness error in its worker (Slurm job {job.job_id}, exit status "
                                          f"{code}; {job.log_path}): {row['harness_error']}", wall)
            log = ""
        else:
            reason = job.info.get("Reason", "None")
            why = f"{job.state}" + (f" ({reason})" if reason not in ("None", "") else "")
            if not job.info:
                why = f"{job.state}, then Slurm forgot it"
            row = failed_row(s, self.out, f"its Slurm job {job.job_id} ended {why} without a result row (exit "
                                          f"status {code}; {job.log_path}): {last_line(log)}", wall)
            log = ""
        job.row_path.unlink(missing_ok=True)
        job.done = True
        self.rows[job.index] = row
        self.on_done(job.index, s, row, log)

    # -- interrupt

    def _stop(self) -> None:
        """Cancel pending jobs, SIGTERM the running workers and give them ``STOP_GRACE_S``, then cancel
        what is left and wait until Slurm has ended every job; collect the rows of those that finished."""
        run = lambda *a: self._quiet("scancel", *a, f"--name={self.name}")  # noqa: E731
        try:
            run("--state=PENDING")
            run("--state=RUNNING", "--full", "--signal=TERM")
            self._wait_ended(STOP_GRACE_S)
        except KeyboardInterrupt:
            pass  # interrupted again: stop waiting, cancel now
        with signals_ignored():
            run()
            left = self._wait_ended(END_WAIT_S)
            for job in self.active:
                if job.row_path.exists():  # it finished as the interrupt came
                    self._finish(job)
                else:
                    job.done = True
                    job.info = self.client.job(job.job_id)
            if left:
                print(f"ckpt-chaos: Slurm has not ended jobs {left} of {self.name} after {END_WAIT_S:.0f}s; "
                      f"`scancel --name={self.name}` cancels them", file=sys.stderr)

    def _quiet(self, tool: str, *args: str):
        try:
            return self.client.run(tool, *args, check=False, timeout=15)
        except (OSError, SlurmError, subprocess.TimeoutExpired):  # a hung client must not keep the harness
            return None

    def _wait_ended(self, timeout: float) -> list[int]:
        """Wait until squeue shows no job of this run that is not over; the ids of those left."""
        end = time.monotonic() + timeout
        left = [j.job_id for j in self.jobs.values()]
        while time.monotonic() < end:
            p = self._quiet("squeue", "-h", "-t", "all", f"--name={self.name}", "-o", "%i %T")
            if p is not None and p.returncode == 0:
                left = [int(i) for i, st in (line.split(None, 1) for line in p.stdout.splitlines() if line.strip())
                        if st.strip() not in slurm.TERMINAL]
                if not left:
                    return []
            time.sleep(0.2)
        return left

    # -- record

    def _write_record(self) -> None:
        """``OUT/.slurm/jobs.json``: each scenario's job, where and when it ran, how it ended."""
        self.record.parent.mkdir(parents=True, exist_ok=True)
        keep = ("JobState", "Reason", "ExitCode", "NodeList", "NumNodes", "StartTime", "EndTime", "Partition",
                "TimeLimit")
        self.record.write_text(json.dumps({
            "name": self.name, "cluster": self.target.describe(), "sbatch_args": self.target.sbatch_args,
            "jobs": [{"index": j.index, "scenario": j.scenario.name, "job_id": j.job_id, "request": j.request,
                      **{k: j.info[k] for k in keep if k in j.info}} for j in sorted(self.jobs.values(),
                                                                                      key=lambda j: j.index)]},
            indent=1) + "\n")


def _read_row(path: Path, wait: float) -> dict:
    end = time.monotonic() + wait
    while True:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            if time.monotonic() >= end:
                return {}
            time.sleep(0.2)


@contextmanager
def signals_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM ignored: a clean-up that must finish (cancel, stop the daemons) is not cut short."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# ---- the whole run --------------------------------------------------------------------------------

def run(scenarios: list, out: Path, golden: Path | None, target: SlurmTarget,
        on_start: Callable[[int, object], None] = lambda i, s: None,
        on_done: Callable[[int, object, dict, str], None] = lambda i, s, row, log: None) -> None:
    """Every scenario of ``scenarios``: on ``target`` as Slurm jobs, then those on the slurm backend here,
    one at a time. Rows go to ``on_done`` with their catalogue index; KeyboardInterrupt goes on to the
    caller once every job has ended and the throwaway cluster is gone."""
    from ckpt_chaos.report import results
    from ckpt_chaos.run.runner import run_scenario

    # absolute: the jobs run in another working directory (a node's), and slurmctld runs in its state
    # directory, where a relative path to the generated slurm.conf names nothing
    out = Path(out).resolve()
    remote = [i for i, s in enumerate(scenarios) if not nested(s)]
    if remote:
        if target.conf is not None:
            client = SlurmClient({**slurm._clean_env(), "SLURM_CONF": str(Path(target.conf).resolve())})
            p = client.run("sinfo", "-h", "-o", "%P", check=False)
            if p.returncode != 0:
                raise FanoutError(f"cannot reach the Slurm cluster of {target.conf_from} {target.conf}: "
                                  f"{(p.stderr or p.stdout).strip()}; check that its slurmctld runs and that this "
                                  "host can authenticate to it (munge)")
            FanOut(scenarios, out, golden, client, target, remote, on_start, on_done).run()
        else:
            _on_throwaway(scenarios, out, golden, target, remote, on_start, on_done)
    for i, s in enumerate(scenarios):
        if nested(s):
            on_start(i, s)
            on_done(i, s, results.scenario_row(run_scenario(s, out, golden), s), "")


def _on_throwaway(scenarios, out, golden, target, indices, on_start, on_done) -> None:
    # KillWait: SIGTERM to SIGKILL for a cancelled job. The harness gives its workers STOP_GRACE_S itself
    # (a signal first, the cancel after), so the cluster's own may stay short.
    cluster = SlurmCluster(out / ".slurm", SlurmConfig(nodes=target.nodes))
    interrupted = False
    slurm.remove_leftovers()  # clusters of harnesses SIGKILLed before they could stop theirs (never a live one's)
    try:
        try:
            cluster.start()
        except SlurmError as e:
            raise FanoutError(f"cannot start the throwaway Slurm cluster: {e}") from None
        FanOut(scenarios, out, golden, cluster, target, indices, on_start, on_done).run()
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        with signals_ignored():
            try:
                cluster.close()
            finally:
                if interrupted:  # workers SIGKILLed by the teardown had no time to unmount or remove nodes
                    remove_leftovers()
