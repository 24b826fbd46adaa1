"""The audit's stop-and-relaunch run: before the suite is generated around it, the trainer is stopped
between two saves (every rank SIGKILLed, the ``kill`` family's scenario) and relaunched as every
scenario will relaunch it, to see whether it resumes at all, from which checkpoint, and what the
resume reads, in which order.

A trainer that does not resume on its relaunch command (a ``--resume`` flag it needs, a checkpoint
folder it does not look in) would fail every scenario of the suite on lost work; the audit says so in
one line, with the fix, instead of running them. What it reads is the file evidence every check uses
(``check/evidence.py``: the probe layer's and fanotify's reads of the relaunch).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ckpt_chaos.audit.discover import Profile
from ckpt_chaos.audit.generate import Generated, generate, write


@dataclass
class Relaunch:
    """What the relaunch after a stop did."""

    scenario: str
    run_dir: str
    decided: bool
    """Whether the run's evidence tells where it resumed from (else ``missing`` says why)."""
    resumed_from: str | None = None
    """The checkpoint it resumed from; None where it started over."""
    first_step: int | None = None
    reads: list[str] = field(default_factory=list)
    """The checkpoint files it read, in the order it first read each."""
    how: str = ""
    missing: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def scenario(p: Profile) -> Generated | None:
    """The ``kill`` family's scenario of ``p`` (every rank killed between two saves), or None where the
    first save is the one its faults aim at: then no checkpoint is there to resume from."""
    kill = [g for g in generate(p, ("kill",)) if not g.left_out]
    return kill[0] if kill and len(p.saves) > 1 else None


def stop_and_relaunch(p: Profile, folder: Path, golden_root: Path) -> Relaunch | None:
    """Run the stop-and-relaunch scenario into ``folder`` and read what its relaunch did; None where
    ``scenario`` gives none."""
    from ckpt_chaos.check.verdict import Run
    from ckpt_chaos.run.command import golden_run
    from ckpt_chaos.run.runner import run_scenario
    from ckpt_chaos.scenario import load

    g = scenario(p)
    if g is None:
        return None
    path = write([g], folder / "scenario")[0]
    s = load(path)
    result = run_scenario(s, folder / "runs", golden_root)
    run = Run.load(s, Path(result.run_dir), golden_run(s, golden_root))
    if 1 not in run.launches():
        return Relaunch(g.name, result.run_dir, False, missing=f"no relaunch came: {result.reason or result.verdict}")
    resume = run.evidence.resumed_from(1)
    reads = list(dict.fromkeys(r.path for r in sorted(run.evidence.reads(1), key=lambda r: r.t)))
    return Relaunch(g.name, result.run_dir, resume.decided, resume.checkpoint, resume.first_step, reads,
                    resume.how, resume.missing)


def never_resumed(p: Profile, r: Relaunch) -> str | None:
    """Why the audit stops here, in one line with the fix, where the relaunch started over although a
    whole checkpoint was there; else None (a relaunch whose resume the evidence cannot tell goes on:
    the suite's checks say ``unknown`` where it matters)."""
    if not r.decided or r.resumed_from is not None:
        return None
    relaunch = " ".join(p.command.get("relaunch_argv") or p.command["argv"])
    return (f"the trainer never resumed: stopped after its save of {p.saves[0].entry or 'step ' + str(p.saves[0].step)}, "
            f"its relaunch ({relaunch}) trained from step {r.first_step or 1} again ({r.how}); "
            "give what makes it resume on a relaunch with --relaunch-args (relaunch_args in "
            "[tool.ckpt-chaos.audit]), or check that it looks for checkpoints in {ckpt_dir}; the run: " + r.run_dir)


def describe(r: Relaunch | None) -> list[str]:
    if r is None:
        return ["relaunch: not tried (the first save is the one the faults aim at: nothing to resume from)"]
    if not r.decided:
        return [f"relaunch after a stop: where it resumed from is not known: {r.missing}"]
    head = (f"relaunch after a stop: resumed from {r.resumed_from} ({r.how})" if r.resumed_from
            else f"relaunch after a stop: started over ({r.how})")
    return [head] + ([f"  it read, in order: {', '.join(r.reads)}"] if r.reads else [])
