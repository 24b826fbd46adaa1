"""Scenarios side by side (``ckpt-chaos run -n N``, ``pytest -n N --chaos``) with the verdicts of a serial run.

Each scenario runs in a worker process of its own (``python -m ckpt_chaos.run.parallel``, a fresh
interpreter: the harness has threads and is never forked), which calls ``run_scenario`` exactly as
the serial loop does and writes the scenario's row to a file. The parent decides what runs when,
collects the rows and orders them as the catalogue does, whatever order they finish in.

What runs together is decided by the scenarios, not only by ``-n`` (``weight``):

* a scenario weighs the most ranks it runs at once, and the scenarios running together weigh at
  most ``RANKS_PER_CORE`` ranks per usable core. That is the oversubscription the catalogue's
  4-rank scenarios already run at serially on a 2-core machine, with their 15 s collective timeouts;
* a scenario whose verdict can depend on wall-clock time runs alone (``alone_because``): a kind the
  registry marks ``timed`` (stop, slow, pause, partition, toxic, requeue; term, preempt and
  time_limit when their grace period or warning is under ``faults.AMPLE_S``), a fault triggered from
  outside (``fs.created``: where it lands depends on the harness keeping up), a checked time limit
  (``expect.detect_within_s``, a deadline below the default), a collective timeout below the
  catalogue's 15 s, a wall-clock checkpoint cadence, a remote tier (S3 request timeouts, a drain
  deadline) and Docker or netns nodes (engine-wide set-up, teardown timed by the collective timeout).
  A Slurm scenario may share: its cluster is private, and the kinds whose outcome hangs on Slurm's
  timers (preempt, requeue, time_limit) are ``timed`` where those timers are short.

Nothing a scenario checks is scaled or relaxed: a timeout stretched for load would be another
scenario, and another golden run. Timings in the report (time to detect, to recover) are measured
under the load of the scenarios beside it; compare them between serial runs.

Global resources stay apart because each carries the pid of the process that made it (mount
sources, faultfs daemons, Docker labels, netns names, proxy routes): every worker is a process of
its own, and ``remove_leftovers`` removes only what processes no longer alive left behind.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import traceback
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import psutil

from ckpt_chaos.env.launcher import kill_processes
from ckpt_chaos.env.lifetime import die_with_parent

RANKS_PER_CORE = 2
SCENARIO_MEMORY = 2 << 30  # bytes a 2-rank scenario may take (harness, torchrun, ranks): -n auto's bound
MIN_COLLECTIVE_TIMEOUT_S = 15.0  # the catalogue's; what its scenarios are known to pass at under load
STOP_GRACE_S = 60.0  # after an interrupt, how long workers get to kill their jobs and unmount
RUN_ENV = "CKPT_CHAOS_PARALLEL_RUN"  # every process of a parallel run carries it: the last-resort kill


# ---- what this machine can take ------------------------------------------------------------------

def usable_cores() -> int:
    """CPUs this process may run on: its affinity, bounded by a cgroup v2 CPU quota."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            n = min(n, int(quota) // int(period))
    except (OSError, ValueError):
        pass
    return max(1, n)


def rank_budget(cores: int | None = None) -> int:
    return RANKS_PER_CORE * (cores or usable_cores())


def auto_jobs() -> int:
    """``-n auto``: as many 2-rank scenarios as the rank budget takes, and memory holds."""
    by_memory = psutil.virtual_memory().available // SCENARIO_MEMORY
    return max(1, min(rank_budget() // 2, by_memory))


# ---- what a scenario takes ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Weight:
    ranks: int  # the most ranks it runs at once (first launch or relaunch)
    alone: str | None = None  # why nothing may run beside it (None: it may share the machine)


def alone_because(s) -> str | None:
    """Why scenario ``s`` must run alone for its verdict to be the serial one (None: it need not)."""
    from ckpt_chaos.scenario import Expect

    # A Slurm scenario's cluster is its own (daemons on ports drawn for it, state in its run folder)
    # and its waits are Slurm's timers, not CPU; its timed kinds (requeue, and preempt or time_limit
    # with a short grace or warning) stay alone below. Docker and netns nodes share the engine and
    # the host's network set-up.
    if s.cluster.multi_node and s.cluster.backend != "slurm":
        return f"{s.cluster.backend} nodes: engine-wide set-up, teardown timed by the collective timeout"
    if s.remote is not None:
        return "a remote tier: S3 request timeouts and a drain deadline"
    timed = [f.kind for f in s.faults if f.spec.is_timed(f.params)]
    if timed:
        return f"a {timed[0]} fault: what it shows depends on a timeout, a grace period or a rate"
    if any(f.when.external for f in s.faults):
        return "a fault triggered from outside: where it lands depends on the harness keeping up"
    if s.expect.detect_within_s is not None:
        return f"expect.detect_within_s = {s.expect.detect_within_s:g}: a time limit is checked"
    if s.expect.deadline_s < Expect().deadline_s:
        return f"expect.deadline_s = {s.expect.deadline_s:g}, below the default {Expect().deadline_s:g}"
    timeout = s.trainer.get("collective_timeout_s")
    if isinstance(timeout, (int, float)) and timeout < MIN_COLLECTIVE_TIMEOUT_S:
        return f"collective_timeout_s = {timeout:g}, below {MIN_COLLECTIVE_TIMEOUT_S:g}"
    if s.trainer.get("ckpt_every_seconds"):
        return "a wall-clock checkpoint cadence (ckpt_every_seconds)"
    return None


def weight(s) -> Weight:
    return Weight(ranks=max(s.world_size, s.resumed_world_size()), alone=alone_because(s))


# ---- what runs when ----------------------------------------------------------------------------------

class Scheduler:
    """Admits scenarios in catalogue order while they fit: at most ``jobs`` at once, their ranks within
    ``budget``, one that runs alone only on an idle machine, never two of the same name (one run
    directory). A scenario that does not fit yet lets later ones that do go first."""

    def __init__(self, names: list[str], weights: list[Weight], jobs: int, budget: int):
        self.names, self.weights, self.jobs, self.budget = names, weights, max(1, jobs), max(1, budget)
        self.pending = list(range(len(names)))
        self.running: set[int] = set()

    def ranks(self, i: int) -> int:
        return min(self.weights[i].ranks, self.budget)  # a scenario bigger than the machine runs alone

    def admit(self) -> list[int]:
        started = []
        for i in list(self.pending):
            if len(self.running) >= self.jobs or any(self.weights[r].alone for r in self.running):
                break
            if self.weights[i].alone and self.running:
                continue
            if self.names[i] in {self.names[r] for r in self.running}:
                continue
            if sum(self.ranks(r) for r in self.running) + self.ranks(i) > self.budget:
                continue
            self.pending.remove(i)
            self.running.add(i)
            started.append(i)
            if self.weights[i].alone:
                break
        return started

    def done(self, i: int) -> None:
        self.running.discard(i)

    @property
    def finished(self) -> bool:
        return not self.pending and not self.running


# ---- the workers -------------------------------------------------------------------------------------

@dataclass
class Worker:
    index: int
    scenario: object
    popen: subprocess.Popen
    row_path: Path
    log_path: Path
    started: float


class ParallelRun:
    """Runs ``scenarios`` in worker processes under a ``Scheduler``; ``run`` returns their rows by
    catalogue index. On KeyboardInterrupt every worker is told to stop (SIGTERM: it kills its job,
    heals, unmounts, as a serial run does on Ctrl-C), given ``STOP_GRACE_S``, then whatever is left of
    it is SIGKILLed and its leftovers removed; the KeyboardInterrupt then goes on to the caller."""

    def __init__(self, scenarios: list, out: Path, golden: Path | None, jobs: int, budget: int | None = None,
                 on_start: Callable[[int, object], None] = lambda i, s: None,
                 on_done: Callable[[int, object, dict, str], None] = lambda i, s, row, log: None):
        self.scenarios = scenarios
        self.out = Path(out)
        self.golden = golden
        self.budget = budget or rank_budget()
        self.scheduler = Scheduler([s.name for s in scenarios], [weight(s) for s in scenarios], jobs, self.budget)
        self.on_start, self.on_done = on_start, on_done
        self.token = uuid.uuid4().hex
        self.work = self.out / ".workers"
        self.workers: dict[int, Worker] = {}
        self.rows: dict[int, dict] = {}

    def run(self) -> dict[int, dict]:
        self.work.mkdir(parents=True, exist_ok=True)
        try:
            while not self.scheduler.finished:
                for i in self.scheduler.admit():
                    self._start(i)
                for w in [w for w in self.workers.values() if w.popen.poll() is not None]:
                    self._collect(w)
                time.sleep(0.2)
        except KeyboardInterrupt:
            stopped = list(self.workers.values())
            self._stop(stopped)
            for w in stopped:  # one that finished as the interrupt came has its row
                if w.row_path.exists():
                    self._collect(w)
            raise
        finally:
            tidy_work_dir(self.work)
        return self.rows

    def _start(self, i: int) -> None:
        from ckpt_chaos.env.launcher import harness_pythonpath

        s = self.scenarios[i]
        cmd, row_path, log_path = worker_command(s, i, self.work, self.out, self.golden, parent=os.getpid())
        with open(log_path, "wb") as log:
            # A session of its own: a Ctrl-C at the terminal reaches the parent only, which stops each
            # worker once, instead of interrupting its clean-up half-way.
            popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True,
                                     env={**os.environ, "PYTHONPATH": harness_pythonpath(), RUN_ENV: self.token})
        self.workers[i] = Worker(i, s, popen, row_path, log_path, time.monotonic())
        self.on_start(i, s)

    def _collect(self, w: Worker) -> None:
        del self.workers[w.index]
        self.scheduler.done(w.index)
        log = w.log_path.read_text(errors="replace") if w.log_path.exists() else ""
        s = w.scenario
        row = json.loads(w.row_path.read_text()) if w.row_path.exists() else {}
        w.row_path.unlink(missing_ok=True)
        if w.popen.returncode == 0 and row and "harness_error" not in row:
            w.log_path.unlink(missing_ok=True)
        else:  # a harness error (a serial run would stop with its traceback): a failed row, log kept
            error = row.get("harness_error") or last_line(log)
            row = failed_row(s, self.out, f"harness error in its worker (exit status {w.popen.returncode}; "
                                          f"{w.log_path}): {error}", time.monotonic() - w.started)
            log = ""
        self.rows[w.index] = row
        self.on_done(w.index, s, row, log)

    def _stop(self, workers: list[Worker]) -> None:
        try:
            for w in workers:
                _signal(w.popen, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            while any(w.popen.poll() is None for w in workers) and time.monotonic() < deadline:
                time.sleep(0.1)
        except KeyboardInterrupt:
            pass  # interrupted again: stop waiting, kill now
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            # Also a worker started as the interrupt came, before it was known here: it carries the token.
            kill_tree([w.popen.pid for w in workers if w.popen.poll() is None], self.token)
            for w in workers:
                w.popen.wait()
            # forced: they had no time to unmount or remove their nodes; one that stopped in time may
            # have been cut short in its own clean-up too. Their owners are dead now either way.
            remove_leftovers()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def last_line(log: str) -> str:
    return (log.strip().splitlines() or ["no output"])[-1]


def failed_row(s, out: Path, reason: str, wall_s: float) -> dict:
    """The row of scenario ``s`` whose worker gave none, or a harness error: failed, with ``reason``.
    Shared with the Slurm fan-out (``ckpt_chaos.run.fanout``), whose jobs can also die without a row."""
    from ckpt_chaos.report import results
    from ckpt_chaos.run.runner import Result

    run_dir = Path(out) / s.name
    row = Result(scenario=s.name, verdict="fail", reason=reason, families=s.families, kinds=s.kinds, tags=s.tags,
                 wall_s=wall_s, run_dir=str(run_dir) if run_dir.is_dir() else "").to_dict()
    row.update(trainer_module=s.trainer_module, trainer_revision=results.trainer_revision(s.trainer_module))
    return row


def worker_command(s, i: int, work: Path, out: Path, golden: Path | None,
                   parent: int | None = None) -> tuple[list[str], Path, Path]:
    """The command of the worker that runs scenario ``s`` (index ``i`` of the run), and the files of
    its row and its log in ``work``. A scenario built in Python is handed over as its TOML."""
    source = Path(s.source)
    if not source.is_file():
        source = work / f"{i}-{s.name}.toml"
        source.write_text(s.to_toml())
    row_path, log_path = work / f"{i}-{s.name}.row.json", work / f"{i}-{s.name}.log"
    cmd = [sys.executable, "-m", "ckpt_chaos.run.parallel", "--scenario", str(source.resolve()), "--out", str(out),
           "--row", str(row_path)]
    if parent is not None:
        cmd += ["--parent", str(parent)]
    if golden is not None:
        cmd += ["--golden", str(golden)]
    return cmd, row_path, log_path


def tidy_work_dir(work: Path) -> None:
    """Remove a run's worker files (scenario copies, empty logs) and the folder if nothing is left:
    the log of an interrupted worker with something to say stays."""
    for f in work.glob("*.toml"):
        f.unlink()
    for f in work.glob("*.log"):
        if f.stat().st_size == 0:
            f.unlink()
    if work.is_dir() and not any(work.iterdir()):
        work.rmdir()


def _signal(popen: subprocess.Popen, sig: int) -> None:
    try:
        popen.send_signal(sig)
    except ProcessLookupError:
        pass


def kill_tree(pids: list[int], token: str) -> int:
    """SIGKILL these processes, everything under them, and every process carrying ``RUN_ENV=token``
    (a rank whose torchrun died has another parent, but the environment it inherited); how many."""
    procs = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs += [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(RUN_ENV) == token:
                procs.append(p)
        except (psutil.Error, OSError):
            pass
    kill_processes(procs)
    psutil.wait_procs([p for p in procs if p.pid not in pids], timeout=5)
    return len(procs)


def remove_leftovers() -> list[str]:
    """Every kind of leftover of processes that are gone: mounts and faultfs daemons, nodes, Slurm
    clusters."""
    from ckpt_chaos.env import cluster, slurm, storage

    removed = []
    for remove in (storage.remove_leftovers, cluster.remove_leftovers, slurm.remove_leftovers):
        try:
            removed += remove()
        except Exception as e:  # one kind that cannot be listed must not keep the others
            print(f"ckpt-chaos: cannot remove leftovers ({remove.__module__}): {e}", file=sys.stderr)
    return removed


# ---- pytest-xdist: the same admission, between worker processes ---------------------------------------

class Slots:
    """The rank budget as lock files every process can take from: a scenario holds one slot per rank
    (all of them to run alone). ``flock`` locks die with their process, so a killed worker frees its
    slots. One taker at a time waits for slots while holding the gate, so a scenario that needs all of
    them is not overtaken for ever by small ones."""

    def __init__(self, directory: Path, budget: int | None = None):
        self.dir = Path(directory)
        self.budget = budget or rank_budget()

    @contextmanager
    def hold(self, w: Weight, poll_s: float = 0.2, timeout: float | None = None) -> Iterator[None]:
        need = self.budget if w.alone else min(w.ranks, self.budget)
        self.dir.mkdir(parents=True, exist_ok=True)
        end = None if timeout is None else time.monotonic() + timeout
        held: list[int] = []
        gate = os.open(self.dir / "gate.lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(gate, fcntl.LOCK_EX)
            try:
                while not self._take(need, held):
                    if end is not None and time.monotonic() > end:
                        raise TimeoutError(f"{need} of {self.budget} slots in {self.dir} not free in {timeout}s")
                    time.sleep(poll_s)
            finally:
                fcntl.flock(gate, fcntl.LOCK_UN)
            yield
        finally:
            os.close(gate)
            for fd in held:
                os.close(fd)

    def _take(self, need: int, held: list[int]) -> bool:
        for n in range(self.budget):
            if len(held) == need:
                break
            fd = os.open(self.dir / f"slot{n}.lock", os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(fd)
            except BlockingIOError:
                os.close(fd)
        if len(held) == need:
            return True
        while held:  # all or nothing: half a budget held while waiting could block the holders' peers
            os.close(held.pop())
        return False


# ---- the worker process --------------------------------------------------------------------------------

def worker_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckpt_chaos.run.parallel",
                                description="Run one scenario for a parallel ckpt-chaos run (internal).")
    p.add_argument("--scenario", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--row", required=True)
    p.add_argument("--golden")
    # The harness's pid, when it runs on this host (ParallelRun): the worker dies with it. A Slurm job
    # has none: its harness may be on another host, and Slurm ends the job (scancel, time limit).
    p.add_argument("--parent", type=int)
    args = p.parse_args(argv)
    interrupted = []

    def stop(signum, frame):
        if not interrupted:  # once: a second signal must not cut the clean-up short
            interrupted.append(signum)
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        if args.parent is not None:
            die_with_parent(signal.SIGTERM, parent=args.parent)  # as torchrun gets from us
        from ckpt_chaos.report import results
        from ckpt_chaos.run.runner import run_scenario
        from ckpt_chaos.scenario import load

        s = load(args.scenario)
        row = results.scenario_row(run_scenario(s, Path(args.out), Path(args.golden) if args.golden else None), s)
        code = 0
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # what would stop a serial run with a traceback: the traceback to the log, the line up
        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0]  # a failed golden run appends its whole log
        row, code = {"harness_error": f"{type(e).__name__}: {first}"}, 1
    tmp = Path(args.row).with_suffix(".tmp")
    tmp.write_text(json.dumps(row))
    os.replace(tmp, args.row)
    return code


if __name__ == "__main__":
    sys.exit(worker_main())
