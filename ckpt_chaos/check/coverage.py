"""What a set of scenarios covers: fault families, fault kinds, checks and setups.

The default suite is chosen to cover everything at least once (``tests/test_suites.py`` holds it
to that), so that the short CI run still exercises every fault kind, every check and every way
of running a job, and the full suite (every scenario) adds the variations. Coverage is judged
statically, from the scenario files and what the code declares, without running anything:

* families and kinds: the fault registry's (``ckpt_chaos/faults``);
* checks: every check the checker declares (``REFERENCE`` and ``COMMAND`` in ``ckpt_chaos/check/judge.py``) and the
  checks of each fault kind's exit and effect checks (its ``coverage``), named as ``Report.add``
  names them (``fault_<name>`` for a check about one fault);
* a scenario covers a check when the check gives it a real verdict, not n/a: each declaration
  says when, from the scenario's faults and expectations (``tests/test_suites.py`` holds the
  declarations to the names the code can emit);
* setups: what the run is built on: the cluster backend, the relaunch mode, the file system, the
  storage and proxy layers its faults need, a resume at another world size, an unprobed trainer,
  a remote tier, the trainer's retention and time-cadence options under each family of faults.

A rule claims a verdict only where the checker is sure to give one when the scenario runs as it
expects; ``benchmarks/suite_cover.py`` compares the rules with the verdicts of a stored run.
"""

from __future__ import annotations

from typing import Iterable

from ckpt_chaos.check.judge import COMMAND, REFERENCE, table
from ckpt_chaos.check.expected import relaunched
from ckpt_chaos.check.promises import refused_keys
from ckpt_chaos.faults import KINDS, families
from ckpt_chaos.probe.layout import FORMAT
from ckpt_chaos.scenario import BACKENDS, Fault, Scenario

Item = tuple[str, str]  # (axis, name): ("kind", "errno"), ("check", "fault_surfaced"), ("setup", "fs ext4")
CHECKER = "check/judge.py"


# ---- the checks -----------------------------------------------------------------------------------

def kind_checks() -> dict[str, frozenset[str]]:
    """Fault kind -> the checks its exit and effect checks make."""
    return {k.name: frozenset(k.coverage) for k in KINDS.values()}


def emitted_checks(tables: Iterable[tuple] = (REFERENCE, COMMAND)) -> dict[str, list[str]]:
    """Every check the code declares -> who declares it: the judge (its tables of ``tables``), or fault
    kinds."""
    out: dict[str, list[str]] = {c.name: [CHECKER] for t in tables for c in t}
    for k in KINDS.values():
        for name in k.coverage:
            out.setdefault(name, []).append(f"kind {k.name}")
    return out


def checks_of(s: Scenario) -> set[str]:
    """The checks that give the scenario a verdict (not n/a) when it runs as it expects."""
    out = {c.name for c in table(s) if c.applies(s)}
    for f in s.faults:
        out |= {name for name, applies in f.spec.coverage.items() if applies(s, f)}
    return out


# ---- setups and items ---------------------------------------------------------------------------

# Options of the reference trainer beyond the cadence in steps and keep_last, found unset by every
# scenario once (issue: what the suite misses): a bug behind one of them passed the whole catalogue.
CHECKPOINT_OPTIONS = ("keep_every", "keep_best", "ckpt_every_seconds", "async_save")


def setups_of(s: Scenario) -> set[str]:
    """What the scenario's run is built on."""
    out = {f"backend {s.cluster.backend}", f"relaunch {s.recovery.relaunch}", f"fs {s.storage.fs}"}
    out |= {f"needs {n}" for f in s.faults for n in f.needs}
    slurm = s.cluster.backend == "slurm"
    if s.resumed_world_size() != s.world_size:
        out.add("topology change under Slurm (sbatch --nodes=MIN-MAX)" if slurm else "topology change")
    if slurm:
        out |= {f"{family} faults under Slurm" for family in s.families if family != "scheduler"}
        if relaunched(s):
            out.add(f"requeued by {_slurm_requeuer(s)}")
    # the trainer's checkpoint options that decide what survives: each under each family of faults
    out |= {f"{option} under {family} faults" for option in CHECKPOINT_OPTIONS if s.trainer.get(option)
            for family in s.families}
    # a toxic on the upload link takes the uploader's error paths, one on the restore the trainer's
    out |= {f"toxic on the {f.params.link} link while {_phase(f.when.point)}"
            for f in s.faults if f.spec.on_link}
    # a launch that ends while a link stays broken leaves its uploads to the next one: a crash kills
    # the uploader with rank 0, a SIGTERM drains it for what is left of the grace period
    out |= {f"{g.kind} while the {f.params.link} link stays down" for i, f in enumerate(s.faults)
            if f.spec.on_link and f.params.keep for g in s.faults[i + 1:]
            if g.attempt == f.attempt and g.spec.ends_launch}
    # the uploader is a process of its own: killing it takes the trainer's respawn paths, not a relaunch:
    # mid-run the next hand-off replaces it, during the drain at the end of training the drain does
    out |= {f"{f.kind} of the uploader {'during the final drain' if _final_save(s, f) else 'mid-run'}"
            for f in s.faults if f.target == "uploader"}
    # where in a step a SIGTERM stops the job decides what the emergency checkpoint holds: before the
    # first optimizer step there is no optimizer state and no loss yet; on a step's last micro-batch
    # there is no partial step to fold, and on a cadence step the checkpoint is already written
    for f in s.faults:
        if f.spec.sigterm_grace and f.when.point == "microstep.end" and f.when.step is not None:
            if f.when.nth == s.trainer.get("grad_accum"):
                # on a cadence step the position to stop at is saved already; between them it is not
                every = s.trainer.get("ckpt_every_steps")
                cadence = bool(every) and f.when.step % every == 0
                where = "of a cadence step" if cadence else "between checkpoints"
                out.add(f"SIGTERM on a step's last micro-batch {where}")
            elif f.when.step == 1:
                out.add("SIGTERM before the first optimizer step")
    # each way of damaging each kind of file takes its own branch of the resume's validation; damage
    # before the commit meets the commit's checks instead, and damage after validation the load's
    out |= {f"{f.params.corruption} of {_file_class(f.params.file)}{_when_damaged(f)}"
            for f in s.faults if f.spec.corrupts_local}
    # the newest checkpoint damaged is one the resume must reject and quarantine, with a note it
    # cannot write on a disk that stays full (an older one may be gone to retention before that)
    if any(f.spec.corrupts_local and f.params.checkpoint == "newest" for f in s.faults) and any(
            f.spec.fills_disk and f.params.keep_full for f in s.faults):
        out.add("the newest checkpoint damaged on a disk that stays full")
    if s.recovery.changes:
        out.add("configuration changed on relaunch")
        # the resume's two ways with a changed configuration, by what the trainer declares: refuse one that
        # changes a field that shapes the trajectory before loading anything, or load and go on with one
        # that changes only fields a resume may take. Every field's own case is a scenario of the full
        # suite, generated from the declaration (ckpt_chaos/audit/changes.py).
        refused = refused_keys(s)
        out |= {"a field a resume must refuse changed on relaunch" if set(change) & refused else
                "only fields a resume may take changed on relaunch" for change in s.recovery.changes if change}
    # an older manifest format is validated with its own checksum, which no format-2 run reaches
    formats = {s.trainer.get("manifest_format", FORMAT)} | {c.get("manifest_format", FORMAT)
                                                           for c in s.recovery.changes}
    out |= {f"checkpoints of manifest format {fmt}" for fmt in formats if fmt != FORMAT}
    if not s.probe:
        out.add("unprobed trainer")
    if s.remote is not None:
        out.add("remote tier")
        if "storage" in s.families:
            out.add("storage faults with a remote tier")
        # local damage before the upload: the uploader's check of its objects must keep it off the remote tier
        if any(f.spec.corrupts_local for f in s.faults):
            out.add("a checkpoint damaged locally with a remote tier")
        # faultfs has no hard links (link() answers EROFS): the uploader stages its copies by copying
        if s.storage_spec().faultfs:
            out.add("a remote tier on a file system without hard links")
        # a SIGTERM leaves the uploads what is left of its grace period, not upload_drain_s
        if any(f.spec.sigterm_grace for f in s.faults):
            out.add("SIGTERM with a remote tier")
    return out


def _final_save(s: Scenario, f: Fault) -> bool:
    """The fault is aimed at the upload of the run's last checkpoint (only the drain hands it on)."""
    steps = s.trainer.get("max_steps")
    return steps is not None and f.when.name == f"step_{steps:08d}"


def _phase(point: str) -> str:
    if point in ("upload.verify", "upload.durable"):
        return "making a checkpoint durable"
    return ("uploading objects" if point.startswith("upload.") else
            "restoring" if point.startswith("remote.") else "training")


def _when_damaged(f: Fault) -> str:
    if f.params.checkpoint == "in_progress":
        return " before its commit"
    return " as its load begins" if f.when.point == "load.begin" else ""


def _file_class(glob: str) -> str:
    return {".metadata": "DCP metadata", "manifest.json": "the manifest"}.get(glob, "a shard")


def _slurm_requeuer(s: Scenario) -> str:
    """Who requeues the job after its first fault (``LaunchStarted.slurm.requeued_by``)."""
    first = s.faults[0] if s.faults else None
    if first is not None and first.spec.preempts:
        return "slurm" if s.expect.job_fails else "job"
    if first is not None and first.spec.slurm_requeues:
        return "slurm"
    # a storage fault first may only set the stage for a preemption
    if any(f.spec.preempts for f in s.faults):
        return "slurm" if s.expect.job_fails else "job"
    return "harness"


def items_of(s: Scenario) -> set[Item]:
    return ({("family", f) for f in s.families} | {("kind", k) for k in s.kinds}
            | {("check", c) for c in checks_of(s)} | {("setup", x) for x in setups_of(s)})


def universe(catalogue: Iterable[Scenario]) -> set[Item]:
    """What a suite must cover: every family, kind, check and backend in the code, and every other
    setup the catalogue uses; the checks of the judge's tables its trainers get."""
    catalogue = list(catalogue)
    tables = {id(t): t for t in map(table, catalogue)}.values()
    return ({("family", f) for f in families()} | {("kind", k) for k in KINDS}
            | {("check", c) for c in emitted_checks(tables)} | {("setup", f"backend {b}") for b in BACKENDS}
            | {("setup", x) for s in catalogue for x in setups_of(s)})


def coverage(scenarios: Iterable[Scenario]) -> dict[Item, list[str]]:
    """Item -> the scenarios that cover it."""
    out: dict[Item, list[str]] = {}
    for s in scenarios:
        for item in items_of(s):
            out.setdefault(item, []).append(s.name)
    return out
