"""Checks that hold a trainer to its own promises, derived from what it declares rather than from
one hand-picked case:

* ``retention``: after every retention pass, at every crash and at the end, the checkpoints kept are
  exactly what the declared policy promises: the last ``keep_last`` valid ones are all there (no
  fewer), and at the end nothing is kept that neither they, the milestones (``keep_every``) nor the
  best (``keep_best``) account for (no more); ``retention_kept`` holds the milestones and the best
  across every launch;
* ``config_refused`` / ``config_accepted`` (made in checks.py): which keys a relaunch must refuse to
  change is what the trainer declares (``refused_keys``), and ``relaunch_cases`` generates, for every
  field it declares, the relaunch that changes it;
* ``committed_kept``: a checkpoint once committed leaves the checkpoint folder only through retention,
  and one a load rejected is kept aside (``rejected/``) with its reason;
* ``save_failure_policy``: a save the trainer reports failed under ``on_save_failure = stop`` (the
  policy each ``save_failed`` event names) ends its launch with a non-zero status and no step after
  it: a scheduler must not take a job that lost its checkpoint for one that finished.

The policy is the trainer's: a probed trainer's as its profile declares it (``ckpt_chaos.probe.profile``:
its fields, defaults and retention, with the keys each launch ran with); a ``[command]`` trainer's as
its scenario declares it (``command.keep_last``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckpt_chaos.check.history import Exited, kept_aside, named
from ckpt_chaos.check.verdict import Report, Run, first_few, trajectory_records
from ckpt_chaos.probe.layout import parse_name
from ckpt_chaos.probe.profile import profile_of

if TYPE_CHECKING:
    from ckpt_chaos.scenario import Scenario


# ---- what the trainer declares ----------------------------------------------------------------------

def carries_manifest(s: Scenario) -> bool:
    """The scenario's trainer declares checkpoints with the reference layout's manifest."""
    p = profile_of(s)
    return p is not None and p.manifest


def declared_fields(s: Scenario) -> dict[str, bool]:
    """Every configuration field the trainer declares, and whether a resume must refuse a change of it
    (it shapes the trajectory) or may accept one, as its profile says. A [command] trainer's relaunch
    cannot change its configuration (its argv is its configuration), so it declares none."""
    p = profile_of(s)
    return dict(p.fields) if p is not None else {}


def refused_keys(s: Scenario) -> set[str]:
    """The keys a relaunch must refuse to change: the scenario's ``expect.refused`` and every field the
    trainer declares shapes the trajectory."""
    return set(s.expect.refused) | {k for k, refused in declared_fields(s).items() if refused}


def refusal_problems(rc: int | None, instead: list[str], part: str | None, refused: list[str]) -> list[str]:
    """What a relaunch that had to refuse ``refused`` did otherwise, for ``config_refused`` of either
    checker: it exited 0 (or was killed), did ``instead`` (resumed, trained), or its part of
    torchrun.log (``part``; None: not told apart) names none of the keys."""
    problems = [f"it exited with status {rc}"] if rc == 0 or rc is None else []
    problems += instead
    if part is None:
        problems.append("its part of torchrun.log could not be told apart")
    elif not named(part, refused):
        problems.append(f"its output names none of {', '.join(refused)}")
    return problems


@dataclass(frozen=True)
class Policy:
    """What retention promises to keep: the last ``keep_last`` valid checkpoints, each step a multiple of
    ``keep_every`` (whole steps only), and the one with the lowest loss (``keep_best``)."""

    keep_last: int
    keep_every: int = 0
    keep_best: bool = False

    def milestone(self, name: str) -> bool:
        step, micro = parse_name(name) or (0, 1)
        return self.keep_every > 0 and micro == 0 and step % self.keep_every == 0

    def __str__(self) -> str:
        return ", ".join([f"keep_last={self.keep_last}"] + ([f"keep_every={self.keep_every}"] if self.keep_every
                                                            else []) + (["keep_best"] if self.keep_best else []))


def policy(run: Run, launch: int) -> Policy | None:
    """The retention policy launch ``launch`` ran with; None where the trainer declares none."""
    if run.s.command is not None:
        keep = run.s.command.keep_last
        return None if keep is None else Policy(keep)
    p = profile_of(run.s)
    kept = p.retention({**p.defaults, **run.config(launch)}) if p is not None else None
    return None if kept is None else Policy(kept.keep_last, kept.keep_every, kept.keep_best)


# ---- what was committed -------------------------------------------------------------------------------

@dataclass
class Commit:
    name: str
    t: float
    launch: int
    loss: float | None = None
    damaged: bool = False  # a fault damaged it on purpose since


def _lost_disks(run: Run) -> list[float]:
    return [h.t for h in run.faults() if run.s.faults[h.index].spec.loses_disk]


def _damaged(run: Run) -> dict[str, list[float]]:
    """Local checkpoints a fault damaged on purpose -> each time one did (a name committed again by a
    relaunch can be damaged again)."""
    out: dict[str, list[float]] = {}
    for h in run.faults():
        if run.s.faults[h.index].spec.damages and not h.detail.get("remote"):
            out.setdefault(h.detail.get("checkpoint"), []).append(h.t)
    return out


def commits(run: Run) -> list[Commit]:
    """Every commit, in time order: the trainer said so (``committed``), or its commit rename happened (the
    probe's ``ckpt.commit``: a launch killed before it could say so), or it restored one from the remote
    tier; one commit per checkpoint and launch, at the earliest of those times."""
    found: dict[tuple[str, int], Commit] = {}
    said = [(e["name"], e.get("t", 0), e.get("attempt", 0), e.get("loss"))
            for e in run.trainer("committed") + run.trainer("restored_from_remote")]
    renamed = [(h.info["name"], h.t, h.launch, None) for h in run.probes("ckpt.commit") if "name" in h.info]
    for name, t, launch, loss in said + renamed:
        c = found.setdefault((name, launch), Commit(name, t, launch, loss))
        c.t, c.loss = min(c.t, t), c.loss if c.loss is not None else loss
    return sorted(found.values(), key=lambda c: c.t)


def ledger(run: Run, until: float = float("inf"), damaged_out: bool = True) -> dict[str, Commit]:
    """The checkpoints retention answers for at time ``until``: each one committed (or restored from the
    remote tier) by then, by its latest commit, less those out of its reach since: rejected by a load,
    lost with the disk, or (``damaged_out``) damaged by a fault. A damaged one still takes its place among
    the newest until a load rejects it: retention does not validate again what it counts."""
    out: dict[str, Commit] = {}
    for c in commits(run):
        if c.t > until:
            break
        loss = c.loss if c.loss is not None else out[c.name].loss if c.name in out else None
        out[c.name] = dataclasses.replace(c, loss=loss)
    rejected = [(e["name"], e.get("t", 0)) for e in run.trainer("ckpt_rejected")]
    damaged = _damaged(run)
    for name, c in list(out.items()):
        c.damaged = any(c.t <= t <= until for t in damaged.get(name, []))
        if any(c.t <= t <= until for t in _lost_disks(run)) or any(
                n == name and c.t <= t <= until for n, t in rejected) or (damaged_out and c.damaged):
            del out[name]
    return out


def _newest(held: dict[str, Commit], k: int) -> list[str]:
    return sorted(held, key=parse_name, reverse=True)[:max(k, 0)]


def _best(held: dict[str, Commit]) -> set[str]:
    scored = {n: c.loss for n, c in held.items() if c.loss is not None}
    return {n for n, loss in scored.items() if loss == min(scored.values())} if scored else set()


# ---- retention ----------------------------------------------------------------------------------------

def _owed_last(run: Run, until: float, keep_last: int) -> list[str]:
    """The last ``keep_last`` checkpoints at time ``until`` that must be there: the newest ones, less any a
    fault damaged in place (which still takes its place among them)."""
    held = ledger(run, until, damaged_out=False)
    return [n for n in _newest(held, keep_last) if not held[n].damaged]


def _pruning_chances(run: Run) -> list[float]:
    """When the trainer's retention could prune: a pass it reported (``retention``, or the probe's
    ``ckpt.retention``), or a commit its launch outlived (it logged again after it): the reference
    trainer and its kind prune right after a commit, in the same process."""
    events = sorted(run.events, key=lambda e: e.get("t", 0))
    outlived = [c.get("t", 0) for c in run.trainer("committed")
                if any(e.get("attempt") == c.get("attempt") and e.get("t", 0) > c.get("t", 0) for e in events)]
    return sorted([e.get("t", 0) for e in run.trainer("retention")]
                  + [h.t for h in run.probes("ckpt.retention")] + outlived)


def _pushed_out(ranked: dict[str, Commit], name: str, keep_last: int) -> float | None:
    """When ``name`` left the newest ``keep_last``: the commit of the newer checkpoint that pushed it out."""
    newer = sorted((c for n, c in ranked.items() if parse_name(n) > parse_name(name)), key=lambda c: parse_name(c.name))
    return newer[keep_last - 1].t if keep_last >= 1 and len(newer) >= keep_last else None


def _retention(run: Run, report: Report) -> None:
    problems: list[str] = []
    for e in run.trainer("retention"):
        launch = e.get("attempt", 0)
        p = policy(run, launch)
        if p is None:
            continue
        last = _owed_last(run, e.get("t", 0), p.keep_last)
        gone = [n for n in e.get("deleted", []) if n in last]
        if gone:
            problems.append(f"a retention pass of launch {launch} deleted {', '.join(gone)}, one of the last "
                            f"{p.keep_last} valid checkpoints {p} promises ({', '.join(last)})")
    exits = run.records(Exited)
    for ex in exits:
        held = ledger(run, ex.t, damaged_out=False)
        p = policy(run, max(held.values(), key=lambda c: c.t).launch) if held else None
        if p is None:
            continue
        last = _owed_last(run, ex.t, p.keep_last)
        kept = {n for n, why in ex.snapshot["checkpoints"].items() if why is None}
        missing = [n for n in last if n not in kept]
        if missing:
            problems.append(f"after launch {ex.launch} kept {len(last) - len(missing)} of the last {len(last)} valid "
                            f"checkpoints keep_last={p.keep_last} promises: missing {', '.join(missing)}")
    final = exits[-1] if exits and exits[-1].rc == 0 and run.trainer("finished") else None
    excused: list[str] = []
    held = ledger(run)
    p = policy(run, max(held.values(), key=lambda c: c.t).launch) if held else None
    if final is not None and p is not None:
        ranked = ledger(run, damaged_out=False)
        promised = set(_newest(ranked, p.keep_last)) | {n for n in held if p.milestone(n)}
        promised |= _best(held) if p.keep_best else set()
        extra = sorted(n for n in final.snapshot["checkpoints"] if n not in promised
                       and not (n in ranked and ranked[n].damaged))
        # Kept one too many is a broken promise only once retention had its chance: a crash between a
        # commit and its pruning, then no save that succeeded, leaves the older one there, as any
        # trainer that prunes after its saves would.
        chances = _pruning_chances(run)
        owed = [n for n in extra if n not in ranked or (out := _pushed_out(ranked, n, p.keep_last)) is None
                or any(t >= out for t in chances)]
        excused = [n for n in extra if n not in owed]
        extra = owed
        if extra:
            problems.append(f"kept {', '.join(extra)} at the end, which no promise of {p} accounts for "
                            f"(it promises {', '.join(sorted(promised, key=parse_name)) or 'nothing'})")
    kept = sorted(final.snapshot["checkpoints"]) if final is not None else []
    if problems:
        report.add("retention", False, first_few(problems))
    elif final is None:
        return  # the last K held at every crash; what the end keeps is not known
    elif p is None and kept and not run.trainer("committed"):
        report.add("retention", "unknown", f"kept {', '.join(kept)}, but the trainer reported no commit: what "
                   "retention owes is not known")
    elif p is None:
        report.add("retention", True, "nothing committed, nothing kept")
    elif excused:
        report.add("retention", True, f"kept {', '.join(kept) or 'nothing'}: what {p} promises, and "
                   f"{', '.join(excused)}, which no retention pass had the chance to delete (none ran after the "
                   f"commit that made it one too many); the last {p.keep_last} valid at every retention pass and crash")
    else:
        report.add("retention", True, f"kept {', '.join(kept) or 'nothing'}: exactly what {p} promises, and the "
                   f"last {p.keep_last} valid at every retention pass and crash")


def final_directory(run: Run, report: Report) -> None:
    """The checkpoint folder at the end: no strays, and what retention keeps, as promised (for a
    ``[command]`` trainer, what ``command.keep_last`` promises: ``command_retention``)."""
    if run.s.command is not None:
        command_retention(run, report)
        return
    exits = run.records(Exited)
    if not exits or exits[-1].rc != 0:
        _retention(run, report)  # the last K at every crash still holds
        return
    snap = exits[-1].snapshot
    report.add("no_strays", not snap["strays"], "no temporary, trash or other hidden directories left"
               if not snap["strays"] else f"left behind after recovery: {', '.join(snap['strays'])}")
    _retention(run, report)
    p = policy(run, exits[-1].launch)
    if p is not None and (p.keep_every or p.keep_best):
        _retention_kept(run, report, snap, p)


def _retention_kept(run: Run, report: Report, snap: dict, p: Policy) -> None:
    """What retention promises to keep is there at the end, across every launch: each milestone
    committed (``keep_every``) and the committed checkpoint with the lowest loss (``keep_best``).
    A checkpoint a fault damaged on purpose, or one the resume rejected, is not retention's to keep."""
    committed = {e["name"]: e for e in run.trainer("committed")}
    damaged = set(_damaged(run))
    rejected = {e["name"] for e in run.trainer("ckpt_rejected")}
    kept = {n for n, why in snap["checkpoints"].items() if why is None}
    owed = {n: "a milestone" for n in committed if p.milestone(n)}
    scored = {n: e["loss"] for n, e in committed.items() if e.get("loss") is not None}
    if p.keep_best and scored:
        best = min(scored, key=lambda n: (scored[n], n))
        owed[best] = f"the lowest loss committed ({scored[best]:.4f})"
    out_of_reach = {n for n in owed if n in damaged or n in rejected}
    missing = {n: why for n, why in owed.items() if n not in kept and n not in out_of_reach}
    if not owed:
        report.add("retention_kept", "unknown", "no milestone or scored checkpoint was committed: nothing to hold")
    elif missing:
        deleted = {n for r in run.trainer("retention") for n in r.get("deleted", [])}
        report.add("retention_kept", False, "; ".join(
            f"{n}, {why}, is not kept{' (retention deleted it)' if n in deleted else ''}"
            for n, why in sorted(missing.items())) + f"; kept: {', '.join(sorted(kept)) or 'nothing'}")
    else:
        report.add("retention_kept", True, "kept " + ", ".join(f"{n} ({why})" for n, why in sorted(owed.items())
                                                              if n not in out_of_reach))


def command_retention(run: Run, report: Report) -> None:
    """A [command] trainer that declares ``command.keep_last`` K keeps, when the job has finished, exactly
    the newest K of the checkpoints it wrote (those ``command.complete`` matches, ordered by the step each
    holds: ``Evidence.saved_steps``), no more and no fewer."""
    p, ev = policy(run, 0), run.evidence
    exits = run.records(Exited)
    if p is None or not exits or exits[-1].rc != 0 or exits[-1].complete is None:
        return
    from fnmatch import fnmatch

    final = {ev.checkpoint_of(path) for path in exits[-1].complete} - {None}
    steps = ev.saved_steps()
    written = final | {c for c in steps if fnmatch(c.split("/", 1)[-1], str(run.s.command.complete))}
    unknown = sorted(c for c in written if c not in steps)
    if unknown:
        report.add("retention", "unknown", f"which step {', '.join(unknown)} hold(s) is not known (no write of it "
                   "was seen), so the newest checkpoints cannot be told apart")
        return
    newest = sorted(written, key=lambda c: (steps[c], c), reverse=True)[:p.keep_last]
    missing, extra = [c for c in newest if c not in final], sorted(final - set(newest))
    problems = ([f"kept {len(newest) - len(missing)} of the last {len(newest)} checkpoints keep_last={p.keep_last} "
                 f"promises: missing {', '.join(missing)}"] if missing else []) + (
        [f"kept {', '.join(extra)}, older than the last {p.keep_last}"] if extra else [])
    report.add("retention", not problems, "; ".join(problems) or
               f"kept {', '.join(sorted(final))}: the last {len(newest)} of the {len(written)} it wrote, as "
               f"keep_last={p.keep_last} promises")


# ---- committed data -----------------------------------------------------------------------------------

def committed_kept(run: Run, report: Report) -> None:
    """Every checkpoint the trainer committed is in the checkpoint folder at the end, or its absence is
    explained: a retention pass deleted it, a load rejected it and it is kept aside in ``rejected/`` with
    its reason, a later save of the same step superseded it (kept aside too), or its disk was lost or its
    power cut (committed_survives judges what must survive those)."""
    exits = run.records(Exited)
    if not exits or exits[-1].rc != 0 or not run.trainer("finished"):
        return
    snap = exits[-1].snapshot
    done = commits(run)
    if not done:
        if snap["checkpoints"]:
            report.add("committed_kept", "unknown", "the trainer reported no commit: what it owes is not known")
        return
    aside = snap.get("rejected")
    if aside is None and (run.dir / "checkpoints").is_dir():
        # a run stored before the snapshots listed rejected/: its checkpoint folder as the run left it
        aside = kept_aside(run.dir / "checkpoints")
    # what a retention pass deleted, as the trainer said, or as its probe point did before a crash could
    deletions = [(n, e.get("t", 0)) for e in run.trainer("retention") for n in e.get("deleted", [])]
    deletions += [(n, h.t) for h in run.probes("ckpt.retention") for n in h.info.get("deleted", [])]
    rejections = run.trainer("ckpt_rejected")
    noted_elsewhere = {e.get("name") for e in run.trainer("quarantine_note_failed")}
    # a power cut or a lost disk explains a checkpoint only if it was gone right after that launch
    cuts = []
    for h in run.faults():
        spec, ex = run.s.faults[h.index].spec, run.exit_of(h.launch)
        if (spec.loses_unsynced or spec.loses_disk) and ex is not None:
            cuts.append((h.t, set(ex.snapshot["checkpoints"])))
    counts = {"kept": 0, "removed by retention": 0, "kept aside": 0, "lost to a fault": 0}
    problems: list[str] = []
    unknown: list[str] = []
    for i, c in enumerate(done):
        name, t = c.name, c.t
        nxt = next((d.t for d in done[i + 1:] if d.name == name), None)
        end = float("inf") if nxt is None else nxt
        held = sorted(d for d in (aside or {}) if d.rpartition(".")[0] == name)
        rejected = [r for r in rejections if r["name"] == name and t <= r.get("t", 0) < end]
        if nxt is None and name in snap["checkpoints"]:
            counts["kept"] += 1
        elif any(n == name and t <= d < end for n, d in deletions):
            counts["removed by retention"] += 1
        elif rejected:
            reason = rejected[0].get("reason", "no reason given")
            if aside is None:
                unknown.append(f"{name} was rejected ({reason}), but neither the run's snapshots (stored by an "
                               "older ckpt-chaos) nor its folder list rejected/: whether it was kept aside is not known")
            elif not held:
                problems.append(f"{name}, committed by launch {c.launch}, was rejected on load "
                                f"({reason}) and is gone: not kept aside in rejected/ with its reason, so a "
                                "transient read error destroys a checkpoint for good")
            elif not any(aside[d] for d in held) and name not in noted_elsewhere:
                problems.append(f"{name} was rejected on load ({reason}) and moved to rejected/{held[-1]} "
                                "without its reason")
            else:
                counts["kept aside"] += 1
        elif nxt is not None and held:
            counts["kept aside"] += 1  # superseded by a new save of the same step
        elif any(t <= x < end and name not in after for x, after in cuts):
            counts["lost to a fault"] += 1
        else:
            problems.append(f"{name}, committed by launch {c.launch}, is gone at the end: no retention pass "
                            "reported deleting it and no load rejected it")
    if problems:
        report.add("committed_kept", False, first_few(problems))
    elif unknown:
        report.add("committed_kept", "unknown", first_few(unknown))
    else:
        report.add("committed_kept", True, f"{len(done)} commit(s), each accounted for: "
                   + ", ".join(f"{n} {what}" for what, n in counts.items() if n))


# ---- configuration on relaunch: the cases, generated --------------------------------------------------

# Fields of the reference trainer that no relaunch of a scenario can change meaningfully, with why; every
# other declared field gets a generated case.
UNCHANGEABLE = {
    "run_dir": "set by the harness",
    "ckpt_dir": "a relaunch pointed at another folder finds no checkpoint to resume or refuse",
    "device": "the only other values need a GPU or are the default's own choice",
    "stop_after_microbatches": "a relaunch that stops early on purpose never finishes the job",
    "on_save_failure": "changes only what a failed save does, and no save fails in the base scenario",
    "remote_url": "needs a [remote] tier", "remote_endpoint": "needs a [remote] tier",
    "remote_timeout_s": "needs a [remote] tier", "remote_keep_last": "needs a [remote] tier",
    "upload_retries": "needs a [remote] tier", "upload_backoff_s": "needs a [remote] tier",
    "upload_drain_s": "needs a [remote] tier",
}


@dataclass(frozen=True)
class RelaunchCase:
    field: str
    value: Any
    refused: bool
    scenario: Any  # a Scenario: the base with this one change on its first relaunch


def _candidates(value: Any) -> list[Any]:
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value * 2, value + 1, value - 1]
    if isinstance(value, float):
        return [value / 2, value * 2, value + 1.0] if value else [0.5, 1.0]
    return []


def changed_value(s: Scenario, key: str) -> Any:
    """A value of ``key`` other than the one the scenario's trainer runs with, valid at every world size
    the scenario uses; None where none is found."""
    p = profile_of(s)
    if p is None:
        return None
    base = {**p.defaults, **s.trainer}
    for v in (c for c in _candidates(base[key]) if c != base[key]):
        try:
            for world in {s.world_size, s.resumed_world_size()}:
                p.validate({**base, key: v}, world)
        except ValueError:
            continue
        return v
    return None


def relaunch_cases(base: Scenario) -> tuple[list[RelaunchCase], dict[str, str]]:
    """One relaunch case per field the trainer declares: ``base`` (a scenario whose first relaunch
    resumes) with that field changed on its first relaunch, expected refused or accepted as declared;
    and the fields left out, with why."""
    cases, left_out = [], {}
    for key, refused in declared_fields(base).items():
        if key in UNCHANGEABLE:
            left_out[key] = UNCHANGEABLE[key]
            continue
        value = changed_value(base, key)
        if value is None:
            left_out[key] = "no other valid value was found"
            continue
        s = dataclasses.replace(
            base, name=f"{base.name}--{key}", faults=list(base.faults),
            recovery=dataclasses.replace(base.recovery, changes=[{key: value}], max_restarts=max(2, base.recovery.max_restarts)),
            expect=dataclasses.replace(base.expect, refused=[key] if refused else []))
        cases.append(RelaunchCase(key, value, refused, s))
    return cases, left_out


def save_failure_policy(run: Run, report: Report) -> None:
    """Each save reported failed with policy ``stop`` ended its launch: a non-zero exit status, and no
    step trained after the report. A launch with no recorded exit is not judged."""
    failed = [e for e in run.trainer("save_failed") if e.get("policy") == "stop"]
    if not failed:
        return
    steps = trajectory_records(run.dir)
    problems, judged = [], 0
    for e in failed:
        launch = e.get("attempt")
        ex = run.exit_of(launch)
        if ex is None or ex.rc is None:
            continue
        judged += 1
        after = [r["step"] for r in steps if r.get("attempt") == launch and r.get("t", 0) > e.get("t", 0)]
        what = f"save {e.get('name')} ({e.get('reason')}) failed under on_save_failure = stop"
        if ex.rc == 0:
            problems.append(f"{what}, but launch {launch} exited with status 0: a failed checkpoint reported as a "
                            "clean end" + (f", after training on to step {max(after)}" if after else ""))
        elif after:
            problems.append(f"{what}, but launch {launch} trained on to step {max(after)} before it exited "
                            f"(status {ex.rc})")
    if judged:
        report.add("save_failure_policy", not problems,
                   f"{judged} save(s) failed under on_save_failure = stop, each ending its launch with a non-zero "
                   "status and no further step" if not problems else first_few(problems))
