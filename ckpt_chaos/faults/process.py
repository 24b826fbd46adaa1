"""Process faults: signals to the job's own processes (kill, term, stop) and exceptions raised inside a
rank at its probe point. They need nothing beyond the job itself, on every backend.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import psutil

from ckpt_chaos.check.expected import faults_after
from ckpt_chaos.env.launcher import kill_pending
from ckpt_chaos.faults.kind import AMPLE_S, Effects, FaultKind, Nemesis, NoParams, Setting
from ckpt_chaos.faults.registry import Invalid
from ckpt_chaos.faults.search_rules import KILL, RAISE, STOP, TERM

if TYPE_CHECKING:
    from ckpt_chaos.check.history import FaultFired
    from ckpt_chaos.check.verdict import Report, Run
    from ckpt_chaos.env.launcher import Job
    from ckpt_chaos.scenario import Fault, Scenario

RaiseError = Literal["oom", "io", "runtime"]
# what the scenario loader calls a value of each set in its messages ("unknown error 'segfault'")
CHOICES = {RaiseError: "error"}


@dataclass
class TermParams:
    grace_s: float = 10.0  # SIGKILL whatever is left this long after the SIGTERM


@dataclass
class RaiseParams:
    error: RaiseError = "oom"  # the exception raised in the rank: oom | io | runtime


def signal_pid(pid: int, sig: signal.Signals) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def wait_gone(pids: list[int], timeout: float = 10.0) -> None:
    """Until each process is dead. A zombie is dead: it is not reaped here, since one may be the
    harness's own child (a trainer that is its own launcher), whose exit status only its Popen may read."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    deadline = time.monotonic() + timeout
    while procs and time.monotonic() < deadline:
        procs = [p for p in procs if _running(p)]
        if procs:
            time.sleep(0.005)


def _running(proc: psutil.Process) -> bool:
    """Not dead yet. A process blocked in the kernel with SIGKILL pending is dead too: it runs no
    more of its own code, and it may be waiting for the answer to the very event being handled (a
    write faultfs holds until the controller has answered)."""
    try:
        status = proc.status()
    except psutil.NoSuchProcess:
        return False
    return status != psutil.STATUS_ZOMBIE and not (status == psutil.STATUS_DISK_SLEEP and kill_pending(proc.pid))



def kill_local_node(job: Job, pids: list[int]) -> int:
    """SIGKILL the local node: its launcher first, so nobody is left to react, then the ranks; returns
    the launcher's pid once the ranks are gone."""
    launcher = job.launcher_pids()[0]
    signal_pid(launcher, signal.SIGKILL)
    for pid in pids:
        signal_pid(pid, signal.SIGKILL)
    wait_gone(pids)
    return launcher


class ProcessNemesis(Nemesis):
    """SIGKILL, SIGTERM-then-SIGKILL, SIGSTOP and in-process exceptions, on the current launch."""

    def __init__(self, setting: Setting):
        super().__init__(setting)
        self.stopped: list[int] = []
        self.grace_expired: list[float] = []  # when a term's grace ran out with the job alive (this launch)
        self._timers: list[threading.Timer] = []

    def new_launch(self, launch) -> None:
        super().new_launch(launch)
        self.stopped, self.grace_expired, self._timers = [], [], []

    def kill(self, fault: Fault, event: dict, record: dict) -> None:
        pids = self.target_pids(fault, event, record)
        if fault.target == "uploader":
            pid = self.launch.roles.get("uploader")
            record.update(uploader_pid=pid)
            if pid is not None:
                signal_pid(pid, signal.SIGKILL)
                wait_gone([pid])
            return None
        if fault.target.startswith("node:") and self.setting.cluster is not None:
            record["node"] = int(fault.target[5:])
            self.setting.cluster.kill_nodes([record["node"]], self.launch.job)  # the host is gone
            wait_gone(list(pids.values()))
            return None
        if fault.target.startswith("node:"):
            # Node loss: the launcher dies with its workers, nobody is left to report it.
            record["launcher_pid"] = kill_local_node(self.launch.job, list(pids.values()))
            return None
        for pid in self.reached(pids, record).values():
            signal_pid(pid, signal.SIGKILL)
        wait_gone(list(pids.values()))
        return None

    def term(self, fault: Fault, event: dict, record: dict) -> None:
        pids = self.target_pids(fault, event, record)
        if fault.target in ("all", "node:0"):
            record["to"] = "launcher"  # as a scheduler's preemption notice reaches the job
            self.launch.job.signal(signal.SIGTERM)
        else:
            for pid in self.reached(pids, record).values():
                signal_pid(pid, signal.SIGTERM)
        # a trainer that restarts its own workers goes on after their death: the grace is theirs, not the launch's
        own = list(pids.values()) if self.launch.restarts_itself and fault.target not in ("all", "node:0") else None
        timer = threading.Timer(fault.params.grace_s, self._grace_expired, args=(self.launch.job, own))
        timer.daemon = True
        timer.start()
        self._timers.append(timer)
        record["grace_s"] = fault.params.grace_s
        return None

    def stop(self, fault: Fault, event: dict, record: dict) -> None:
        for pid in self.reached(self.target_pids(fault, event, record), record).values():
            if signal_pid(pid, signal.SIGSTOP):
                self.stopped.append(pid)
        return None

    def interrupt(self, fault: Fault, event: dict, record: dict) -> None:
        for pid in self.reached(self.target_pids(fault, event, record), record).values():
            signal_pid(pid, signal.SIGINT)
        return None

    def raise_(self, fault: Fault, event: dict, record: dict) -> dict:
        self.target_pids(fault, event, record)
        return {"do": "raise", "error": fault.params.error, "message": f"at {event['point']}"}

    def reap_stopped(self, closing: set[int]) -> list[int]:
        """SIGKILL the stopped processes among ``closing``, those torchrun has begun to close.

        torchrun closes a worker group with SIGTERM, waits 30 s for the workers to exit, then
        SIGKILLs them (``PContext.close(timeout=30)``, no knob). A stopped process cannot act on
        SIGTERM, so that wait ends in the same SIGKILL with nothing run in between: sending it now
        changes nothing but the clock (30 s of every run with a hang)."""
        reaped = [pid for pid in self.stopped if pid in closing]
        for pid in reaped:
            signal_pid(pid, signal.SIGKILL)
            signal_pid(pid, signal.SIGCONT)
        self.stopped = [pid for pid in self.stopped if pid not in reaped]
        return reaped

    def _grace_expired(self, job: Job, pids: list[int] | None = None) -> None:
        """The grace ran out: SIGKILL the job if it still runs, or with ``pids`` (the SIGTERMed workers of a
        trainer that restarts them) those of them still running, as the preempted node's end would."""
        if pids is not None:
            left = []
            for pid in pids:
                try:
                    if _running(psutil.Process(pid)):
                        left.append(pid)
                except psutil.NoSuchProcess:
                    continue
            if left:
                self.grace_expired.append(time.time())
                for pid in left:
                    signal_pid(pid, signal.SIGKILL)
            return
        if job.poll() is None:
            self.grace_expired.append(time.time())
            job.kill()

    def heal(self) -> dict:
        """Cancel pending grace timers and resume stopped processes (if any are left)."""
        for t in self._timers:
            t.cancel()
        for pid in self.stopped:
            signal_pid(pid, signal.SIGCONT)
        self.stopped.clear()
        return {}


# ---- validation and checks ------------------------------------------------------------------------

def _check_term(s: Scenario, f: Fault) -> None:
    if f.params.grace_s <= 0:
        raise Invalid("grace_s", f"{f.params.grace_s}", "use a positive grace period")


def _check_raise(s: Scenario, f: Fault) -> None:
    if f.when.external:
        raise Invalid("kind", "raise needs a probe point", "use kill, term or stop")
    if f.target not in ("triggering", f"rank:{f.when.rank}"):
        raise Invalid("target", "a raise happens inside the rank whose event fired",
                      "use target = \"triggering\" (and when.rank to choose the rank)")


def _preemption_handled(run: Run, h: FaultFired, report: Report) -> None:
    """The job stopped cleanly after SIGTERM: an emergency checkpoint inside the grace period."""
    fault = run.s.faults[h.index]
    ex = run.exit_of(h.launch)
    later = [x for x in run.faults() if x.launch == h.launch and x.t > h.t]
    if later:  # the scenario broke the emergency save on purpose
        report.add("preemption_handled", "n/a", fault=h.index,
                   detail=f"fault {later[0].index} ({later[0].fault}) interrupted the emergency save on purpose")
        return
    stops = [e for e in run.trainer("stopped", h.launch) if e.get("reason") == "preempt"]
    failed = [e for e in run.trainer("save_failed", h.launch) if e.get("reason") == "preempt" and e.get("t", 0) >= h.t]
    earlier = [x for x in run.faults() if x.launch == h.launch and x.t < h.t and run.s.faults[x.index].spec.fails_saves]
    if not stops and failed and earlier:
        # no emergency checkpoint could be made; whether the launch then ended as the trainer's
        # on_save_failure promises is save_failure_policy's to judge
        report.add("preemption_handled", "n/a", fault=h.index, detail=
                   f"fault {earlier[-1].index} ({earlier[-1].fault}) made saves fail before the SIGTERM, and the "
                   f"emergency save {failed[0].get('name')} failed, which the trainer reported (save_failed)")
        return
    in_grace = not (ex and ex.grace_expired)
    ok = bool(stops) and in_grace
    detail = (f"emergency checkpoint at step {stops[0]['step']}+{stops[0]['micro']} micro-batches in "
              f"{stops[0]['save_s']:.2f}s, inside the {fault.params.grace_s:.0f}s grace period" if ok else
              f"the emergency checkpoint was saved {stops[0]['since_signal_s']:.2f}s after SIGTERM, but the "
              f"launch was still running when the {fault.params.grace_s:.0f}s grace period ran out and was "
              f"SIGKILLed (what came after the save, an upload drain or the exit, took too long)"
              if stops and "since_signal_s" in stops[0] else
              "no emergency checkpoint before the grace period ran out" if stops or not in_grace else
              "the job did not stop with an emergency checkpoint after SIGTERM")
    report.add("preemption_handled", ok, detail, fault=h.index)


# where the family's kinds come in the registry, and its nemesis in a run's (faults/__init__.py)
ORDER = 1
KINDS = (
    FaultKind(name="kill", family="process",
              doc="SIGKILL the target ranks (with node:N, the node's launcher too)",
              params=NoParams, nemesis=ProcessNemesis, action=ProcessNemesis.kill, colour="#de2d26",
              effects=Effects(ends_launch=True, crashes=True, kills_target=True, uploader=True), search=KILL),
    FaultKind(name="term", family="process",
              doc="SIGTERM (a preemption notice), then SIGKILL whatever is left after grace_s",
              params=TermParams, nemesis=ProcessNemesis, action=ProcessNemesis.term, colour="#fc9272",
              effects=Effects(ends_launch=True, notice=True, sigterm_grace=True), validate=_check_term,
              exit_check=_preemption_handled,
              # n/a where a later fault interrupted the emergency save on purpose
              coverage={"fault_preemption_handled": lambda s, f: not faults_after(s, f)},
              timed=lambda p: p.grace_s < AMPLE_S, search=TERM),
    FaultKind(name="stop", family="process",
              doc="SIGSTOP the target ranks: a hang that the job must detect by its collective timeout",
              params=NoParams, nemesis=ProcessNemesis, action=ProcessNemesis.stop, colour="#67000d",
              effects=Effects(ends_launch=True, crashes=True), timed=True, search=STOP),
    FaultKind(name="raise", family="process",
              doc="raise an exception inside the triggering rank at the probe point (error: oom|io|runtime)",
              params=RaiseParams, nemesis=ProcessNemesis, action=ProcessNemesis.raise_, colour="#ef3b2c",
              effects=Effects(ends_launch=True), validate=_check_raise, search=RAISE),
    FaultKind(name="interrupt", family="process",
              doc="SIGINT the target ranks: Ctrl-C on an interactive job, or scancel --signal=INT",
              params=NoParams, nemesis=ProcessNemesis, action=ProcessNemesis.interrupt, colour="#fb6a4a",
              effects=Effects(ends_launch=True)),
)
