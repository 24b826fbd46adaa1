"""The trajectory against the golden run, and its diagnosis: every step bit for bit (or within
``expect.rel_tol``), the state the job ended with, and for the first divergent step which recorded part
differs and, after a resume, which part of the state it started from is not the golden run's.

One check for every trainer; the reference trainer's diagnosis reads the digests its events give of
what it saved and loaded, a ``[command]`` trainer's the digests the automatic probe layer took.
"""

from __future__ import annotations

import json
from pathlib import Path

from ckpt_chaos.check.evidence import Evidence, Resume
from ckpt_chaos.check.history import final_state, read_jsonl, step_loss, trainer_events, trajectory
from ckpt_chaos.check.verdict import Report, Run, first_few
from ckpt_chaos.probe.run_files import EVENTS, GOLDEN, TRAJECTORY


EXACT_FIELDS = ("loss_hex", "grad_norm_hex", "lr_hex", "batch_digest", "tokens_seen")


COMPONENTS = ("model", "optimizer", "scheduler", "counters", "dataloader", "rng", "grads")


# After a world-size change the job's RNG digest (over its ranks' streams) cannot equal the saved one:
# resize_rng judges, rank by rank, whose stream each went on with.
WORLD_CHANGE_EXEMPT = ("rng",)


EXACT = ("loss_hex", "lr_hex", "samples", "model_digest", "optimizer_digest")


STATE = {"pre_model_digest": "model", "pre_optimizer_digest": "optimizer", "pre_rng": "torch RNG",
         "pre_python_rng": "Python RNG", "pre_numpy_rng": "NumPy RNG"}


def trajectory_check(run: Run, report: Report) -> None:
    """``trajectory`` (and, bit-exact, the reference trainer's ``final_state``): every step of the golden
    run trained, each as the golden run's, with the first divergence diagnosed."""
    if run.s.command is None:
        _reference_trajectory(run, report)
    else:
        ev = run.evidence
        _command_trajectory(run, ev, report, steps_of(run.golden), ev.steps())


def steps_of(run_dir: Path) -> dict[int, dict]:
    """The trajectory of a stored run: step -> record of rank 0; where a relaunch trained a step again, its record wins."""
    return {r["step"]: r for r in read_jsonl(Path(run_dir) / TRAJECTORY)}


def _reference_trajectory(run: Run, report: Report) -> None:
    gold, got = trajectory(run.golden), trajectory(run.dir)
    missing = sorted(set(gold) - set(got))
    if missing:
        report.add("trajectory", False, f"steps {missing[0]}..{missing[-1]} of the golden run were never trained")
        return
    if run.s.expect.trajectory == "bit-exact":
        diffs = [(step, [k for k in EXACT_FIELDS if gold[step].get(k) != got[step].get(k)]) for step in sorted(gold)]
        diffs = [(step, ks) for step, ks in diffs if ks]
        if diffs:
            report.add("trajectory", False, _reference_diagnosis(run, *diffs[0]))
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
            report.add("trajectory", False, _reference_diagnosis(run, step, ["batch_digest"]))
            return
        rel = abs(gold[step]["loss"] - got[step]["loss"]) / max(abs(gold[step]["loss"]), 1e-12)
        if rel > worst:
            worst, worst_step = rel, step
    ok = worst <= tol
    report.add("trajectory", ok, f"same samples at every step; largest relative loss difference {worst:.3%} "
               f"(step {worst_step}), tolerance {tol:.1%}" if ok else
               _reference_diagnosis(run, worst_step, [f"loss off by {worst:.2%} > {tol:.1%}"]))


def _reference_diagnosis(run: Run, step: int, fields_: list[str]) -> str:
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
    diff, same = component_diff(load, exempt=exempt(load))
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


def exempt(load: dict) -> tuple[str, ...]:
    return WORLD_CHANGE_EXEMPT if load.get("saved_world_size", load.get("world_size")) != load.get("world_size") else ()


def component_diff(load: dict, exempt: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    got, saved = load.get("digests") or {}, load.get("saved_digests") or {}
    keys = [k for k in COMPONENTS if (k in got or k in saved) and k not in exempt]
    diff = [k for k in keys if got.get(k) != saved.get(k)]
    return diff, [k for k in keys if k not in diff]


def _command_trajectory(run: Run, ev: Evidence, report: Report, gold: dict, got: dict) -> None:
    missing = sorted(set(gold) - set(got))
    if missing:
        report.add("trajectory", False, f"steps {missing[0]}..{missing[-1]} of the golden run were never trained")
        return
    meta = json.loads((run.golden / GOLDEN).read_text())
    if run.s.expect.trajectory == "bit-exact" and not meta.get("deterministic", True):
        d = meta["differs"]
        report.add("trajectory", False, f"the trainer is not deterministic: two fault-free runs differ at step "
                   f"{d['step']} ({', '.join(d['fields'])}), so no bit-exact comparison can hold; use "
                   "expect.trajectory = \"tolerance\" with a stated rel_tol")
        return
    if run.s.expect.trajectory == "bit-exact":
        for step in sorted(gold):
            fields = [k for k in EXACT if k in gold[step] and gold[step].get(k) != got[step].get(k)]
            if fields:
                report.add("trajectory", False, _command_diagnosis(run, ev, gold, got, step, fields))
                return
        if _past_the_end(run, ev, report, gold, got):
            return
        final = _final_state(run, ev, max(gold))
        if final is not None and final:
            report.add("trajectory", False, f"every loss of the golden run's {max(gold)} steps is identical, but the "
                       f"{' and '.join(final)} state the job ended with differs from the golden run's")
            return
        report.add("trajectory", True, f"{len(gold)} steps identical to the golden run, bit for bit"
                   + (", and the state the job ended with" if final is not None else ""))
        return
    tol, worst, at, unsure = run.s.expect.rel_tol, 0.0, None, None
    for step in sorted(gold):
        if gold[step].get("samples") != got[step].get("samples"):
            resized = _resized_samples(run, gold, got, step)
            if resized is None or resized[0] == "fail":
                report.add("trajectory", False, resized[1] if resized else
                           _command_diagnosis(run, ev, gold, got, step, ["samples"]))
                return
            unsure = unsure or resized[1]
            continue
        a, b = _loss(gold[step]), _loss(got[step])
        rel = abs(a - b) / max(abs(a), 1e-12)
        if rel > worst:
            worst, at = rel, step
    if worst <= tol and _past_the_end(run, ev, report, gold, got):
        return
    if worst <= tol and unsure:
        report.add("trajectory", "unknown", unsure)
        return
    report.add("trajectory", worst <= tol, f"same samples at every step; largest relative loss difference "
               f"{worst:.3%} (step {at}), tolerance {tol:.1%}" if worst <= tol else
               _command_diagnosis(run, ev, gold, got, at, [f"loss off by {worst:.2%} > {tol:.1%}"]))


def _flat(samples) -> set:
    out = set()
    for x in samples or []:
        out |= {repr(i) for i in x} if isinstance(x, list) else {repr(x)}
    return out


def _resized_samples(run: Run, gold: dict, got: dict, step: int) -> tuple[str, str] | None:
    """The verdict on a step whose rank 0 trained on other samples than the golden run's rank 0, where a
    launch at another world size trained it (None where the sizes are the same: a divergence). The
    trajectory holds rank 0's samples only, and rank 0's share of a batch follows the world size, so
    other samples are no fault in themselves; on one rank, though, rank 0's are the job's, and a sample
    golden rank 0 trained at that step missing from it is a step the job did not train as it should."""
    launch = got[step].get("attempt", 0)
    world = run.s.launch_world_size(launch)
    if world == run.s.world_size:
        return None
    head = (f"step {step}, trained by launch {launch} on {world} rank(s) where the golden run had "
            f"{run.s.world_size}")
    if world == 1:
        mine, theirs = _flat(got[step].get("samples")), _flat(gold[step].get("samples"))
        lost = theirs - mine
        if lost:
            return "fail", (f"trajectory diverges at {head}: its one rank trained on {len(theirs) - len(lost)} of "
                            f"the {len(theirs)} samples golden rank 0 trained at that step, where the job must train "
                            "every sample of the golden run's step" + sample_shift(gold, got, step, "samples"))
    return "unknown", (f"at {head}, rank 0 trained on other samples than golden rank 0 (its share of the step "
                       "follows the world size), and the trajectory records rank 0's samples and loss only: whether "
                       "the job trained on the golden run's samples, and its losses, cannot be compared")


def _past_the_end(run: Run, ev: Evidence, report: Report, gold: dict, got: dict) -> bool:
    """Steps the golden run never reached were trained: the job went on past its end, as a trainer
    does whose own step counter a resume did not restore (the optimizer's count, recorded here, went
    on from the checkpoint). Reported as the trajectory's failure; True if so."""
    extra = sorted(set(got) - set(gold))
    if not extra:
        return False
    last = max(gold)
    resume = _resume_before(run, ev, extra[0])
    where = (f"; the optimizer's own count went on from the checkpoint launch {resume[0]} loaded "
             f"({resume[2].checkpoint}) while the trainer counted to its end again: its step counter was not restored"
             if resume is not None and resume[2].checkpoint is not None else "")
    report.add("trajectory", False, f"steps {extra[0]}..{extra[-1]} were trained, past the golden run's last "
               f"step {last} ({len(extra)} step(s) too many; the {last} steps of the golden run are identical)"
               + where)
    return True


def _exit_digests(run_dir: Path) -> dict:
    """The model and optimizer digests rank 0 took as its last process exited."""
    exits = [e for e in read_jsonl(run_dir / EVENTS) if e.get("event") == "exit"]
    return exits[-1] if exits else {}


def _final_state(run: Run, ev: Evidence, last: int) -> list[str] | None:
    """The last update shows in no loss, so the state the job ended with (rank 0's digests at its
    exit) is compared with the golden run's: the parts that differ, or None where either run has
    no such digests (or the job did not end at the golden run's last step, as the last launch's
    steps are numbered: ``Evidence.numbering``)."""
    gold, got = _exit_digests(run.golden), _exit_digests(run.dir)
    keys = [k for k in ("model_digest", "optimizer_digest") if k in gold and k in got]
    launches = run.launches()
    if not keys or got.get("step", 0) + (ev.offset(launches[-1]) if launches else 0) != last:
        return None
    return [k.split("_")[0] for k in keys if gold[k] != got[k]]


_loss = step_loss  # the step's loss as the report's loss plot reads it


def _command_diagnosis(run: Run, ev: Evidence, gold: dict, got: dict, step: int, fields: list[str]) -> str:
    head = f"trajectory diverges at step {step} ({', '.join(fields)})"
    if "samples" in fields:
        head += ": the job trained on different samples than the golden run" + sample_shift(gold, got, step, "samples")
    if "lr_hex" in fields:
        head += (f": the learning rate is {float.fromhex(got[step]['lr_hex']):.6g} where the golden run's was "
                 f"{float.fromhex(gold[step]['lr_hex']):.6g} (the LR schedule's state)")
    resume = _resume_before(run, ev, step)
    if resume is None:
        return head + ", before any resume: the fault changed training itself, or the trainer is not deterministic"
    launch, first, r = resume
    source = (r.checkpoint if r.checkpoint else "nothing (a fresh start)") if r.decided else "a checkpoint not known"
    where = f"; it is {'the first step' if first == step else f'{step - first + 1} steps'} after resuming " \
            f"from {source} (launch {launch})"
    num = ev.numbering(launch)
    if num.offset and num.recorded == 1:
        where += (f", where the optimizer's own step count began again at 1 (its steps are compared as steps "
                  f"{first}..): the optimizer's state was not restored")
    elif num.offset:
        where += (f", where the optimizer's own step count went on from {num.recorded - 1} while {num.basis} say "
                  f"it resumed after step {num.first - 1} (its steps are compared as steps {first}..): the optimizer "
                  f"state it loaded is that of {'a later' if num.offset < 0 else 'an earlier'} step than the "
                  "checkpoint's")
    g, r = gold.get(first, {}), got.get(first, {})
    unstable = json.loads((run.golden / GOLDEN).read_text()).get("unstable", [])
    keys = [k for k in STATE if k in g and k in r and k not in unstable]
    if not keys:
        # the golden run recorded no state before this step; where the optimizer's count ran ahead,
        # the state may be the golden run's of that later step (the model and optimizer, which every step
        # changes; an RNG the trainer never draws from is the same before any step)
        later = gold.get(num.recorded, {}) if num.offset < 0 else {}
        ahead = [STATE[k] for k in ("pre_model_digest", "pre_optimizer_digest")
                 if k in later and k in r and k not in unstable and later[k] == r[k]]
        if ahead:
            return (head + where + f"; the {', '.join(ahead)} state it resumed with is the golden run's before step "
                    f"{num.recorded}, not before step {first}")
        return head + where + "; the state it started from was not recorded, so the cause cannot be narrowed down"
    diff = [STATE[k] for k in keys if g[k] != r[k]]
    same = [STATE[k] for k in keys if g[k] == r[k]]
    if diff:
        return (head + where + f"; the {', '.join(diff)} state it resumed with differs from the golden run's at step "
                f"{first}" + (f" ({', '.join(same)} identical)" if same else ""))
    return (head + where + f"; the {', '.join(same)} state it resumed with equals the golden run's, so the cause is "
            "something none of them captures")


def _resume_before(run: Run, ev: Evidence, step: int) -> tuple[int, int, Resume] | None:
    """(launch, its first step, where it resumed from) of the last relaunch that began at or before ``step``."""
    best = None
    for launch in run.launches()[1:]:
        begins = ev.trained(launch)
        if begins and begins[0] <= step:
            best = (launch, begins[0], ev.resumed_from(launch))
    return best


# ---- whose random stream each rank goes on with after a world-size change ----------------------------

RULES = {"keep": "a rank that was there before goes on with its own saved stream, a new rank with a fresh one",
         "reseed": "every rank goes on with a fresh stream of its own",
         "shared": "every rank goes on with the one stream the saved ranks shared"}


def resize_rng(run: Run, report: Report) -> None:
    """``resize_rng@NAME``: after a resume from ``NAME`` at another world size, whose random stream each
    rank went on with follows the rule the trainer declares (its profile's ``resize_rng``; a ``[command]``
    trainer's ``command.resize_rng``), judged from the digests the probe took of each rank's streams where
    the save captured them (``ckpt.stage``, in the launch that committed it) and where the load had
    restored them (``load.end``)."""
    from ckpt_chaos.probe.profile import profile_of

    if run.s.command is not None:
        _command_resize_rng(run, report)
        return
    p = profile_of(run.s)
    for load in run.trainer("loaded"):
        old, new = load.get("saved_world_size"), load.get("world_size")
        if old is None or new is None or old == new:
            continue
        name, launch = load["name"], load.get("attempt", 0)
        verdict, detail = resize_verdict(p.resize_rng if p is not None else None, old, new,
                                         saved_streams(run, name, launch, load.get("t", float("inf"))),
                                         restored_streams(run, name, launch))
        report.add("resize_rng", verdict, at=name, detail=f"launch {launch} resumed from {name}, saved by {old} "
                   f"rank(s), on {new}: {detail}")


# the loads of the automatic probe layer that set the random streams themselves, so that the digest at
# their load.end is what each rank restored (Accelerator.load_state restores random_states_N.pkl); after
# torch.load or dcp.load the trainer sets its streams from what it loaded, later
RESTORES_RNG = ("accelerate",)


def _command_resize_rng(run: Run, report: Report) -> None:
    import os

    rule = run.s.command.resize_rng
    if "world_size" in run.s.expect.refused:
        return  # resize_refused judges the relaunch on another number of ranks
    for launch in run.launches()[1:]:
        new = run.s.launch_world_size(launch)
        r = run.evidence.resumed_from(launch)
        if new == run.s.world_size or not r.decided or r.checkpoint is None:
            continue  # no resize, or no resume: resumed_newest says which
        name = os.path.basename(r.checkpoint.rstrip("/"))
        ends = [h for h in run.probes("load.end") if h.launch == launch and h.info.get("name") == name
                and not h.info.get("failed")]
        start = min((h.t for h in ends), default=float("inf"))
        saved = saved_streams(run, name, launch, start)
        staged = [h.launch for h in run.probes("ckpt.stage") if h.info.get("name") == name and h.launch < launch]
        old = run.s.launch_world_size(max(staged)) if staged else run.s.world_size
        head = f"launch {launch} resumed from {name}, saved by {old} rank(s), on {new}: "
        raw = sorted({h.info.get("via") or "?" for h in ends} - set(RESTORES_RNG))
        if rule not in RULES:
            verdict, detail = "unknown", ("the trainer declares no rule for its random streams after a world-size "
                                          "change (command.resize_rng: keep, reseed or shared)")
        elif raw:
            verdict, detail = "unknown", (f"the probe's digest at load.end was taken as {', '.join(raw)} returned, "
                                          "before the trainer sets its random streams from what it loaded: what "
                                          "each rank restored is not recorded")
        else:
            verdict, detail = resize_verdict(rule, old, new, saved, restored_streams(run, name, launch))
        report.add("resize_rng", verdict, at=name, detail=head + detail)


def saved_streams(run: Run, name: str, launch: int, before: float) -> dict[int, str | None]:
    """Rank -> the digest of its streams as the save of ``name`` captured them, in the last launch before
    ``launch`` that committed it (else that staged it) before time ``before``."""
    from ckpt_chaos.check.promises import commits

    staged = [h for h in run.probes("ckpt.stage") if h.info.get("name") == name and h.launch < launch and h.t < before]
    committed = {c.launch for c in commits(run) if c.name == name and c.launch < launch and c.t < before}
    by = [h for h in staged if h.launch in committed] or staged
    last = max((h.launch for h in by), default=None)
    return {h.rank: h.info.get("rng") for h in sorted(by, key=lambda h: h.t) if h.launch == last}


def restored_streams(run: Run, name: str, launch: int) -> dict[int, str | None]:
    """Rank -> the digest of its streams once launch ``launch`` had loaded ``name``."""
    return {h.rank: h.info.get("rng") for h in sorted(run.probes("load.end"), key=lambda h: h.t)
            if h.launch == launch and h.info.get("name") == name}


def resize_verdict(rule: str | None, old: int, new: int, saved: dict[int, str | None],
                   got: dict[int, str | None]) -> tuple[str, str]:
    """The verdict and its detail on the streams ``got`` (rank -> digest) that ``new`` ranks went on with,
    resumed from ``saved`` (rank -> digest) of ``old`` ranks, under the declared ``rule`` (``RULES``)."""
    if rule not in RULES:
        return "unknown", ("the trainer declares no rule for its random streams after a world-size change "
                           "(resize_rng in its profile: keep, reseed or shared)")
    missing = [f"saved rank {r}" for r in range(old) if not saved.get(r)]
    missing += [f"rank {r} after the load" for r in range(new) if not got.get(r)]
    if missing:
        return "unknown", (f"the probe recorded no digest of the random streams of {', '.join(missing)} (ckpt.stage "
                           "where the save captured them, load.end where the load restored them): whose stream each "
                           "rank went on with is not known")
    owner: dict[str, int] = {}
    for r in range(old):
        owner.setdefault(saved[r], r)

    def twins(r: int) -> list[int]:
        return [k for k in range(new) if k != r and got[k] == got[r]]

    def whose(r: int) -> str:
        if got[r] in owner:
            return f"saved rank {owner[got[r]]}'s stream"
        return f"the stream of rank {twins(r)[0]}" if twins(r) else "a stream of its own"

    problems = []
    if rule == "shared" and len(set(saved[r] for r in range(old))) > 1:
        problems.append("the saved ranks' streams differ, though the trainer declares them shared")
    for r in range(new):
        if rule == "shared":
            if got[r] != saved[0]:
                problems.append(f"rank {r} went on with {whose(r)}, not the stream the saved ranks shared")
        elif rule == "keep" and r < old:
            if got[r] != saved[r]:
                problems.append(f"rank {r}, there before the change, went on with {whose(r)} instead of its own "
                                "saved stream")
        elif got[r] in owner:
            src = "its own saved stream" if owner[got[r]] == r else f"a copy of saved rank {owner[got[r]]}'s stream"
            problems.append(f"{'new ' if r >= old else ''}rank {r} went on with {src}, not a fresh one")
        elif twins(r):
            problems.append(f"rank {r} went on with the same stream as rank {twins(r)[0]}, not a fresh one of its own")
    if problems:
        return "fail", first_few(problems) + f" (the trainer declares {rule}: {RULES[rule]})"
    if rule == "shared":
        return "pass", f"every rank went on with the stream the {old} saved rank(s) shared, as the trainer declares"
    kept = [r for r in range(min(old, new))] if rule == "keep" else []
    fresh = [r for r in range(new) if r not in kept]
    said = ([f"rank(s) {', '.join(map(str, kept))} with their own saved streams"] if kept else []) + (
        [f"rank(s) {', '.join(map(str, fresh))} with fresh streams, none a copy of a saved rank's or of another "
         "rank's"] if fresh else [])
    return "pass", " and ".join(said) + f", as the trainer declares ({rule})"
