"""Scheduler faults, on the Slurm backend: what Slurm itself does to a job. A higher-priority job
preempts it (SIGTERM, the partition's GraceTime, SIGKILL, requeue), an operator requeues it or
signals its tasks (``scancel --signal``), a node is lost and set down (the job is requeued onto
the nodes that are left).

The relaunches are Slurm's: the harness only waits for the requeued job to run again, and the
checks read what Slurm did from the history (each launch's ``SLURM_RESTART_COUNT`` and who
requeued it).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ckpt_chaos.check.expected import faults_after, relaunched
from ckpt_chaos.env import slurm as slurm_env
from ckpt_chaos.faults.kind import AMPLE_S, Effects, FaultKind, Nemesis, NoParams
from ckpt_chaos.faults.registry import Invalid

if TYPE_CHECKING:
    from ckpt_chaos.check.history import FaultFired
    from ckpt_chaos.check.verdict import Report, Run
    from ckpt_chaos.scenario import Fault, Scenario

Signal = Literal["TERM", "INT", "USR1", "USR2"]
# what the scenario loader calls a value of each set in its messages ("unknown signal 'HUP'")
CHOICES = {Signal: "signal"}
# torchrun's line for each worker it passes a signal on to (torch/distributed/elastic/multiprocessing/api.py)
PASSED_ON = re.compile(r"Sending process \d+ closing signal SIG\w+")


@dataclass
class PreemptParams:
    grace_s: int = 10  # the preempted partition's GraceTime: SIGTERM, this long, then SIGKILL and requeue
    hold_s: float = 1.0  # how long the preempting job holds the nodes before it ends


@dataclass
class SignalParams:
    signal: Signal = "TERM"  # scancel --signal to the job's tasks: TERM | INT | USR1 | USR2


@dataclass
class TimeLimitParams:
    minutes: int = 1  # the job's new TimeLimit, in whole minutes from its start (Slurm keeps no finer one)
    warn_s: int = 55  # sbatch --signal=TERM@warn_s: the warning this long before the limit


@dataclass
class NodeDownParams:
    back: bool = False  # the node is repaired when the launch ends (slurmd restarted, state=resume)


class SlurmNemesis(Nemesis):
    """Slurm's own preemption, requeue, signals and node failures, on the run's cluster."""

    def __init__(self, setting):
        super().__init__(setting)
        self.down: list[str] = []  # nodes set down, to bring back at the end of the launch
        self.limited: list[int] = []  # jobs whose time limit was cut, to lift at the end of the launch

    @staticmethod
    def sbatch_args(s: Scenario) -> list[str]:
        """What the job must be submitted with for the scenario's faults: a time limit's warning
        signal is set at submission (sbatch --signal), to the job's steps, where torchrun is."""
        warn = [f.params.warn_s for f in s.faults if f.kind == "time_limit"]
        return [f"--signal=TERM@{max(warn)}"] if warn else []

    @staticmethod
    def missing(s: Scenario) -> str | None:
        if s.cluster.backend != "slurm":
            return None
        why = slurm_env.missing()
        return f"the slurm backend: {why}" if why else None

    def _told(self, act, record: dict, timeout: float = 20.0) -> None:
        """Do ``act`` (a Slurm command that signals the job), holding the triggering rank until every
        rank has been signalled: Slurm takes a scheduling pass or an RPC to get there, and the fault
        must land where its trigger says, not a few steps later. torchrun logs each worker it passes
        the signal on to."""
        log = self.launch.job.log_path
        start = log.stat().st_size if log.exists() else 0
        t0 = time.monotonic()
        act()
        ranks = self.launch.world_size
        while time.monotonic() - t0 < timeout:
            with log.open("rb") as f:
                f.seek(start)
                told = len(PASSED_ON.findall(f.read().decode(errors="replace")))
            if told >= ranks:
                break
            time.sleep(0.02)
        record.update(ranks_signalled=told, signalled_after_s=round(time.monotonic() - t0, 3))

    def preempt(self, fault: Fault, event: dict, record: dict) -> None:
        cluster, job = self.setting.cluster, self.launch.job
        p = fault.params
        cluster.scontrol("update", "PartitionName=main", f"GraceTime={p.grace_s}")
        nodes = job.state().get("NumNodes", "1").split("-")[0]
        record.update(job_id=job.job.job_id, grace_s=p.grace_s, hold_s=p.hold_s, nodes=int(nodes))

        def submit():
            record["preemptor"] = cluster.sbatch(f"#!/bin/bash\nsleep {p.hold_s}\n", f"--partition={slurm_env.URGENT}",
                                                 f"--nodes={nodes}", "--output=/dev/null", "--job-name=preemptor")
        self._told(submit, record)

    def requeue(self, fault: Fault, event: dict, record: dict) -> None:
        job = self.launch.job
        record.update(job_id=job.job.job_id)
        self._told(lambda: self.setting.cluster.scontrol("requeue", str(job.job.job_id)), record)

    def signal_(self, fault: Fault, event: dict, record: dict) -> None:
        job = self.launch.job
        record.update(job_id=job.job.job_id, signal=fault.params.signal)
        self._told(lambda: self.setting.cluster.scancel(f"--signal={fault.params.signal}", str(job.job.job_id)),
                   record)

    def time_limit(self, fault: Fault, event: dict, record: dict) -> None:
        """The job's time limit cut to ``minutes``: Slurm sends the warning signal ``warn_s`` before it
        (from its periodic time-limit pass, every 30 s in 22.05) and ends the job at the limit."""
        job = self.launch.job
        info = job.state()
        record.update(job_id=job.job.job_id, run_time=info.get("RunTime"), minutes=fault.params.minutes,
                      warn_s=fault.params.warn_s)
        self.setting.cluster.scontrol("update", f"JobId={job.job.job_id}", f"TimeLimit={fault.params.minutes}")
        self.limited.append(job.job.job_id)

    def node_down(self, fault: Fault, event: dict, record: dict) -> None:
        cluster, job = self.setting.cluster, self.launch.job
        index = int(fault.target[5:])
        name = job.node_name(index)
        if name is None:
            raise RuntimeError(f"no task of the job runs on its node {index}")
        record.update(node=index, name=name, job_id=job.job.job_id, pids=cluster.kill_node(name))
        cluster.scontrol("update", f"NodeName={name}", "State=DOWN", "Reason=ckpt-chaos-node-down")
        if fault.params.back:
            self.down.append(name)

    def heal(self) -> dict:
        back, self.down = self.down, []
        for name in back:
            self.setting.cluster.restart_node(name)
            self.setting.cluster.scontrol("update", f"NodeName={name}", "State=RESUME")
        return {"nodes_back": back} if back else {}

    def new_launch(self, launch) -> None:
        super().new_launch(launch)
        # The operator requeues a job that ran out of time with room to finish, or it would be warned
        # and stopped again; the job is pending by now (Slurm refuses to change a finished one).
        lifted, self.limited = self.limited, []
        for job_id in lifted:
            self.setting.cluster.scontrol("update", f"JobId={job_id}", "TimeLimit=UNLIMITED")


# ---- validation and checks ------------------------------------------------------------------------

def _on_slurm(s: Scenario, f: Fault) -> None:
    if s.cluster.backend != "slurm":
        raise Invalid("kind", f"{f.kind} is Slurm's doing", "add [cluster] backend = \"slurm\"")
    if f.when.external:
        raise Invalid("when.point", f"{f.kind} acts at a probe point", "use a probe point")


def _check_preempt(s: Scenario, f: Fault) -> None:
    _on_slurm(s, f)
    if f.params.grace_s < 0 or f.params.hold_s <= 0:
        raise Invalid("grace_s" if f.params.grace_s < 0 else "hold_s", "must not be negative, and hold_s above 0",
                      "use grace_s >= 0 and hold_s > 0")


def _check_signal(s: Scenario, f: Fault) -> None:
    _on_slurm(s, f)


def _check_time_limit(s: Scenario, f: Fault) -> None:
    _on_slurm(s, f)
    p = f.params
    if p.minutes < 1 or not 0 < p.warn_s < 60 * p.minutes:
        raise Invalid("warn_s" if p.minutes >= 1 else "minutes", f"minutes = {p.minutes}, warn_s = {p.warn_s}",
                      "use minutes >= 1 and 0 < warn_s < 60 * minutes")


def _check_node_down(s: Scenario, f: Fault) -> None:
    _on_slurm(s, f)
    if not f.target.startswith("node:"):
        raise Invalid("target", "node_down takes a whole node down", "use target = \"node:N\"")
    if int(f.target[5:]) >= s.nodes():
        raise Invalid("target", f"the job has nodes 0..{s.nodes() - 1}", f"use node:0..node:{s.nodes() - 1}")
    if not f.params.back and s.resumed_world_size() > s.world_size - s.cluster.ranks_per_node:
        raise Invalid("recovery.world_size", "with the node down for good the requeued job has one node less",
                      f"set recovery.world_size = {s.world_size - s.cluster.ranks_per_node} (or back = true)",
                      top=True)


WHO = {"slurm": "Slurm requeued job {job}", "job": "job {job} requeued itself after the preemption"}


def _requeued(run: Run, h: FaultFired, report: Report) -> None:
    """The next launch is the same job requeued through Slurm (not by the harness), with
    SLURM_RESTART_COUNT counting it."""
    from ckpt_chaos.check.history import LaunchStarted

    nxt = [x for x in run.records(LaunchStarted) if x.launch == h.launch + 1]
    info = (nxt[0].slurm or {}) if nxt else {}
    job = h.detail.get("job_id")
    ok = bool(nxt) and info.get("requeued_by") in WHO and info.get("job_id") == job \
        and info.get("restart_count") == h.launch + 1
    report.add("requeued", ok, fault=h.index, detail=
               f"{WHO[info['requeued_by']].format(job=job)}: launch {h.launch + 1} ran with SLURM_RESTART_COUNT="
               f"{info.get('restart_count')} on {info.get('node_list')}" if ok else
               "no launch followed the fault" if not nxt else
               f"launch {h.launch + 1} was not a requeue of job {job} through Slurm: {info}")


def _stopped_in_grace(run: Run, h: FaultFired, report: Report) -> None:
    """The job was told (SIGTERM) and either saved where it stood and exited before the SIGKILL, or,
    where the scenario expects it (``expect.job_fails``), was killed at the end of the grace period."""
    ex = run.exit_of(h.launch)
    stops = [e for e in run.trainer("stopped", h.launch) if e.get("reason") == "preempt"]
    if run.s.expect.job_fails is True:
        detail = (f"the emergency save did not fit in the {h.detail.get('grace_s')} s grace: Slurm killed the "
                  f"launch (exit status {ex.rc if ex else None})" if not stops else
                  f"expected the grace period to run out, but the job stopped with an emergency checkpoint "
                  f"in {stops[0]['save_s']:.2f} s")
        report.add("grace_ran_out", not stops, detail, fault=h.index)
        return
    # torchrun exits non-zero after a SIGTERM however its workers ended: the trainer's own record of
    # its emergency save, written once the save is complete, is what tells
    detail = (f"emergency checkpoint at step {stops[0]['step']}+{stops[0]['micro']} micro-batches in "
              f"{stops[0]['save_s']:.2f} s, before Slurm's SIGKILL" if stops else
              "the job did not stop with an emergency checkpoint after Slurm's SIGTERM")
    report.add("preemption_handled", bool(stops), detail, fault=h.index)


def _preempted(run: Run, h: FaultFired, report: Report) -> None:
    _stopped_in_grace(run, h, report)
    _requeued(run, h, report)


def _signalled(run: Run, h: FaultFired, report: Report) -> None:
    if h.detail.get("signal") == "TERM":
        _stopped_in_grace(run, h, report)
    else:
        ex = run.exit_of(h.launch)
        report.add("job_failed", ex is not None and ex.rc != 0, fault=h.index,
                   detail=f"launch {h.launch} exited with status {ex.rc if ex else None} after SIG{h.detail['signal']}")


def _node_lost(run: Run, h: FaultFired, report: Report) -> None:
    from ckpt_chaos.check.history import LaunchStarted

    _requeued(run, h, report)
    nxt = [x for x in run.records(LaunchStarted) if x.launch == h.launch + 1]
    if nxt and not run.s.faults[h.index].params.back:
        nodes = (nxt[0].slurm or {}).get("node_list", "")
        lost = h.detail.get("name")
        report.add("not_on_lost_node", lost not in slurm_env.expand_nodes(nodes), fault=h.index,
                   detail=f"launch {h.launch + 1} ran on {nodes}, without {lost} (down)")


def _requeue_check(run: Run, h: FaultFired, report: Report) -> None:
    _requeued(run, h, report)


# ---- coverage: when a fault of a kind here gets a verdict from its checks -------------------------

def _no_later_fault(s: Scenario, f: Fault) -> bool:
    """n/a where a later fault interrupted the emergency save on purpose."""
    return not faults_after(s, f)


def _outlasts_grace(s: Scenario, f: Fault) -> bool:
    """A preemption the scenario expects to outlast its grace (``expect.job_fails``)."""
    return bool(s.expect.job_fails)


def _requeue_follows(s: Scenario, f: Fault) -> bool:
    """The next launch is the requeued job."""
    return relaunched(s)


# where the family's kinds come in the registry, and its nemesis in a run's (faults/__init__.py)
ORDER = 5
KINDS = (
    FaultKind(name="preempt", family="scheduler",
              doc="a job in a higher-priority partition preempts the job: SIGTERM to its tasks, grace_s (the "
                  "partition's GraceTime), SIGKILL, and Slurm requeues it",
              params=PreemptParams, nemesis=SlurmNemesis, action=SlurmNemesis.preempt, colour="#6a51a3",
              effects=Effects(ends_launch=True, preempts=True, notice=True), validate=_check_preempt,
              exit_check=_preempted,
              coverage={
                  "fault_preemption_handled": lambda s, f: _no_later_fault(s, f) and not s.expect.job_fails,
                  "fault_grace_ran_out": _outlasts_grace, "fault_requeued": _requeue_follows},
              timed=lambda p: p.grace_s < AMPLE_S),
    FaultKind(name="requeue", family="scheduler",
              doc="scontrol requeue: Slurm ends the job's tasks (SIGTERM, KillWait, SIGKILL) and runs the job again",
              params=NoParams, nemesis=SlurmNemesis, action=SlurmNemesis.requeue, colour="#807dba",
              effects=Effects(ends_launch=True, slurm_requeues=True), validate=_on_slurm, exit_check=_requeue_check,
              timed=True, coverage={"fault_requeued": _requeue_follows}),
    FaultKind(name="signal", family="scheduler",
              doc="scancel --signal to the job's tasks (signal: TERM | INT | USR1 | USR2)",
              params=SignalParams, nemesis=SlurmNemesis, action=SlurmNemesis.signal_, colour="#9e9ac8",
              effects=Effects(ends_launch=True), validate=_check_signal, exit_check=_signalled,
              coverage={"fault_preemption_handled": _no_later_fault, "fault_grace_ran_out": _outlasts_grace,
                        # scancel --signal of another signal than TERM (the job's notice) must end the launch
                        "fault_job_failed": lambda s, f: f.params.signal != "TERM"}),
    FaultKind(name="time_limit", family="scheduler",
              doc="the job's time limit is cut to minutes: Slurm warns it warn_s before (sbatch "
                  "--signal=TERM@warn_s, to its tasks) and ends it at the limit",
              params=TimeLimitParams, nemesis=SlurmNemesis, action=SlurmNemesis.time_limit, colour="#bcbddc",
              effects=Effects(ends_launch=True, notice=True), validate=_check_time_limit, exit_check=_stopped_in_grace,
              coverage={"fault_preemption_handled": _no_later_fault, "fault_grace_ran_out": _outlasts_grace},
              timed=lambda p: p.warn_s < AMPLE_S),
    FaultKind(name="node_down", family="scheduler",
              doc="a node is lost (its slurmd, step daemons and tasks SIGKILLed) and set down: Slurm requeues the "
                  "job onto the nodes that are left",
              params=NodeDownParams, nemesis=SlurmNemesis, action=SlurmNemesis.node_down, colour="#3f007d",
              effects=Effects(ends_launch=True, slurm_requeues=True, crashes=True, kills_target=True),
              validate=_check_node_down, exit_check=_node_lost,
              coverage={
                  "fault_requeued": _requeue_follows,
                  "fault_not_on_lost_node": lambda s, f: relaunched(s) and not f.params.back}),
)
