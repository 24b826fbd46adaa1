"""What a run of a scenario gives when it goes as the scenario expects: whether a launch fails, a
relaunch follows and resumes, and which faults share a launch. The rules of when a check gives a
verdict (the judge's tables, each fault kind's ``coverage``) are made of these."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckpt_chaos.scenario import Fault, Scenario


def ends_launch(s: Scenario) -> bool:
    """The faulted launch fails."""
    return s.expect.job_fails is True or (s.expect.job_fails is None and any(f.ends_launch for f in s.faults))


def relaunched(s: Scenario) -> bool:
    """A launch fails and another one follows."""
    return ends_launch(s) and s.recovery.relaunch != "none" and s.recovery.max_restarts >= 1


def resumed(s: Scenario) -> bool:
    """The first relaunch loads a checkpoint (the scenario names it)."""
    return relaunched(s) and s.expect.resume_from is not None


def harness_relaunch(s: Scenario) -> bool:
    """The harness relaunches, with a snapshot of the disk between launches (torchrun takes none)."""
    return relaunched(s) and s.recovery.relaunch == "harness"


def _index(s: Scenario, f: Fault) -> int:
    return next(i for i, g in enumerate(s.faults) if g is f)  # two faults may be equal


def faults_after(s: Scenario, f: Fault) -> list[Fault]:
    """The faults of the same launch written after ``f`` (scenarios write them in firing order)."""
    return [g for g in s.faults[_index(s, f) + 1:] if g.attempt == f.attempt]


def faults_before(s: Scenario, f: Fault) -> list[Fault]:
    return [g for g in s.faults[:_index(s, f)] if g.attempt == f.attempt]
