"""The verdict vocabulary: a check's answer (``Check``), a run's answers (``Report``) and the stored
run the checks read (``Run``).

A check answers ``pass``, ``fail``, ``unknown`` (the run cannot tell) or ``n/a`` (it does not apply to
this scenario), with a sentence that says what was seen. The run's verdict is the worst of them:
``fail`` over ``unknown`` over ``pass``, ``n/a`` counting as nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ckpt_chaos.check.evidence import Evidence, Resume
from ckpt_chaos.check.history import (Exited, FaultFired, LaunchStarted, ProbeEvent, R, Record, of, read_history,
                                     trainer_events, trajectory_records)

if TYPE_CHECKING:
    from ckpt_chaos.scenario import Scenario

VERDICTS = ("pass", "fail", "unknown", "n/a")


@dataclass
class Check:
    name: str  # as shown: fault_1_surfaced, committed_survives@0, trajectory
    verdict: str  # pass | fail | unknown | n/a
    detail: str
    check: str = ""  # the same for every fault and subject: fault_surfaced, committed_survives, trajectory
    fault: int | None = None  # the fault it is about (its index in the scenario), if one
    at: str | None = None  # what it is about otherwise: a launch, a checkpoint, a view


# What a failing check follows from, first to last: the harness and the faults themselves; what the
# crash left on disk and in the remote tier; which checkpoint the relaunch took and what it restored;
# the training that followed; what the job made of it. A check not named here (retention, strays,
# timings, promises) is a fault of its own, put after the training and before the job's end.
CAUSAL = ("harness_ok", "no_hang", "fault_fired", "fault_landed",
          "committed_survives", "latest_valid", "committed_valid", "manifest_facts", "uploaded_durable",
          "remote_durable_complete", "final_durable", "restored_durable", "restored_in_place",
          "resumed_newest_valid", "resumed_newest", "never_loaded_torn", "no_torn_read", "resume_from",
          "loaded_equals_saved", "config_refused", "config_accepted", "resize_refused", "trajectory", "final_state",
          "lost_work")
OUTCOMES = ("fault_job_failed", "fault_sigterm_honoured", "job_completed")


def causal(checks: list) -> list:
    """``checks`` (``Check``s, or the dicts a result stores) in causal order (``CAUSAL``), the judge's
    order among equals: a failure's root first."""
    def rank(c) -> int:
        identity = (c.get("check") or c.get("name")) if isinstance(c, dict) else (c.check or c.name)
        if identity in CAUSAL:
            return CAUSAL.index(identity)
        return len(CAUSAL) + 1 + OUTCOMES.index(identity) if identity in OUTCOMES else len(CAUSAL)
    return sorted(checks, key=rank)


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    launches: int = 0
    steps_lost: int | None = None
    time_to_detect_s: float | None = None
    time_to_recover_s: float | None = None
    resumed_from: list[str] = field(default_factory=list)  # per relaunch: the checkpoint it loaded, or "scratch"
    # measured by the checks where the trainer reports none (a [command] trainer's saves)
    save_s: float | None = None
    save_stall_s: float | None = None
    timings_why: dict[str, str] = field(default_factory=dict)  # a timing column left empty -> why

    @property
    def verdict(self) -> str:
        """The worst check: fail > unknown > pass; n/a counts as nothing."""
        verdicts = {c.verdict for c in self.checks}
        return "fail" if "fail" in verdicts else "unknown" if "unknown" in verdicts else "pass"

    @property
    def reason(self) -> str:
        """The failure's cause in one line: the root failing check (``causal``'s first) with its detail,
        then the names of the checks that failed after it, whose details the checks themselves hold;
        where nothing failed, the checks that could not tell."""
        bad = causal([c for c in self.checks if c.verdict == "fail"]) or \
            causal([c for c in self.checks if c.verdict == "unknown"])
        if not bad:
            return ""
        root = f"{bad[0].name}: {bad[0].detail}" + (" (could not tell)" if bad[0].verdict == "unknown" else "")
        return root + (f" (and then {', '.join(c.name for c in bad[1:])})" if bad[1:] else "")

    def add(self, check: str, verdict: bool | str, detail: str, *, fault: int | None = None,
            at: object = None) -> None:
        """Record a check: ``verdict`` True/False for pass/fail, or one of VERDICTS."""
        if isinstance(verdict, bool):
            verdict = "pass" if verdict else "fail"
        if verdict not in VERDICTS:  # not an assert: a typo must not pass under python -O
            raise ValueError(f"check {check}: verdict {verdict!r} is none of {', '.join(VERDICTS)}")
        if at is not None:
            name, identity = f"{check}@{at}", check
        elif fault is not None:
            name, identity = f"fault_{fault}_{check}", f"fault_{check}"
        else:
            name, identity = check, check
        self.checks.append(Check(name, verdict, detail, identity, fault, None if at is None else str(at)))


@dataclass
class Run:
    """Everything a stored run says, indexed for the checks."""

    s: Scenario
    dir: Path
    golden: Path
    history: list[Record]
    events: list[dict]
    harness_errors: list[str] = field(default_factory=list)  # the harness's own, besides its history's

    @classmethod
    def load(cls, s: Scenario, run_dir: Path, golden: Path, harness_errors: list[str] | None = None) -> "Run":
        return cls(s, run_dir, golden, read_history(run_dir), trainer_events(run_dir), list(harness_errors or []))

    def records(self, cls: type[R], launch: int | None = None) -> list[R]:
        return of(self.history, cls, launch)

    def faults(self) -> list[FaultFired]:
        """The faults that acted; one that fired but reached none of its targets is not among them
        (``unreached``): the run holds nothing of its effect."""
        return [h for h in of(self.history, FaultFired) if not h.unreached]

    def unreached(self) -> list[FaultFired]:
        return [h for h in of(self.history, FaultFired) if h.unreached]

    def probes(self, point: str | None = None) -> list[ProbeEvent]:
        return [h for h in of(self.history, ProbeEvent) if point is None or h.point == point]

    def trainer(self, kind: str, launch: int | None = None) -> list[dict]:
        return [e for e in self.events if e["event"] == kind and (launch is None or e.get("attempt") == launch)]

    def launches(self) -> list[int]:
        ids = {h.launch for h in self.records(LaunchStarted)} | {e.get("attempt", 0) for e in self.events}
        if self.s.recovery.relaunch == "self":  # a worker group the trainer restarted: seen only in its processes' points
            ids |= {h.launch for h in self.probes()}
        return sorted(ids)

    def last_step(self, launch: int) -> int:
        steps = [r["step"] for r in trajectory_records(self.dir) if r.get("attempt") == launch]
        return max(steps, default=0)

    def resumed_from(self, launch: int) -> Resume:
        """Where launch ``launch`` resumed from: the one answer every check, diagnosis and report takes.
        The reference trainer says so in its events (``loaded``, ``fresh_start``); a ``[command]``
        trainer's comes from what its processes read and trained (``check/evidence.py``)."""
        if self.s.command is not None:
            return self.evidence.resumed_from(launch)
        loads = self.trainer("loaded", launch)
        if loads:
            return Resume(launch, True, loads[0]["name"], "the trainer reported loading it", loads[0]["step"] + 1)
        if self.trainer("fresh_start", launch):
            return Resume(launch, True, None, "the trainer reported a fresh start", 1)
        return Resume(launch, False, missing=f"launch {launch} reported neither a load nor a fresh start")

    @cached_property
    def evidence(self) -> Evidence:
        """What a ``[command]`` trainer's launches did to its checkpoint files (``check/evidence.py``)."""
        return Evidence(self)

    def exit_of(self, launch: int) -> Exited | None:
        return next(iter(self.records(Exited, launch)), None)

    def config(self, launch: int) -> dict:
        """The trainer keys a launch ran with: the scenario's, then its relaunch's ``recovery.changes``."""
        changes = self.s.recovery.changes
        return {**self.s.trainer, **(changes[launch - 1] if 0 < launch <= len(changes) else {})}


@dataclass(frozen=True)
class CheckSpec:
    """One check the checker declares: its name as ``Report.add`` names it (``fault_<name>`` for a
    check about one fault), when a run of a scenario that goes as the scenario expects gets a real
    verdict from it (not n/a; suite coverage goes by this), and the function that makes it, which
    may make others of the checks too."""

    name: str
    applies: Callable[[Scenario], bool]
    run: Callable[[Run, Report], None]


def first_few(problems: list[str], n: int = 3) -> str:
    """A failed check's detail: its first ``n`` problems, and how many more there are."""
    return "; ".join(problems[:n]) + (f" (and {len(problems) - n} more)" if len(problems) > n else "")
