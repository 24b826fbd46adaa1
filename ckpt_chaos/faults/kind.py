"""What a fault kind is (``FaultKind``) and how a family acts on a run (``Nemesis``), for the
family modules to define their kinds with. The registry of every kind is the package's
(``ckpt_chaos/faults/__init__.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ckpt_chaos.faults.registry import lookup
from ckpt_chaos.faults.targets import target_ranks

if TYPE_CHECKING:
    from ckpt_chaos.check.history import FaultFired
    from ckpt_chaos.check.verdict import Report, Run
    from ckpt_chaos.env.cluster import Cluster
    from ckpt_chaos.env.launcher import Job
    from ckpt_chaos.env.objectstore import RemoteTier
    from ckpt_chaos.env.storage import Storage
    from ckpt_chaos.faults.search_rules import SearchRule
    from ckpt_chaos.scenario import Fault, Scenario

# A grace period or warning at least this long is no race on a loaded machine: the catalogue's
# emergency saves take well under a second, and two scenarios side by side slow them about twofold
# (the same bound as the collective timeout scenarios may share at, parallel.MIN_COLLECTIVE_TIMEOUT_S).
AMPLE_S = 15.0

# How long a fault waits for a target rank that has not reported its pid yet, while the rank that
# triggered it is held at its probe point: ranks start seconds apart on a loaded machine, and a fault
# on a rank that is about to report must not act on nobody.
PID_WAIT_S = 10.0


@dataclass
class NoParams:
    """The parameters of a kind that takes no keys of its own."""


@dataclass(frozen=True)
class Effects:
    """What a kind of fault does to a run, as the checks, the coverage rules and the search read it:
    each a yes/no fact of the kind, all no by default."""

    ends_launch: bool = False
    """The launch cannot go on; otherwise whether it stops is the trainer's policy."""
    crashes: bool = False
    """Processes end where they stand, leaving the disk as it is at that point."""
    notice: bool = False
    """The job is told first (a preemption) and may save where it stands: no work lost."""
    kills_target: bool = False
    """Its targets die of it: their exits are the fault, not the job noticing."""
    fails_saves: bool = False
    """Calls of the save under way at (or after) it fail."""
    fills_disk: bool = False
    """Every later save fails too, until space is given back."""
    damages: bool = False
    """It damages a committed checkpoint on purpose (its record names it)."""
    loses_disk: bool = False
    """The node's local checkpoint disk is gone: only the remote tier is left."""
    loses_unsynced: bool = False
    """Data not yet made durable by fsync is lost."""
    uploader: bool = False
    """``target = "uploader"`` acts on the remote tier's uploader process."""
    healable: bool = False
    """A heal fault lifts it."""
    heals: bool = False
    """It is a heal: every nemesis of the run lifts what it injected."""
    sigterm_grace: bool = False
    """The harness SIGTERMs its targets, then SIGKILLs what is left after ``grace_s``."""
    on_link: bool = False
    """It acts on a link of the remote tier (``params.link``), failing or stalling what uses it."""
    corrupts_local: bool = False
    """It damages files of a local checkpoint (params ``corruption``, ``file``, ``checkpoint``)."""
    slurm_requeues: bool = False
    """Slurm itself requeues the job it ended."""
    preempts: bool = False
    """Slurm preempts the job: it requeues itself within the grace, or Slurm does after."""


def _effect(name: str) -> property:
    """A kind's ``Effects`` flag read as an attribute of the kind, as its readers name it."""
    return property(lambda kind: getattr(kind.effects, name), doc=f"``Effects.{name}`` of this kind.")


@dataclass(frozen=True, kw_only=True)
class FaultKind:
    """Everything the harness knows about one kind of fault; built by keyword."""

    name: str
    family: str  # pytest marker and report group: process | node | network | storage | remote
    doc: str  # one line: what it does
    params: type  # dataclass of the kind's own TOML keys (besides kind, when, target, attempt)
    nemesis: type[Nemesis] | None  # the class whose ``action`` injects it; None only for a heal
    action: Callable[[Any, Fault, dict, dict], dict | None] | None  # (nemesis, fault, event, record) -> answer
    colour: str  # its shading in plots and the report
    effects: Effects = Effects()  # what it does to a run
    validate: Callable[[Scenario, Fault], None] | None = None  # cross-field checks; raises Invalid
    needs: Callable[[Any], frozenset[str]] | None = None  # params -> what the run must set up (faultfs, ...)
    exit_check: Callable[[Run, FaultFired, Report], None] | None = None  # how its launch must end (else: it fails)
    effect_check: Callable[[Run, FaultFired, Report], None] | None = None  # what the trainer must show of it
    describe: Callable[[Fault, FaultFired], str] | None = None  # a short account, for a diagnosis
    # what its checks see depends on wall-clock time (a timeout, a grace period, a rate): on a loaded
    # machine the same run could end otherwise, so ``run -n`` runs its scenarios alone. A function
    # of the params where that depends on them (a grace period long enough is no race: ``AMPLE_S``).
    timed: bool | Callable[[Any], bool] = False
    # check of its exit and effect checks (as Report.add names it: fault_<name>) -> whether its fault f in
    # scenario s gets a verdict from it (not n/a) when the run goes as s expects; suite coverage goes by this
    coverage: dict[str, Callable[[Scenario, Fault], bool]] = field(default_factory=dict, hash=False)
    # how the fault-schedule search adds faults of this kind (faults/search_rules.py); None: it never does
    search: SearchRule | None = None

    ends_launch = _effect("ends_launch")
    crashes = _effect("crashes")
    notice = _effect("notice")
    kills_target = _effect("kills_target")
    fails_saves = _effect("fails_saves")
    fills_disk = _effect("fills_disk")
    damages = _effect("damages")
    loses_disk = _effect("loses_disk")
    loses_unsynced = _effect("loses_unsynced")
    uploader = _effect("uploader")
    healable = _effect("healable")
    heals = _effect("heals")
    sigterm_grace = _effect("sigterm_grace")
    on_link = _effect("on_link")
    corrupts_local = _effect("corrupts_local")
    slurm_requeues = _effect("slurm_requeues")
    preempts = _effect("preempts")

    def is_timed(self, params: Any) -> bool:
        return self.timed(params) if callable(self.timed) else self.timed

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self.params))

    def make_params(self, **keys: Any) -> Any:
        """The kind's parameters from keyword arguments; an unknown key raises a TypeError that says
        which keys the kind takes."""
        unknown = [k for k in keys if k not in self.keys]
        if unknown:
            takes = ", ".join(self.keys) or "no keys of its own"
            raise TypeError(f"fault kind {self.name!r} takes {takes}, not {unknown[0]!r}")
        return self.params(**keys)


@dataclass
class Setting:
    """What the nemeses of one run act on, for the whole run."""

    run_dir: Path
    storage: Storage
    cluster: Cluster | None = None
    remote: RemoteTier | None = None


@dataclass
class Launch:
    """The launch the nemeses act on now."""

    number: int
    job: Job
    world_size: int
    pids: dict[int, int]  # rank -> host pid, filled from probe events as they come (the runner's own dict)
    roles: dict[str, int]  # other processes of the job: "uploader" -> pid
    # wait (bounded) until these ranks of the event's launch have reported their pids into ``pids``;
    # None where no rank reports (a job run without the probe)
    await_pids: Callable[[list[int], dict, float], None] | None = None
    # recovery.relaunch = "self": the trainer restarts a rank that dies, so the launch does not end with it
    restarts_itself: bool = False


class Nemesis:
    """One family's actions on a run. ``fire`` acts while the rank whose event triggered it waits at
    its probe point, and returns the answer for that rank (None: continue) and a record of what it
    did, which goes into the history."""

    def __init__(self, setting: Setting):
        self.setting = setting
        self.launch: Launch | None = None

    @staticmethod
    def missing(s: Scenario) -> str | None:
        """Why this machine cannot inject the scenario's faults of this family (None: it can)."""
        return None

    def new_launch(self, launch: Launch) -> None:
        self.launch = launch

    def fire(self, fault: Fault, event: dict) -> tuple[dict | None, dict]:
        record: dict = {}
        answer = lookup(fault.kind).action(self, fault, event, record)
        return answer, record

    def target_pids(self, fault: Fault, event: dict, record: dict) -> dict[int, int]:
        """rank -> pid of the fault's targets in this launch, noted in ``record``. A target that has not
        reported its pid yet is waited for (``PID_WAIT_S``); one still missing is named there."""
        cluster = self.setting.cluster
        ranks = target_ranks(fault.target, self.launch.world_size, triggering=event["rank"],
                             ranks_per_node=cluster.ranks_per_node if cluster else None)
        if self.launch.await_pids is not None and any(r not in self.launch.pids for r in ranks):
            self.launch.await_pids(ranks, event, PID_WAIT_S)
        pids = {r: self.launch.pids[r] for r in ranks if r in self.launch.pids}
        record.update(ranks=ranks, pids=sorted(pids.values()), missing_ranks=sorted(set(ranks) - set(pids)))
        return pids

    @staticmethod
    def reached(pids: dict[int, int], record: dict) -> dict[int, int]:
        """``pids``, for an action that reaches its targets only by their pids; with none, the record
        says the fault acted on no process (``FaultFired.unreached``)."""
        if not pids and record.get("missing_ranks"):
            record["unreached"] = (f"rank(s) {', '.join(map(str, record['missing_ranks']))} had not reported "
                                   f"a pid to the harness within {PID_WAIT_S:g} s; no process was signalled")
        return pids

    def lift(self) -> dict:
        """A heal fault: undo now what this family injected and can be undone; what was undone."""
        return {}

    def heal(self) -> dict:
        """The end of a launch: undo what must not outlive it; what was undone (possibly nothing)."""
        return {}
