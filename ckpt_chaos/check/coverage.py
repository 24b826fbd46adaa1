"""What a set of scenarios covers: fault families, fault kinds, checks and setups.

The default suite is chosen to cover everything at least once (``tests/test_suites.py`` holds it
to that), so that the short CI run still exercises every fault kind, every check and every way
of running a job, and the full suite (every scenario) adds the variations. Coverage is judged
statically, from the scenario files and the code, without running anything:

* families and kinds: the fault registry's (``ckpt_chaos/faults``);
* checks: every name the checker can emit, read from the source: each ``report.add("name", ...)``
  in ``ckpt_chaos/check/checks.py``, and in the exit and effect checks of each fault kind (and the
  functions of its module they call), named as ``Report.add`` names them (``fault_<name>`` for a
  check about one fault);
* a scenario covers a check when the check gives it a real verdict, not n/a. ``APPLIES`` (and
  ``APPLIES_TO_FAULT`` for the checks of a fault kind) says so for each check, from the scenario's
  faults and expectations; a check without a rule is reported, so none goes unexercised unnoticed;
* setups: what the run is built on: the cluster backend, the relaunch mode, the file system, the
  storage and proxy layers its faults need, a resume at another world size, an unprobed trainer,
  a remote tier, the trainer's retention and time-cadence options under each family of faults.

A rule claims a verdict only where the checker is sure to give one when the scenario runs as it
expects; ``benchmarks/suite_cover.py`` compares the rules with the verdicts of a stored run.
"""

from __future__ import annotations

import ast
import importlib
from functools import cache
from pathlib import Path
from typing import Callable, Iterable

from ckpt_chaos.faults import KINDS, families
from ckpt_chaos.probe.layout import FORMAT
from ckpt_chaos.scenario import BACKENDS, Fault, Scenario

Item = tuple[str, str]  # (axis, name): ("kind", "errno"), ("check", "fault_surfaced"), ("setup", "fs ext4")
CHECKER = "ckpt_chaos.check.checks"


# ---- the checks the code can emit ---------------------------------------------------------------

@cache
def _module(name: str) -> tuple[str, dict[str, ast.FunctionDef], ast.Module]:
    path = Path(importlib.import_module(name).__file__)
    tree = ast.parse(path.read_text())
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    return f"{path.parent.name}/{path.name}", funcs, tree


def _added(node: ast.AST, where: str) -> set[str]:
    """The check names of every ``report.add(...)`` under ``node``, as ``Report.add`` names them."""
    names = set()
    for n in ast.walk(node):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "add"
                and isinstance(n.func.value, ast.Name) and n.func.value.id == "report"):
            continue
        first = n.args[0] if n.args else None
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            raise ValueError(f"{where}:{n.lineno}: report.add whose check name is not a string literal: "
                             "write the name out, so that suite coverage can see it")
        keys = {k.arg for k in n.keywords}
        names.add(first.value if "at" in keys or "fault" not in keys else f"fault_{first.value}")
    return names


def _reachable(module: str, func: str) -> set[str]:
    """Checks added by ``func`` and by the functions of its module it calls, at any depth."""
    where, funcs, _ = _module(module)
    seen, todo, names = set(), [func], set()
    while todo:
        f = todo.pop()
        if f in seen or f not in funcs:
            continue
        seen.add(f)
        names |= _added(funcs[f], where)
        todo += [n.func.id for n in ast.walk(funcs[f]) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    return names


@cache
def kind_checks() -> dict[str, frozenset[str]]:
    """Fault kind -> the checks its exit and effect checks can emit."""
    return {k.name: frozenset().union(*(_reachable(h.__module__, h.__name__)
                                        for h in (k.exit_check, k.effect_check) if h is not None))
            for k in KINDS.values()}


@cache
def emitted_checks() -> dict[str, list[str]]:
    """Every check name the checker can emit -> where it comes from: the checker, or fault kinds."""
    where, _, tree = _module(CHECKER)
    out: dict[str, list[str]] = {name: [where] for name in _added(tree, where)}
    for kind, names in kind_checks().items():
        for name in names:
            out.setdefault(name, []).append(f"kind {kind}")
    return out


# ---- when a check gives a verdict ---------------------------------------------------------------

def _ends_launch(s: Scenario) -> bool:
    return s.expect.job_fails is True or (s.expect.job_fails is None and any(f.ends_launch for f in s.faults))


def _relaunched(s: Scenario) -> bool:
    """A launch fails and another one follows."""
    return _ends_launch(s) and s.recovery.relaunch != "none" and s.recovery.max_restarts >= 1


def _resumed(s: Scenario) -> bool:
    """The first relaunch loads a checkpoint (the scenario names it)."""
    return _relaunched(s) and s.expect.resume_from is not None


def _harness_relaunch(s: Scenario) -> bool:
    """The harness relaunches, with a snapshot of the disk between launches (torchrun takes none)."""
    return _relaunched(s) and s.recovery.relaunch == "harness"


def _lost_work_limit(s: Scenario) -> bool:
    return (s.expect.max_lost_steps is not None or bool(s.trainer.get("ckpt_every_steps"))
            or any(f.spec.notice for f in s.faults))


def _always(s: Scenario) -> bool:
    return True


# check -> whether a run of the scenario, as it expects to go, gives the check a verdict.
APPLIES: dict[str, Callable[[Scenario], bool]] = {
    # Every run: the harness, the job's end, the trajectory, the checkpoints left at the end (the
    # reference trainer commits checkpoints in every catalogue scenario).
    "no_hang": _always,
    "harness_ok": _always,
    "job_completed": _always,
    "trajectory": _always,
    "committed_valid": _always,
    "no_strays": _always,
    "retention": _always,
    "reported_timings": _always,  # every catalogue run trains a step, and the trajectory records its time
    "config_refused": lambda s: _relaunched(s) and any(k in s.expect.refused for c in s.recovery.changes for k in c),
    "config_accepted": lambda s: _relaunched(s) and any(not any(k in s.expect.refused for k in c)
                                                        for c in s.recovery.changes if c),
    "cadence": lambda s: s.trainer.get("ckpt_every_steps") is not None,
    "retention_kept": lambda s: bool(s.trainer.get("keep_every") or s.trainer.get("keep_best")),
    "fault_fired": lambda s: bool(s.faults),
    "fault_landed": lambda s: any(f.when.min_fraction is not None
                                  and f.when.point in ("ckpt.shard.write", "upload.write") for f in s.faults),
    "final_state": lambda s: s.expect.trajectory == "bit-exact",
    # The faulted launch fails as the kind says (kinds with an exit check of their own answer instead).
    "fault_job_failed": lambda s: any(f.spec.exit_check is None and (s.expect.job_fails is not None or f.ends_launch)
                                      for f in s.faults),
    "detected_in_time": lambda s: s.expect.detect_within_s is not None and _relaunched(s),
    # A relaunch, and what it resumed from.
    "resume_from": _resumed,
    "loaded_equals_saved": _resumed,
    "committed_survives": _resumed,
    "lost_work": lambda s: _relaunched(s) and _lost_work_limit(s),
    "resumed_newest_valid": _harness_relaunch,
    "never_loaded_torn": lambda s: _harness_relaunch(s) and s.expect.resume_from is not None,
    # n/a where a fault damaged the checkpoint `latest` names; none where the disk is gone with it.
    "latest_valid": lambda s: _resumed(s) and not any(f.spec.damages or f.spec.loses_disk for f in s.faults),
    # The remote tier.
    "remote_durable_complete": lambda s: s.remote is not None,
    "final_durable": lambda s: s.remote is not None,
    "remote_retention": lambda s: s.remote is not None,
    "upload_stall": lambda s: s.remote is not None,
    # an upload attempt fails when a toxic cuts or stalls the link (other faults may fail one too)
    "upload_backoff": lambda s: s.remote is not None and any(f.kind == "toxic" for f in s.faults),
    "restored_durable": lambda s: s.remote is not None and _relaunched(s)
                                  and any(f.spec.loses_disk for f in s.faults),
}


def _index(s: Scenario, f: Fault) -> int:
    return next(i for i, g in enumerate(s.faults) if g is f)  # two faults may be equal


def _faults_after(s: Scenario, f: Fault) -> list[Fault]:
    """The faults of the same launch written after ``f`` (scenarios write them in firing order)."""
    return [g for g in s.faults[_index(s, f) + 1:] if g.attempt == f.attempt]


def _faults_before(s: Scenario, f: Fault) -> list[Fault]:
    return [g for g in s.faults[:_index(s, f)] if g.attempt == f.attempt]


def _errno_injected(s: Scenario, f: Fault) -> bool:
    """faultfs fails a call, unless a probability decides or an earlier fault made the save fail first."""
    return (f.params.via == "faultfs" and f.params.probability is None
            and not any(g.spec.fails_saves for g in _faults_before(s, f)))


def _surfaced(s: Scenario, f: Fault) -> bool:
    if f.kind == "errno":
        return f.params.via == "libfiu" or _errno_injected(s, f)
    # disk_full: n/a if no save began on the full disk; one is under way when it fills inside a save.
    return f.when.point.startswith("ckpt.")


# check of a fault kind (``kind_checks``) -> whether that kind's fault ``f`` gets a verdict from it.
APPLIES_TO_FAULT: dict[str, Callable[[Scenario, Fault], bool]] = {
    # n/a where a later fault interrupted the emergency save on purpose.
    "fault_preemption_handled": lambda s, f: not _faults_after(s, f) and not (f.kind == "preempt"
                                                                             and s.expect.job_fails),
    # a preemption the scenario expects to outlast its grace (expect.job_fails)
    "fault_grace_ran_out": lambda s, f: bool(s.expect.job_fails),
    # n/a where the relaunch resumed from a newer checkpoint than the one corrupted.
    "fault_detected": lambda s, f: f.params.checkpoint == "newest",
    "fault_injected": _errno_injected,
    "fault_surfaced": _surfaced,
    # Slurm's faults: the next launch is the requeued job; a node down for good is not in it.
    "fault_requeued": lambda s, f: _relaunched(s),
    "fault_not_on_lost_node": lambda s, f: _relaunched(s) and not f.params.back,
    # scancel --signal of another signal than TERM (the job's notice) must end the launch
    "fault_job_failed": lambda s, f: f.kind != "signal" or f.params.signal != "TERM",
}


def checks_of(s: Scenario) -> set[str]:
    """The checks that give the scenario a verdict (not n/a) when it runs as it expects."""
    out = {c for c, applies in APPLIES.items() if applies(s)}
    owned = kind_checks()
    for f in s.faults:
        out |= {c for c in owned[f.kind] if c in APPLIES_TO_FAULT and APPLIES_TO_FAULT[c](s, f)}
    return out


def unruled_checks() -> list[str]:
    """Checks the code can emit that no rule above speaks for."""
    owned = set().union(*kind_checks().values())
    return sorted(c for c in emitted_checks() if c not in (APPLIES_TO_FAULT if c in owned else APPLIES))


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
        if _relaunched(s):
            out.add(f"requeued by {_slurm_requeuer(s)}")
    # the trainer's checkpoint options that decide what survives: each under each family of faults
    out |= {f"{option} under {family} faults" for option in CHECKPOINT_OPTIONS if s.trainer.get(option)
            for family in s.families}
    # a toxic on the upload link takes the uploader's error paths, one on the restore the trainer's
    out |= {f"toxic on the {f.params.link} link while {_phase(f.when.point)}"
            for f in s.faults if f.kind == "toxic"}
    # a launch that ends while a link stays broken leaves its uploads to the next one: a crash kills
    # the uploader with rank 0, a SIGTERM drains it for what is left of the grace period
    out |= {f"{g.kind} while the {f.params.link} link stays down" for i, f in enumerate(s.faults)
            if f.kind == "toxic" and f.params.keep for g in s.faults[i + 1:]
            if g.attempt == f.attempt and g.spec.ends_launch}
    # the uploader is a process of its own: killing it takes the trainer's respawn paths, not a relaunch:
    # mid-run the next hand-off replaces it, during the drain at the end of training the drain does
    out |= {f"{f.kind} of the uploader {'during the final drain' if _final_save(s, f) else 'mid-run'}"
            for f in s.faults if f.target == "uploader"}
    # where in a step a SIGTERM stops the job decides what the emergency checkpoint holds: before the
    # first optimizer step there is no optimizer state and no loss yet; on a step's last micro-batch
    # there is no partial step to fold, and on a cadence step the checkpoint is already written
    for f in s.faults:
        if f.kind == "term" and f.when.point == "microstep.end" and f.when.step is not None:
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
            for f in s.faults if f.kind == "corrupt"}
    # the newest checkpoint damaged is one the resume must reject and quarantine, with a note it
    # cannot write on a disk that stays full (an older one may be gone to retention before that)
    if any(f.kind == "corrupt" and f.params.checkpoint == "newest" for f in s.faults) and any(
            f.kind == "disk_full" and f.params.keep_full for f in s.faults):
        out.add("the newest checkpoint damaged on a disk that stays full")
    if s.recovery.changes:
        out.add("configuration changed on relaunch")
        # each field a relaunch changes is one the resume compares, refuses or acts on in its own way
        out |= {f"{key} changed on relaunch" for change in s.recovery.changes for key in change}
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
        if any(f.kind == "corrupt" for f in s.faults):
            out.add("a checkpoint damaged locally with a remote tier")
        # faultfs has no hard links (link() answers EROFS): the uploader stages its copies by copying
        if s.storage_spec().faultfs:
            out.add("a remote tier on a file system without hard links")
        # a SIGTERM leaves the uploads what is left of its grace period, not upload_drain_s
        if any(f.kind == "term" for f in s.faults):
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
    if first is not None and first.kind == "preempt":
        return "slurm" if s.expect.job_fails else "job"
    if first is not None and first.kind in ("requeue", "node_down"):
        return "slurm"
    # a storage fault first may only set the stage for a preemption
    if any(f.kind == "preempt" for f in s.faults):
        return "slurm" if s.expect.job_fails else "job"
    return "harness"


def items_of(s: Scenario) -> set[Item]:
    return ({("family", f) for f in s.families} | {("kind", k) for k in s.kinds}
            | {("check", c) for c in checks_of(s)} | {("setup", x) for x in setups_of(s)})


def universe(catalogue: Iterable[Scenario]) -> set[Item]:
    """What a suite must cover: every family, kind, check and backend in the code, and every other
    setup the catalogue uses."""
    return ({("family", f) for f in families()} | {("kind", k) for k in KINDS}
            | {("check", c) for c in emitted_checks()} | {("setup", f"backend {b}") for b in BACKENDS}
            | {("setup", x) for s in catalogue for x in setups_of(s)})


def coverage(scenarios: Iterable[Scenario]) -> dict[Item, list[str]]:
    """Item -> the scenarios that cover it."""
    out: dict[Item, list[str]] = {}
    for s in scenarios:
        for item in items_of(s):
            out.setdefault(item, []).append(s.name)
    return out
