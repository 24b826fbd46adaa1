"""What must hold: checks over a stored run (history, trajectory, trainer events, golden run).

Each check answers ``pass``, ``fail``, ``unknown`` (the run cannot tell) or ``n/a`` (it does not
apply to this scenario), with a sentence that says what was seen. The run's verdict is the worst
of them: ``fail`` over ``unknown`` over ``pass``, ``n/a`` counting as nothing. Checks read only
files, so a stored run can be re-checked later (``ckpt-chaos check RUN_DIR``) without running
anything again.

A save killed mid-write is an indeterminate operation: the checks accept the old or the new
checkpoint as the resume point (whichever validates after the crash), never a mix.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from ckpt_chaos.check.expected import harness_relaunch, relaunched, resumed
from ckpt_chaos.check.history import (DeadlineHit, Exited, FaultFired, HarnessError, final_state, launch_logs,
                                     trajectory, trajectory_records, trainer_events)
from ckpt_chaos.check.promises import (committed_kept, final_directory, reference_family, refusal_problems,
                                     refused_keys, save_failure_policy)
from ckpt_chaos.check.timings import detection_timings, reported_timings
from ckpt_chaos.check.verdict import CheckSpec, Report, Run, first_few
from ckpt_chaos.faults.kind import FaultKind
from ckpt_chaos.probe.layout import TMP_PREFIX, parse_name
from ckpt_chaos.scenario import Scenario

EXACT_FIELDS = ("loss_hex", "grad_norm_hex", "lr_hex", "batch_digest", "tokens_seen")
COMPONENTS = ("model", "optimizer", "scheduler", "counters", "dataloader", "rng", "grads")
# After a world-size change the per-rank RNG streams are reseeded by design (README).
WORLD_CHANGE_EXEMPT = ("rng",)


def check_run(s: Scenario, run_dir: Path, golden: Path, harness_errors: list[str] | None = None) -> Report:
    run = Run.load(s, run_dir, golden, harness_errors)
    report = Report(launches=len(run.launches()))
    for make in dict.fromkeys(c.run for c in CHECKS):  # in the order declared, each once
        make(run, report)
    return report


# ---- the checks ---------------------------------------------------------------------------------

def _harness_health(run: Run, report: Report) -> None:
    deadlines = run.records(DeadlineHit)
    if deadlines:
        d = deadlines[0]
        report.add("no_hang", False, f"launch {d.launch} was still running after the scenario deadline of "
                   f"{d.deadline_s:.0f}s; the harness killed it (the job hung instead of failing)")
    else:
        report.add("no_hang", True, "every launch ended before the deadline")
    errors = run.harness_errors + [h.error for h in run.records(HarnessError)]
    report.add("harness_ok", not errors, "; ".join(dict.fromkeys(errors)) or "no harness errors")


def _faults_fired(run: Run, report: Report) -> None:
    fired = {h.index for h in run.faults()}
    unreached = {h.index: h for h in run.unreached()}
    for i, f in enumerate(run.s.faults):
        t = {k: v for k, v in vars(f.when).items() if v is not None}
        if i in unreached:
            # the harness's failure, not the trainer's: the run holds no evidence of this fault
            report.add("fired", "unknown", fault=i, detail=f"{f.kind} {f.target} fired at {t} but reached none of "
                       f"its targets: {unreached[i].unreached}; nothing of its effect can be checked")
            continue
        if i in fired:
            report.add("fired", True, fault=i, detail=f"{f.kind} {f.target} fired at {t}")
            continue
        from ckpt_chaos.check.history import Held

        held = next((h for h in run.records(Held) if h.index == i), None)
        if held is not None:
            # the order the scenario declared did not come about: nothing of the fault's story happened
            who = "the uploader" if held.at["point"].startswith("upload.") else f"rank {held.at['rank']}"
            report.add("fired", "unknown", fault=i, detail=
                       f"{f.kind} {f.target} never fired: its trigger matched {held.at['point']} of {who} in launch "
                       f"{held.launch}, where it waited {held.held_s:.1f}s for fault {held.after} (when.after) and was let go: "
                       f"{held.why}; nothing of its effect can be checked")
            continue
        ender = next((h for h in run.faults() if h.launch == f.attempt and run.s.faults[h.index].spec.ends_launch),
                     None)
        if ender is not None:
            # two triggers racing (a power loss on one rank, a full disk on another at the same save):
            # the run does not show whether this one would have been reached had the launch gone on
            report.add("fired", "unknown", fault=i, detail=
                       f"{f.kind} {f.target} never fired: fault {ender.index} ({ender.fault}) ended launch "
                       f"{f.attempt} before a probe event matched {t}; nothing of its effect can be checked "
                       f"(if this is so on every run, faults[{i}].when comes too late in the launch)")
            continue
        skipped = next((e for e in run.trainer("upload_skipped", f.attempt)
                        if f.when.point.startswith("upload.") and e.get("name") == f.when.name), None)
        if skipped is not None:
            # uploads lag behind training by design, and how far depends on the machine's load
            report.add("fired", "unknown", fault=i, detail=
                       f"{f.kind} {f.target} never fired: the uploader skipped {skipped['name']} for the newer "
                       f"{skipped.get('newer')} (uploads lag behind training), so no {f.when.point} of it came; "
                       f"nothing of its effect can be checked (a trigger on an upload by its order, when.nth, "
                       f"or ranks held back by a stop fault until it comes, does not depend on the lag)")
            continue
        ex = run.exit_of(f.attempt)
        why = f"check faults[{i}].when against the points the trainer reports (history.jsonl)"
        if ex is not None and ex.rc != 0:
            # the launch died on its own first: its error says more than the probe points do
            error = _last_error(launch_logs(run.dir, run.history) or {}, f.attempt)
            why = (f"launch {f.attempt} ended first, with exit status {ex.rc}"
                   + (f" ({error})" if error else "") + f"; see its part of torchrun.log")
        # a planned fault that never fired: the run did not exercise what the scenario states, whoever is
        # to blame, so it cannot say the trainer failed it (docs/checks.md)
        report.add("fired", "unknown", fault=i, detail=f"{f.kind} {f.target} never fired: no probe event of "
                   f"launch {f.attempt} matched {t}; {why}; the scenario did not exercise what it states")


# A rank's own error (``[rank1]: ValueError: ...`` under torchrun), not torchrun's ChildFailedError
# that only says a rank failed.
_ERROR_LINE = re.compile(r"^(?:\[rank\d+\]:)?\s*((?![\w.]*ChildFailedError)[\w.]*(?:Error|Exception)\b:? .*)$", re.M)


def _last_error(logs: dict[int, str], launch: int) -> str | None:
    """The last ``SomethingError: message`` line of a launch's log, cut to a line's length."""
    found = _ERROR_LINE.findall(logs.get(launch, ""))
    return found[-1].strip()[:200] if found else None


# How far below its trigger's fraction a shard may be on disk: the trainer estimates its file's size
# before writing it, and the last write may still sit in the stream's buffer.
LANDED_SLACK = 0.05
# The points whose events say how much of a file's write is done (``info.fraction``).
LANDED_POINTS = ("ckpt.shard.write", "upload.write")
# The same of a [command] trainer: the automatic probe layer's and faultfs's writes of any file.
FILE_LANDED_POINTS = ("file.write", "faultfs.write", "ckpt.shard.write")


def _faults_landed(run: Run, report: Report) -> None:
    """A fault aimed at a fraction of a file's write (``when.min_fraction``) found that much of it done,
    measured against the size the golden run wrote the file at: for a shard, what was on disk (and no
    more than the next tenth, the probe reporting each tenth); for an upload, the bytes the uploader's
    reader had handed to the request (and no more reported than that). The trainer's own fraction is
    what this checks, not what it trusts. A ``[command]`` trainer's write of any file: ``_landed_in_file``."""
    for h in run.faults():
        fraction = run.s.faults[h.index].when.min_fraction
        point, info = h.at.get("point"), h.at.get("info", {})
        if run.s.command is not None:
            if point in FILE_LANDED_POINTS:
                _landed_in_file(run, h, fraction, report)
            continue
        if fraction is None or point not in LANDED_POINTS:
            continue
        name = info.get("file")
        if point == "upload.write":
            ckpt, label, done = str(info.get("name")), f"{info.get('name')}/{name}", info.get("bytes")
            if not isinstance(done, int):
                report.add("landed", "unknown", f"the upload of {label} reported no byte count", fault=h.index)
                continue
        else:
            writing = (h.snapshot_before or {}).get("writing", {})
            where = [p for p in writing if p.endswith("/" + str(name))]
            if len(where) != 1:
                report.add("landed", "unknown", f"{name} was not in exactly one save in progress when the fault "
                           f"fired ({', '.join(where) or 'none'})", fault=h.index)
                continue
            ckpt, label, done = where[0].split("/")[0].removeprefix(TMP_PREFIX), where[0], writing[where[0]]
        sizes = _golden_sizes(run.golden, name)
        if not sizes:
            report.add("landed", "unknown", f"the golden run kept no manifest listing {name} to measure it against",
                       fault=h.index)
            continue
        near = _nearest(sizes, ckpt)
        planned, measure = sizes[near], f"the golden run's {near}"
        if point == "ckpt.shard.write" and ckpt not in sizes and (parse_name(ckpt) or (0, 0))[1] > 0:
            # A save mid-accumulation also holds the partial gradients, and a fault-free run never makes
            # one: no golden file measures it. The trainer's own planned size does, once the same planner's
            # sizes for this run's step-boundary saves of the file matched the golden run's.
            planned, measure = _vouched_plan(run, name, sizes, info.get("planned"))
            if planned is None:
                report.add("landed", "unknown", f"{label} is a save mid-accumulation, which the golden run never "
                           f"makes, and {measure}", fault=h.index)
                continue
        got = done / planned
        if point == "ckpt.shard.write":
            # the probe reports each tenth of the file, so the first report at the trigger is at most a
            # tenth past it
            early, late = got < fraction - LANDED_SLACK, got > min(1.0, fraction + 0.1 + LANDED_SLACK)
            said = f"{label} held {got:.0%} of its {planned} bytes ({measure})"
        else:
            # the HTTP client reads the body in blocks as large as it likes (a small file at once), so
            # only progress claimed beyond the bytes read is wrong
            reported = info.get("fraction")
            early = got < fraction - LANDED_SLACK or not isinstance(reported, (int, float)) \
                or reported > got + LANDED_SLACK
            late = False
            said = (f"the uploader had read {got:.0%} of {label}'s {planned} bytes (the golden run's {near}) "
                    f"into its request, and reported {reported!r} of it,")
        report.add("landed", not (early or late), fault=h.index, detail=
                   f"{said} when the fault fired, for a trigger at {fraction:.0%}" + (
                       ": the trainer's probe reported progress its file did not have" if early else
                       ": the trainer's probe reported progress later than the file made it" if late else ""))


def _landed_in_file(run: Run, h, fraction: float | None, report: Report) -> None:
    """Where a fault on a ``[command]`` trainer's file write (``file.write``, ``faultfs.write``,
    ``ckpt.shard.write``) landed: the bytes of the file when it fired, against the size of the same
    file in the golden run (under its final name, where it is written under a temporary one). The bytes
    are the file's on disk as the launch ended where the fault killed its writer, else those the point
    reported written; fewer on disk than reported is the layer's report found wrong. With
    ``when.min_fraction``, they must be at least that share of the golden file and at most a tenth more
    (the points come at each tenth)."""
    from ckpt_chaos.check.evidence import Evidence

    info = h.at.get("info", {})
    path, reported = info.get("path"), info.get("bytes")
    if not path or not isinstance(reported, int):
        report.add("landed", "unknown", f"the {h.at.get('point')} it fired on names no file and byte count",
                   fault=h.index)
        return
    aliases = info.get("aliases") or []
    name, whole = Evidence(run)._golden_size(path, aliases)
    if name is None:
        report.add("landed", "unknown", f"the golden run left no file {' or '.join(dict.fromkeys([path, *aliases]))} "
                   "to measure it against", fault=h.index)
        return
    ex = run.exit_of(h.launch)
    killed = run.s.faults[h.index].spec.kills_target and h.at.get("rank") in h.detail.get("ranks", ())
    on_disk = (ex.files or {}).get(path) if killed and ex is not None else None
    label = path if name == path else f"{path} ({name} in the golden run)"
    if on_disk is not None and on_disk < reported:
        report.add("landed", False, fault=h.index, detail=f"{label} held {on_disk} bytes as launch {h.launch} ended, "
                   f"which the fault ended, but the {h.at.get('point')} it fired on reported {reported} written: the "
                   "layer reported progress the file did not have")
        return
    got = reported / whole if whole else 1.0
    where = (f"{label} held {reported} of the golden run's {whole} bytes ({got:.0%}) when the fault fired"
             + (" (on disk as its launch ended)" if on_disk == reported else ""))
    if fraction is None:
        report.add("landed", True, fault=h.index, detail=where + ", for a trigger at no fraction")
        return
    early = got < fraction - LANDED_SLACK
    late = got > min(1.0, fraction + 0.1 + LANDED_SLACK)
    report.add("landed", not (early or late), fault=h.index, detail=where + f", for a trigger at {fraction:.0%}" + (
        ": the point reported a share of the file it did not have (its plan was not the golden file's size)"
        if early else ": the point came later in the file than its trigger" if late else ""))


def _nearest(sizes: dict[str, int], ckpt: str) -> str:
    """The same checkpoint, or the nearest one the golden run's retention kept: a shard's size moves by a
    few bytes from step to step (the pickled counters), not by a fraction."""
    step = (parse_name(ckpt) or (0, 0))[0]
    return min(sizes, key=lambda c: (c != ckpt, abs((parse_name(c) or (0, 0))[0] - step)))


def _vouched_plan(run: Run, name: str, sizes: dict[str, int], planned) -> tuple[int | None, str]:
    """The size the trainer planned for a write of ``name`` that no golden file measures, and how it was
    vouched for: by the sizes the trainer planned for this run's step-boundary saves of the same file,
    each within ``LANDED_SLACK`` of the golden run's. Otherwise None, and what is missing."""
    if not isinstance(planned, int) or planned <= 0:
        return None, "the trainer's probe reported no planned size for it"
    saving, plans = {}, {}
    for e in run.probes():
        if e.point == "ckpt.stage":
            saving[(e.launch, e.pid)] = str(e.info.get("name"))
        elif e.point == "ckpt.shard.write" and e.info.get("file") == name and (e.launch, e.pid) in saving:
            plans[saving[(e.launch, e.pid)]] = e.info.get("planned")
    boundary = {c: p for c, p in plans.items() if (parse_name(c) or (0, 1))[1] == 0}
    if not boundary:
        return None, (f"this run made no step-boundary save of {name} to vouch for the {planned} bytes its "
                      "trainer planned")
    golden_of = {c: sizes[_nearest(sizes, c)] for c in boundary}
    off = [f"{c} planned {p} against {golden_of[c]}" for c, p in sorted(boundary.items())
           if not isinstance(p, int) or abs(p - golden_of[c]) > LANDED_SLACK * golden_of[c]]
    if off:
        return None, (f"the sizes its trainer planned are not vouched for ({first_few(off)}, more than "
                      f"{LANDED_SLACK:.0%} from the golden run's)")
    return planned, (f"as its trainer planned: a save mid-accumulation, which the golden run never makes; the "
                     f"trainer's plans for {', '.join(sorted(boundary))} were within {LANDED_SLACK:.0%} of the golden run's")


def _golden_sizes(golden: Path, name: str) -> dict[str, int]:
    """The size of file ``name`` in each checkpoint whose manifest the golden run kept."""
    sizes = {}
    for manifest in sorted((golden / "checkpoints").glob("*/manifest.json")):
        try:
            sizes[manifest.parent.name] = json.loads(manifest.read_text())["files"][name]["size"]
        except (OSError, ValueError, KeyError):
            continue
    return sizes


def _completion(run: Run, report: Report) -> None:
    final = final_state(run.dir)
    exits = run.records(Exited)
    last_rc = exits[-1].rc if exits else None
    ok = final is not None and bool(run.trainer("finished")) and last_rc == 0
    report.add("job_completed", ok, f"training finished after {report.launches} launch(es)" if ok else
               f"training did not finish (last launch exit status {last_rc}); see torchrun.log")


def _fault_effects(run: Run, report: Report) -> None:
    """How each faulted launch ended, then what the trainer must show of each fault, as its kind
    says (ckpt_chaos/faults/): a storage fault that made calls fail was reported, a corrupted
    checkpoint was rejected before a load."""
    _fault_exits(run, report)
    for h in run.faults():
        spec = run.s.faults[h.index].spec
        if spec.effect_check is not None:
            spec.effect_check(run, h, report)


def _fault_exits(run: Run, report: Report) -> None:
    """The faulted launch failed (a fault that ends it), or ended as its kind says it must (a
    preemption: stopped cleanly with an emergency save)."""
    for h in run.faults():
        fault = run.s.faults[h.index]
        launch = h.launch
        ex = run.exit_of(launch)
        if fault.spec.exit_check is not None:
            fault.spec.exit_check(run, h, report)
            continue
        if run.s.expect.job_fails is None and not fault.ends_launch:
            continue  # whether the job stops is the trainer's policy; the kind's effect check sees it said so
        expect_fail = run.s.expect.job_fails if run.s.expect.job_fails is not None else True
        if ex is None or run.s.recovery.relaunch == "torchrun":
            later = [x for x in run.launches() if x > launch]
            report.add("job_failed", bool(later) == expect_fail, fault=h.index,
                       detail="torchrun restarted the workers" if later else "no restart followed the fault")
            continue
        failed = ex.rc != 0
        report.add("job_failed", failed == expect_fail, fault=h.index,
                   detail=f"launch {launch} exited with status {ex.rc}"
                   + ("" if failed == expect_fail else f" (expected {'failure' if expect_fail else 'success'})"))


def _diagnose(run: Run, step: int, fields_: list[str]) -> str:
    """Why the trajectory diverges at ``step``: which part of the loaded state is not the saved one."""
    what = ", ".join(fields_)
    head = f"trajectory diverges at step {step} ({what})"
    if "batch_digest" in fields_:
        head += ": the job trained on different samples than the golden run" + _sample_shift(run, step)
    loads = [e for e in run.trainer("loaded") if e["step"] < step]
    if not loads:
        # a relaunch that rejected what it tried to load and started over trains from step 1 again:
        # on a model and optimizer built anew, or it is not the golden run's start
        fresh = [e for e in run.trainer("fresh_start") if e.get("attempt", 0) > 0 and e.get("rejected")]
        if fresh:
            e = fresh[0]
            names = ", ".join(sorted({r[0] if isinstance(r, (list, tuple)) else str(r) for r in e["rejected"]}))
            return (head + f", in launch {e['attempt']}, which started afresh after rejecting {names}: a fresh start "
                    "must begin from a model and optimizer built anew, and this one did not begin where the golden "
                    "run did (a load that failed part-way leaves the tensors it copied in)")
        return head + ", before any resume: the fault changed training itself, or the trainer is not deterministic"
    load = max(loads, key=lambda e: (e["step"], e.get("t", 0)))
    where = f"; it is the first step after resuming from {load['name']} (launch {load.get('attempt')})"
    diff, same = _component_diff(load, exempt=_exempt(load))
    if diff:
        return (head + where + f"; after that load the {', '.join(diff)} state differs from the state saved"
                + (f" ({', '.join(same)} identical)" if same else ""))
    golden_saved = {e["name"]: e.get("digests") for e in trainer_events(run.golden, "saved")}
    saved = load.get("saved_digests") or {}
    if load["name"] in golden_saved and golden_saved[load["name"]] and saved:
        gdiff = [k for k in COMPONENTS if k in saved and saved.get(k) != golden_saved[load["name"]].get(k)]
        if gdiff:
            return (head + where + f"; the checkpoint was already wrong when saved: its {', '.join(gdiff)} state "
                    "differs from the golden run's at the same step")
    if not saved:
        return head + where + "; the trainer records no component digests, so the cause cannot be narrowed down"
    return (head + where + "; the state loaded equals the state saved in every recorded component, so the cause "
            "is something the checkpoint does not capture")


def _sample_shift(run: Run, step: int) -> str:
    return sample_shift(trajectory(run.golden), trajectory(run.dir), step, "batch_digest")


def sample_shift(gold: dict[int, dict], got: dict[int, dict], step: int, key: str) -> str:
    """Where the samples of ``step`` (field ``key`` of its record) come from in the golden run: a data
    loader that resumed at the wrong position shows up as the golden run's batches, shifted by a
    number of steps."""
    samples = got.get(step, {}).get(key)
    match = [j for j in sorted(gold) if gold[j].get(key) == samples]
    if not match:
        return " (its samples form no batch of the golden run)"
    j = match[0]
    if j < step:
        return (f": its batch is the golden run's step {j}, so the data loader resumed {step - j} step(s) too early "
                f"and {step - j} step(s) of samples are seen twice")
    return (f": its batch is the golden run's step {j}, so the data loader resumed {j - step} step(s) too late "
            f"and {j - step} step(s) of samples are skipped")


def _exempt(load: dict) -> tuple[str, ...]:
    return WORLD_CHANGE_EXEMPT if load.get("saved_world_size", load.get("world_size")) != load.get("world_size") else ()


def _component_diff(load: dict, exempt: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    got, saved = load.get("digests") or {}, load.get("saved_digests") or {}
    keys = [k for k in COMPONENTS if (k in got or k in saved) and k not in exempt]
    diff = [k for k in keys if got.get(k) != saved.get(k)]
    return diff, [k for k in keys if k not in diff]


def _trajectory(run: Run, report: Report) -> None:
    gold, got = trajectory(run.golden), trajectory(run.dir)
    missing = sorted(set(gold) - set(got))
    if missing:
        report.add("trajectory", False, f"steps {missing[0]}..{missing[-1]} of the golden run were never trained")
        return
    if run.s.expect.trajectory == "bit-exact":
        diffs = [(step, [k for k in EXACT_FIELDS if gold[step].get(k) != got[step].get(k)]) for step in sorted(gold)]
        diffs = [(step, ks) for step, ks in diffs if ks]
        if diffs:
            report.add("trajectory", False, _diagnose(run, *diffs[0]))
        else:
            report.add("trajectory", True, f"{len(gold)} steps identical to the golden run, bit for bit")
        gf, f = final_state(run.golden), final_state(run.dir)
        if gf and f:
            same = gf["state_digest"] == f["state_digest"]
            parts = [k for k in gf.get("digests", {}) if gf["digests"][k] != f.get("digests", {}).get(k)]
            report.add("final_state", same, "final model + optimizer digest equals the golden run's" if same else
                       f"final state differs from the golden run's in: {', '.join(parts) or 'model/optimizer'}")
        return
    tol = run.s.expect.rel_tol
    worst, worst_step = 0.0, None
    for step in sorted(gold):
        if gold[step]["batch_digest"] != got[step]["batch_digest"]:
            report.add("trajectory", False, _diagnose(run, step, ["batch_digest"]))
            return
        rel = abs(gold[step]["loss"] - got[step]["loss"]) / max(abs(gold[step]["loss"]), 1e-12)
        if rel > worst:
            worst, worst_step = rel, step
    ok = worst <= tol
    report.add("trajectory", ok, f"same samples at every step; largest relative loss difference {worst:.3%} "
               f"(step {worst_step}), tolerance {tol:.1%}" if ok else
               _diagnose(run, worst_step, [f"loss off by {worst:.2%} > {tol:.1%}"]))


def _loaded_equals_saved(run: Run, report: Report) -> None:
    for load in run.trainer("loaded"):
        diff, same = _component_diff(load, exempt=_exempt(load))
        if not (load.get("digests") and load.get("saved_digests")):
            continue
        if load.get("micro") and "grads" not in load["saved_digests"]:
            # a mid-step checkpoint holds the step's accumulated gradients: without their digest, the
            # comparison leaves out the one component a mid-step resume most often drops
            report.add("loaded_equals_saved", "unknown", at=load["name"], detail=
                       f"{load['name']} was saved after micro-batch {load['micro']} of step {load.get('step')}, so it "
                       "holds accumulated gradients, but its digests have none ('grads'): whether they were "
                       f"restored is unknown ({', '.join(same)} compared); record a gradient digest in mid-step saves")
            continue
        report.add("loaded_equals_saved", not diff, at=load["name"], detail=
                   f"state loaded from {load['name']} differs from the state saved in: {', '.join(diff)} "
                   f"({', '.join(same)} identical)" if diff else
                   f"{', '.join(same)} identical to the state saved" + (
                       " (RNG reseeded: world size changed)" if _exempt(load) else ""))


def _resume_choice(run: Run, report: Report) -> None:
    """Each relaunch resumed from the newest checkpoint that validates after the crash, never a torn one."""
    first = True
    for launch in run.launches()[1:]:
        point = run.resume_point(launch)
        if point is None:
            continue
        name, _ = point
        report.resumed_from.append(name or "scratch")
        if first and run.s.expect.resume_from is not None:
            ok = name == run.s.expect.resume_from
            report.add("resume_from", ok, f"launch {launch} resumed from {name or 'scratch'}"
                       + ("" if ok else f", expected {run.s.expect.resume_from}"))
        first = False
        before = run.exit_of(launch - 1)
        if before is None or run.s.recovery.relaunch == "torchrun":  # no snapshot between torchrun restarts
            continue
        snap = before.snapshot
        # a durable checkpoint whose download a fault of this launch cut was out of the restore's reach
        cut = {h.at["info"].get("name") for h in run.faults()
               if h.launch == launch and h.at["point"] == "remote.download" and not _spec(run, h).heals}
        remote = [n for n, r in (before.remote or {}).get("checkpoints", {}).items() if r is None and n not in cut]
        # a checkpoint a fault of this launch damaged after it validated, as its load began, is not valid
        damaged = {h.detail.get("checkpoint") for h in run.faults()
                   if h.launch == launch and h.at["point"] == "load.begin" and _spec(run, h).damages}
        local = ([n for n, r in snap["checkpoints"].items() if r is None and n not in damaged]
                 if damaged else [snap["newest_valid"]])
        newest = _newest(*local, *remote)
        ok = name == newest
        report.add("resumed_newest_valid", ok, at=launch, detail=
                   f"launch {launch} resumed from {name or 'scratch'}, the newest valid checkpoint after the crash"
                   + (f" whose download no fault cut ({', '.join(sorted(cut))} cut)" if cut else "")
                   + (f" and no fault damaged as its load began ({', '.join(sorted(damaged))} damaged)"
                      if damaged else "")
                   if ok else f"launch {launch} resumed from {name or 'scratch'} but the newest valid checkpoint "
                   f"after the crash was {newest or 'none'}{_blame(run, before.t)}")
        if name is not None:
            restored = [e for e in run.trainer("restored_from_remote", launch) if e["name"] == name]
            where = (before.remote or {}).get("checkpoints", {}) if restored else snap["checkpoints"]
            reason = where.get(name, "it did not exist" + (" as a durable remote checkpoint" if restored else ""))
            report.add("never_loaded_torn", reason is None, at=launch, detail=
                       f"{name} validated after the crash" if reason is None else
                       f"launch {launch} loaded {name} although it was not a valid checkpoint: {reason}"
                       f"{_blame(run, before.t, name)}")


CADENCE_SLACK_S = 0.05  # the trainer times its cadence with monotonic(), events carry time.time()


def _cadence(run: Run, report: Report) -> None:
    """The trainer saves on its cadence no more often than configured: each cadence save at a multiple
    of ckpt_every_steps or, with ckpt_every_seconds, at least that long after the loop got back from
    the save before (a launch's first may come at any time). Each extra save stalls training for
    nothing. Launches whose scenario leaves ckpt_every_steps to the trainer's default are skipped."""
    problems, saves = [], 0
    for launch in run.launches():
        cfg = run.config(launch)
        if cfg.get("ckpt_every_steps") is None:
            continue
        every_steps, every_s = int(cfg["ckpt_every_steps"]), float(cfg.get("ckpt_every_seconds") or 0)
        returned = None  # when the loop got back from the save before
        for e in run.events:
            if e.get("attempt") != launch or e["event"] not in ("saved", "save_started"):
                continue
            if e.get("reason") not in ("cadence", "final"):
                continue
            began = e["t"] - ((e.get("stall_s") if e["event"] == "save_started" else e.get("total_s")) or 0.0)
            step = (parse_name(e["name"]) or (0, 0))[0]
            if e["reason"] == "cadence":
                saves += 1
                on_step = every_steps > 0 and step % every_steps == 0
                on_time = every_s > 0 and (returned is None or began - returned >= every_s - CADENCE_SLACK_S)
                if not (on_step or on_time):
                    since = "" if returned is None else f", {began - returned:.2f}s after the save before"
                    problems.append(f"launch {launch} saved {e['name']} on its cadence{since}, with "
                                    f"ckpt_every_steps={every_steps} and ckpt_every_seconds={every_s:g}")
            returned = e["t"]
    if saves:
        report.add("cadence", not problems,
                   f"{saves} cadence save(s), none more often than configured" if not problems else
                   first_few(problems))


def _config_changes(run: Run, report: Report) -> None:
    """A relaunch whose configuration changed a key the resume must refuse (``expect.refused``) exits
    non-zero before loading anything, says which key, and leaves the checkpoints as they were; a
    relaunch that changed only other keys resumes."""
    logs = launch_logs(run.dir) or {}
    must_refuse = refused_keys(run.s)  # the scenario's expect.refused, and what the trainer declares
    for n, change in enumerate(run.s.recovery.changes, 1):
        ex, before = run.exit_of(n), run.exit_of(n - 1)
        if ex is None:
            continue
        refused = sorted(k for k in change if k in must_refuse)
        what = ", ".join(f"{k} = {v!r}" for k, v in change.items())
        loads = run.trainer("loaded", n)
        if not refused:
            ok = bool(loads)
            report.add("config_accepted", ok, at=n, detail=
                       f"launch {n} changed {what} and resumed from {loads[0]['name']}" if ok else
                       f"launch {n} changed only {what}, which a resume may change, but it loaded no checkpoint "
                       f"(exit status {ex.rc}); see its part of torchrun.log")
            continue
        problems = refusal_problems(ex.rc, [f"it resumed from {loads[0]['name']} at step {loads[0]['step']}"]
                                    if loads else [], logs.get(n), refused)
        if before is not None and ex.snapshot["checkpoints"] != before.snapshot["checkpoints"]:
            problems.append(f"the checkpoints changed: {sorted(before.snapshot['checkpoints'])} before it, "
                            f"{sorted(ex.snapshot['checkpoints'])} after it")
        report.add("config_refused", not problems, at=n, detail=
                   f"launch {n} changed {what} and was refused: it exited {ex.rc} naming {', '.join(refused)}, "
                   "the checkpoints untouched" if not problems else
                   f"launch {n} changed {what}, which a resume must refuse, but " + "; ".join(problems))


def _newest(*names: str | None) -> str | None:
    from ckpt_chaos.probe.layout import parse_name

    found = [n for n in names if n]
    return max(found, key=parse_name) if found else None


def _crash_states(run: Run, report: Report) -> None:
    """At every crash: `latest` names a valid checkpoint, and no committed checkpoint was lost."""
    # Committed: the trainer said so, or (a probed trainer) its commit rename happened.
    committed = sorted([{"name": e["name"], "t": e.get("t", 0), "attempt": e.get("attempt")}
                        for e in run.trainer("committed")]
                       + [{"name": h.info["name"], "t": h.t, "attempt": h.launch} for h in run.probes("ckpt.commit")],
                       key=lambda c: c["t"])
    retention = run.trainer("retention")
    for ex in run.records(Exited):
        if ex.rc == 0 and run.trainer("finished", ex.launch):
            continue
        snap = ex.snapshot
        latest = snap.get("latest")
        # A checkpoint a corrupt fault damaged on purpose is not the trainer's to keep valid.
        damaged = {h.detail.get("checkpoint") for h in run.faults() if _spec(run, h).damages and h.t <= ex.t}
        committed = [c for c in committed if c["name"] not in damaged]
        if latest in damaged:
            report.add("latest_valid", "n/a", at=ex.launch,
                       detail=f"`latest` names {latest}, which a fault damaged on purpose")
        elif latest is not None:
            reason = snap["checkpoints"].get(latest, "it does not exist")
            report.add("latest_valid", reason is None, at=ex.launch, detail=
                       f"`latest` names {latest}, a valid checkpoint" if reason is None else
                       f"after launch {ex.launch} died, `latest` named {latest}, which was not a valid "
                       f"checkpoint ({reason}): the pointer moved before the checkpoint was durable"
                       f"{_blame(run, ex.t)}")
        pool = committed
        if any(_spec(run, h).loses_disk and h.launch == ex.launch for h in run.faults()):
            # The local disk is gone with everything on it: what must survive is what was durable.
            pool = [{"name": e["name"], "t": e["t"], "attempt": e.get("attempt")} for e in run.trainer("uploaded")]
        before = [c for c in pool if c.get("t", 0) <= ex.t and c.get("attempt") == ex.launch]
        before = before or [c for c in pool if c.get("t", 0) <= ex.t]
        if not before:
            continue
        last = before[-1]["name"]
        valid = [n for n, r in snap["checkpoints"].items() if r is None]
        valid += [n for n, r in (ex.remote or {}).get("checkpoints", {}).items() if r is None]
        ok = last in valid or any(n > last for n in valid)
        if ok:
            report.add("committed_survives", True, at=ex.launch, detail=
                       f"{last}, the newest checkpoint committed before the crash, or a newer one is valid")
        else:
            deleted = [r for r in retention if last in r.get("deleted", [])]
            why = (f"; retention deleted it while the next save had not committed" if deleted else "")
            report.add("committed_survives", False, at=ex.launch, detail=
                       f"{last} was committed before the crash but is not valid after it, and nothing newer is"
                       f" ({snap['checkpoints'].get(last, 'gone')}){why}{_blame(run, ex.t, last)}")


def _spec(run: Run, h: FaultFired) -> FaultKind:
    """The kind of the fault a history record says fired."""
    return run.s.faults[h.index].spec


def _blame(run: Run, t: float, ckpt: str | None = None) -> str:
    """"; after FAULT at POINT": the fault that explains a finding at time ``t``, for the diagnosis:
    the corruption of ``ckpt`` if one was done, otherwise the last fault before ``t``."""
    before = [h for h in run.faults() if h.t <= t]
    aimed = [h for h in before if ckpt is not None and h.detail.get("checkpoint") == ckpt]
    if not before:
        return ""
    h = (aimed or before)[-1]
    fault = run.s.faults[h.index]
    at = h.at
    what = fault.spec.describe(fault, h) if fault.spec.describe else fault.kind
    out = f"; after {what} at {at['point']} (rank {at['rank']})"
    lost = h.detail.get("lost")
    if lost:
        out += (f", which lost the un-fsynced data of {len(lost['truncated']) + len(lost['restored'])} file(s) "
                f"and undid {len(lost['undone'])} un-persisted directory operation(s)")
        if lost["truncated"]:
            out += f" (emptied: {', '.join(lost['truncated'][:4])})"
    return out


def _committed_valid(run: Run, report: Report) -> None:
    """Every checkpoint the trainer reported committed was complete when its launch ended, unless
    retention deleted it or a fault (corruption, power loss) damaged it afterwards."""
    deleted = {n for r in run.trainer("retention") for n in r.get("deleted", [])}
    damaged = {h.detail.get("checkpoint") for h in run.faults() if _spec(run, h).damages}
    power_cut = {h.launch for h in run.faults() if _spec(run, h).loses_unsynced}
    checked = 0
    for ex in run.records(Exited):
        if ex.launch in power_cut:
            continue  # what must survive a power cut is committed_survives's business
        snap = ex.snapshot["checkpoints"]
        for c in run.trainer("committed", ex.launch):
            name = c["name"]
            checked += 1
            if name in deleted or name in damaged or name not in snap or snap[name] is None:
                continue
            checked = -1_000_000
            report.add("committed_valid", False, at=name, detail=
                       f"the trainer reported {name} committed, but it is not a valid checkpoint: {snap[name]}"
                       f"{_blame(run, c.get('t', 0))}")
    if checked > 0:
        report.add("committed_valid", True, f"{checked} committed checkpoint(s) complete when their launch ended")


def _manifest_facts(run: Run, report: Report) -> None:
    """What each valid checkpoint's manifest says of the training it holds, as seen at every launch's
    end, agrees with the run: the tokens seen by its step (the trajectory's) and the world size of the
    launch that committed it. A field left out is as wrong as a wrong one: readers of the manifest
    (`ckpt-chaos ckpts`, a tool picking a checkpoint) take it from there, not from the shards."""
    records, golden = trajectory_records(run.dir), trajectory(run.golden)
    problems: dict[str, str] = {}
    checked: set[str] = set()
    for ex in run.records(Exited):
        # as of this launch's end: a later launch may train a step again under another config
        ours = {r["step"]: r for r in records if r.get("attempt", 0) <= ex.launch}
        sizes = {c["name"]: c.get("world_size") for c in run.events
                 if c["event"] == "committed" and c.get("attempt", 0) <= ex.launch}
        for name, facts in (ex.snapshot.get("manifests") or {}).items():
            if name in problems:
                continue
            checked.add(name)
            missing = [k for k in ("tokens_seen", "world_size") if k not in facts]
            step = facts.get("step")
            record = ours.get(step) or golden.get(step)
            tokens = 0 if step == 0 else record.get("tokens_seen") if record else None
            said = []
            if missing:
                said.append(f"lacks {' and '.join(missing)}")
            if "tokens_seen" in facts and tokens is not None and facts["tokens_seen"] != tokens:
                said.append(f"says tokens_seen = {facts['tokens_seen']}, but step {step} of the trajectory had seen "
                            f"{tokens}")
            if "world_size" in facts and sizes.get(name) is not None and facts["world_size"] != sizes[name]:
                said.append(f"says world_size = {facts['world_size']}, but the launch that committed it ran "
                            f"{sizes[name]} rank(s)")
            if said:
                problems[name] = f"{name}'s manifest (at launch {ex.launch}'s end) " + "; ".join(said)
    for name, detail in problems.items():
        report.add("manifest_facts", False, at=name, detail=detail)
    if checked and not problems:
        report.add("manifest_facts", True, f"the manifests of {len(checked)} checkpoint(s) give the tokens seen "
                   f"and the world size the run had")


def _remote_tier(run: Run, report: Report) -> None:
    """With a remote tier: every checkpoint the remote side calls durable is complete (the harness
    downloads and hashes each object), a restore only ever takes such a checkpoint, and the
    training loop never waits for an upload."""
    if run.s.remote is None:
        return
    views = [(f"fault_{h.index}", h.index, h.t, h.remote_after) for h in run.faults() if h.remote_after is not None]
    views += [(str(ex.launch), None, ex.t, ex.remote) for ex in run.records(Exited) if ex.remote is not None]
    damaged = {h.detail.get("checkpoint"): h.t for h in run.faults() if _spec(run, h).damages and h.detail.get("remote")}
    for label, index, t, remote in views:
        torn = {n: r for n, r in remote["checkpoints"].items() if r is not None and not damaged.get(n, t + 1) <= t}
        report.add("remote_durable_complete", not torn, at=label, fault=index, detail=
                   f"{len(remote['checkpoints'])} durable remote checkpoint(s), each complete"
                   + (f"; {len(remote['partial'])} partial upload(s) without a manifest: {', '.join(remote['partial'])}"
                      if remote["partial"] else "") if not torn else
                   "; ".join(f"{n} is marked durable (manifest.json uploaded) but {r}" for n, r in torn.items())
                   + ": the uploader marked it durable before every object was complete" + _blame(run, t))
    for launch in run.launches()[1:]:
        before = run.exit_of(launch - 1)
        remote = (before.remote if before else None) or {}
        for e in run.trainer("restored_from_remote", launch):
            reason = remote.get("checkpoints", {}).get(e["name"], "not durable")
            size = remote.get("bytes", {}).get(e["name"])
            if reason is None and size is not None and e.get("bytes") != size:
                reason = (f"complete, {size} bytes of objects besides its manifest, but the trainer reported "
                          f"{e.get('bytes')!r} bytes fetched")
            said = f" ({size} bytes, as the trainer reported)" if size is not None else ""
            report.add("restored_durable", reason is None, at=launch, detail=
                       f"launch {launch} restored {e['name']}, complete on the remote tier{said}" if reason is None
                       else f"launch {launch} restored {e['name']} from the remote tier, which was {reason}")
            _restored_in_place(run, report, launch, e)
    _uploaded_durable(run, report, views, damaged)
    exits = run.records(Exited)
    if exits and exits[-1].rc == 0 and run.trainer("finished") and exits[-1].remote is not None:
        local, remote = exits[-1].snapshot["newest_valid"], exits[-1].remote["newest_durable"]
        report.add("final_durable", remote == local,
                   f"the final checkpoint {local} is durable on the remote tier" if remote == local else
                   f"training finished with {local}, but the newest durable remote checkpoint is {remote or 'none'}: "
                   "the last upload never completed (see upload_* events in events.jsonl)")
        _remote_retention(run, report, exits[-1].remote)
    _upload_backoff(run, report)
    _upload_retries(run, report)
    # A hand-off is a pipe write; an uploader that made the loop wait would stall it for about as long as
    # its uploads take. Compared in sums, so one scheduling hiccup on a busy machine does not decide it.
    stall = sum(e["stall_s"] for e in run.trainer("upload_queued"))
    uploading = sum(e["seconds"] for e in run.trainer("uploaded"))
    if uploading > 0:
        ok = stall < 0.25 * uploading
        report.add("upload_stall", ok,
                   f"handing checkpoints to the uploader stalled training {stall * 1000:.1f} ms in all, while uploads "
                   f"took {uploading:.2f} s" + ("" if ok else ": the training loop waited for its uploads"))


def _restored_in_place(run: Run, report: Report, launch: int, e: dict) -> None:
    """A launch that ended after reporting a restore (``restored_from_remote``) but before loading
    anything left the restored copy in the checkpoint folder under its name: its rename happened and
    was made durable, a power cut included. Not judged where the launch loaded it (its load says more)
    or where a later fault of the launch took the disk or damaged a checkpoint."""
    ex = run.exit_of(launch)
    if ex is None or any(x.get("t", 0) > e["t"] for x in run.trainer("loaded", launch)):
        return
    if any(x.launch == launch and x.t > e["t"] and (_spec(run, x).loses_disk or _spec(run, x).damages)
           for x in run.faults()):
        return
    here = e["name"] in ex.snapshot.get("checkpoints", {})
    report.add("restored_in_place", here, at=launch, detail=
               f"launch {launch} reported restoring {e['name']} and ended before loading it; the copy is in "
               "the checkpoint folder under that name" if here else
               f"launch {launch} reported restoring {e['name']} from the remote tier (restored_from_remote), but "
               f"when it ended (status {ex.rc}) the checkpoint folder held no {e['name']}: the copy's rename "
               "failed or was never made durable" + _blame(run, ex.t))


def _uploaded_durable(run: Run, report: Report, views: list, damaged: dict) -> None:
    """Each checkpoint the uploader reported durable (``uploaded``) was: at the first view of the
    remote tier after the report it has its manifest there, or a newer checkpoint is durable (remote
    retention deletes one only then, and a view mid-deletion shows the same). A report that no view
    follows is not judged."""
    from ckpt_chaos.probe.layout import parse_name

    claims = run.trainer("uploaded")
    problems, judged = [], 0
    for e in claims:
        after = [v for v in views if v[2] > e["t"]]
        if not after or e["name"] in damaged:
            continue
        label, index, _, remote = min(after, key=lambda v: v[2])
        judged += 1
        held = remote["checkpoints"]
        if e["name"] in held or any(parse_name(n) > parse_name(e["name"]) for n in held):
            continue
        when = f"at fault {index}" if index is not None else f"at the end of launch {label}"
        problems.append(f"the uploader reported {e['name']} durable (uploaded, launch {e.get('attempt')}), but "
                        f"the remote tier's next view ({when}) holds no manifest for it nor any newer durable "
                        "checkpoint: the manifest's put failed or never happened, and a restore would not find "
                        "the checkpoint" + _blame(run, e["t"]))
    if not claims:
        return
    if not judged:
        report.add("uploaded_durable", "unknown", f"{len(claims)} upload(s) reported durable, but no view of the "
                   "remote tier came after any of them (or each was damaged on purpose): none could be checked")
        return
    report.add("uploaded_durable", not problems,
               f"{judged} upload(s) reported durable, each held durable by the remote tier at its next view"
               if not problems else first_few(problems))


def _upload_backoff(run: Run, report: Report) -> None:
    """After its k-th failed attempt at a checkpoint the uploader waits upload_backoff_s * 2^(k-1),
    as configured, before the next: a store that is down is not hammered, and one that is back is
    not kept waiting longer than asked. The wait it reports is the configured one, and the next
    event of that upload came no sooner."""
    if run.s.remote is None:
        return
    retries = [e for e in run.trainer("upload_retry") if e.get("retry_in_s") is not None]
    if not retries:
        return
    by_process: dict[str, list[dict]] = {}
    for e in run.events:
        if e.get("role") == "uploader" and e.get("name") is not None:
            by_process.setdefault(e.get("process"), []).append(e)
    problems = []
    for e in retries:
        launch, k = e.get("attempt", 0), e["upload_attempt"]
        backoff = float(run.config(launch).get("upload_backoff_s", run.s.remote.backoff_s))
        want = backoff * 2 ** (k - 1)
        if not math.isclose(e["retry_in_s"], want, rel_tol=1e-6, abs_tol=1e-9):
            problems.append(f"{e['name']} (launch {launch}): after attempt {k} the uploader waits "
                            f"{e['retry_in_s']:g}s, not upload_backoff_s * 2^{k - 1} = {want:g}s")
            continue
        same = by_process.get(e.get("process"), [])
        nxt = next((x for x in same if x["t"] > e["t"] and x["name"] == e["name"]), None)
        if nxt is not None and nxt["t"] - e["t"] < e["retry_in_s"]:
            problems.append(f"{e['name']} (launch {launch}): after attempt {k} it said it would wait {want:g}s, but "
                            f"its next event ({nxt['event']}) came {nxt['t'] - e['t']:.3f}s later")
    report.add("upload_backoff", not problems,
               f"{len(retries)} retried upload attempt(s), each after the configured backoff" if not problems else
               first_few(problems))


def _upload_retries(run: Run, report: Report) -> None:
    """An upload is given up only after the upload_retries attempts it is configured to make: its
    failed attempts, as its upload_retry events number them, are 1 to upload_retries, and the last
    names no wait (one that says it will retry and then gives up made one attempt fewer than it
    promised). Decided only for uploads the trainer reported giving up (upload_failed)."""
    if run.s.remote is None or not run.trainer("upload_failed"):
        return
    tries: dict[tuple, list[dict]] = {}
    problems, given_up = [], 0
    for e in sorted(run.events, key=lambda e: e["t"]):
        if e["event"] not in ("upload_retry", "upload_failed", "uploaded", "upload_abandoned"):
            continue
        key = (e.get("process"), e.get("name"))
        if e["event"] == "upload_retry":
            tries.setdefault(key, []).append(e)
            continue
        made = tries.pop(key, [])  # an upload's attempts end with it, whatever its end
        if e["event"] != "upload_failed":
            continue
        given_up += 1
        launch = e.get("attempt", 0)
        want = int(run.config(launch).get("upload_retries", run.s.remote.retries))
        numbers = [r.get("upload_attempt") for r in made]
        if numbers != list(range(1, want + 1)):
            problems.append(f"{e['name']} (launch {launch}): given up after {len(made)} failed attempt(s) "
                            f"(numbered {numbers}), but upload_retries={want}")
        elif made[-1].get("retry_in_s") is not None:
            problems.append(f"{e['name']} (launch {launch}): after attempt {want} it said it would retry in "
                            f"{made[-1]['retry_in_s']:g}s, then gave up")
    report.add("upload_retries", not problems,
               f"{given_up} upload(s) given up, each after the upload_retries attempts configured" if not problems
               else first_few(problems))


def _remote_retention(run: Run, report: Report, remote: dict) -> None:
    """After the last upload the remote tier holds the newest ``remote_keep_last`` durable checkpoints
    and nothing older: neither durable ones beyond that nor the objects of uploads that never became
    durable (a bucket that only grows is a bill that only grows)."""
    from ckpt_chaos.probe.layout import parse_name

    keep = int(run.s.trainer.get("remote_keep_last", 2))
    durable, newest = list(remote["checkpoints"]), remote["newest_durable"]
    stale = [n for n in remote["partial"] if newest is not None and parse_name(n) < parse_name(newest)]
    problems = ([f"{len(durable)} durable checkpoints ({', '.join(durable)}), more than remote_keep_last={keep}"]
                if len(durable) > keep else [])
    if stale:
        problems.append(f"objects without a manifest older than the newest durable checkpoint {newest}: "
                        f"{', '.join(stale)} (a deleted checkpoint whose data objects stayed, or a failed upload "
                        "never cleaned up)")
    report.add("remote_retention", not problems,
               f"the remote tier keeps {len(durable)} durable checkpoint(s) (remote_keep_last={keep}) and no "
               "older objects" if not problems else "; ".join(problems))


def _lost_work(run: Run, report: Report) -> None:
    s = run.s
    interval = int(s.trainer.get("ckpt_every_steps", 0) or 0)
    preempted = any(f.spec.notice for f in s.faults)
    limit = s.expect.max_lost_steps
    if limit is None and preempted:
        limit = 0
    elif limit is None and interval:
        # Training goes on while an asynchronous save writes, up to the next save, which waits for it:
        # a kill just before then loses that interval too, less the step that had not begun.
        limit = 2 * interval - 1 if s.trainer.get("async_save") else interval
    total = 0
    for launch in run.launches()[1:]:
        point = run.resume_point(launch)
        if point is None:
            continue
        # the launch before that trained (a relaunch refused for its configuration trains nothing)
        prior = next((p for p in range(launch - 1, -1, -1) if run.last_step(p) or p == 0), launch - 1)
        reached = run.last_step(prior)
        lost = max(0, reached - point[1])
        total += lost
        if limit is not None:
            report.add("lost_work", lost <= limit, at=launch, detail=
                       f"launch {prior} reached step {reached}, launch {launch} resumed at "
                       f"step {point[1]}: {lost} step(s) lost, at most {limit} allowed")
    report.steps_lost = total if report.launches > 1 else 0


# ---- the checks, declared ---------------------------------------------------------------------------

def _always(s: Scenario) -> bool:
    return True


def _remote(s: Scenario) -> bool:
    return s.remote is not None


def _restores(s: Scenario) -> bool:
    """A relaunch may restore from the remote tier: a fault took the local disk."""
    return _remote(s) and relaunched(s) and any(f.spec.loses_disk for f in s.faults)


def _lost_work_limit(s: Scenario) -> bool:
    return (s.expect.max_lost_steps is not None or bool(s.trainer.get("ckpt_every_steps"))
            or any(f.spec.notice for f in s.faults))


# Every check the checker makes, in the order it makes them, with the rule of which scenarios get a
# verdict from it (the checks of a fault kind are its own: ``FaultKind.coverage``). Every run gets
# the harness's, the job's end, the trajectory and the checkpoints left at the end (the reference
# trainer commits checkpoints in every catalogue scenario).
CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec("no_hang", _always, _harness_health),
    CheckSpec("harness_ok", _always, _harness_health),
    CheckSpec("fault_fired", lambda s: bool(s.faults), _faults_fired),
    CheckSpec("fault_landed", lambda s: any(f.when.min_fraction is not None and f.when.point in LANDED_POINTS
                                            for f in s.faults), _faults_landed),
    CheckSpec("job_completed", _always, _completion),
    # the faulted launch fails as the kind says (kinds with an exit check of their own answer instead)
    CheckSpec("fault_job_failed", lambda s: any(f.spec.exit_check is None and (s.expect.job_fails is not None
                                                                               or f.ends_launch) for f in s.faults),
              _fault_effects),
    CheckSpec("trajectory", _always, _trajectory),
    CheckSpec("final_state", lambda s: s.expect.trajectory == "bit-exact", _trajectory),
    CheckSpec("loaded_equals_saved", resumed, _loaded_equals_saved),
    CheckSpec("resume_from", resumed, _resume_choice),
    CheckSpec("resumed_newest_valid", harness_relaunch, _resume_choice),
    CheckSpec("never_loaded_torn", lambda s: harness_relaunch(s) and s.expect.resume_from is not None,
              _resume_choice),
    CheckSpec("config_accepted", lambda s: relaunched(s) and any(not set(c) & refused_keys(s)
                                                                 for c in s.recovery.changes if c), _config_changes),
    CheckSpec("config_refused", lambda s: relaunched(s) and any(set(c) & refused_keys(s) for c in s.recovery.changes),
              _config_changes),
    CheckSpec("cadence", lambda s: s.trainer.get("ckpt_every_steps") is not None, _cadence),
    # n/a where a fault damaged the checkpoint `latest` names; none where the disk is gone with it
    CheckSpec("latest_valid", lambda s: resumed(s) and not any(f.spec.damages or f.spec.loses_disk
                                                               for f in s.faults), _crash_states),
    CheckSpec("committed_survives", resumed, _crash_states),
    CheckSpec("committed_valid", _always, _committed_valid),
    CheckSpec("manifest_facts", reference_family, _manifest_facts),
    CheckSpec("remote_durable_complete", _remote, _remote_tier),
    CheckSpec("restored_durable", _restores, _remote_tier),
    CheckSpec("restored_in_place", _restores, _remote_tier),
    CheckSpec("uploaded_durable", _remote, _remote_tier),
    CheckSpec("final_durable", _remote, _remote_tier),
    CheckSpec("remote_retention", _remote, _remote_tier),
    # an upload attempt fails when a fault cuts or stalls its link (other faults may fail one too)
    CheckSpec("upload_backoff", lambda s: _remote(s) and any(f.spec.on_link for f in s.faults), _remote_tier),
    # decided where an upload was given up, which a fault on its link can make happen
    CheckSpec("upload_retries", lambda s: _remote(s) and any(f.spec.on_link for f in s.faults), _remote_tier),
    CheckSpec("upload_stall", _remote, _remote_tier),
    CheckSpec("lost_work", lambda s: relaunched(s) and _lost_work_limit(s), _lost_work),
    CheckSpec("no_strays", _always, final_directory),
    CheckSpec("retention", _always, final_directory),  # promises.py: exactly what the declared policy keeps
    CheckSpec("retention_kept", lambda s: bool(s.trainer.get("keep_every") or s.trainer.get("keep_best")),
              final_directory),
    CheckSpec("committed_kept", _always, committed_kept),
    CheckSpec("save_failure_policy", lambda s: s.trainer.get("on_save_failure") == "stop", save_failure_policy),
    CheckSpec("detected_in_time", lambda s: s.expect.detect_within_s is not None and relaunched(s),
              detection_timings),
    CheckSpec("reported_timings", _always, reported_timings),  # every catalogue run trains a step and times it
)
