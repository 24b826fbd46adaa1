"""The audit's scenarios, from a trainer's profile (``discover.py``): ordinary scenario files, each with
a comment that says why it exists, the same files for the same profile.

Every fault aims at a save the profile saw: the second (so that a first is there to fall back on),
or the only one. Per family (``FAMILIES``):

* ``mid-write``: a kill at half of each distinct file of that save (one per role: ``rank0.pt`` and
  ``rank1.pt`` are one role), at the point that reports its writer's bytes: ``file.write`` for
  Python's, ``ckpt.shard.write`` for DCP's shards, ``faultfs.write`` for a native writer;
* ``commit``: a kill between the save's data and its commit (the rename of its entry, or its pointer);
* ``power-loss``: power cut right after the save, in both modes of ``power_loss``, and right after
  the rename that commits it (mode entries-kept: the rename kept, un-fsynced data lost);
* ``term``: SIGTERM to the last rank only, and to every rank, between two saves;
* ``disk-full``: the checkpoint file system fills as the save starts, its bytes (``disk_full``) and, apart,
  its inodes (``inodes_full``: the bytes still free);
* ``errno``: EIO on the first write of the save's largest file, and on its fsync;
* ``kill``: every rank killed between two saves;
* ``load``: the relaunch killed as it loads the checkpoint it resumes from;
* ``corrupt`` (only when asked, ``DEFAULT_FAMILIES``): the newest checkpoint damaged (truncated) before
  a kill, for a trainer whose checkpoints are folders (the fault damages the files of a folder);
* ``change`` (one per ``--change KEY=VALUE``, ``changes.py``): every rank killed between two saves, and the
  relaunch given the option changed, expected refused or accepted as the user declares;
* ``resize`` (one per ``--resize N=resumes|refused``, ``changes.with_resize``): every rank killed between two
  saves, and the relaunch on N ranks, expected to resume or to refuse as the user declares; undeclared,
  a row left out that says what to declare.

A fault this machine cannot inject (root, FUSE, tmpfs) is left out with the reason the harness gives
(``faults.requirements``), as is one the profile gives no point for.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ckpt_chaos.audit import DEFAULT_FAMILIES, toml_value
from ckpt_chaos.audit.changes import Change, Resize, with_change, with_resize
from ckpt_chaos.audit.discover import NATIVE, Profile, Save, SeenFile, glob_escape
from ckpt_chaos.probe import follow

SUITE = "audit"
TENTHS = 10  # the probe layer reports a write at each tenth of its planned size (auto_state.TENTHS)


@dataclass
class Generated:
    name: str
    family: str
    point: str
    """Where the fault aims, as the matrix's column says it."""
    fault: str
    """The fault, as the matrix's row says it."""
    text: str
    left_out: str | None = None
    """Why it is not run here (nothing is written for it)."""


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def trainer_name(p: Profile) -> str:
    """A name for the trainer's scenarios: its script's folder and name, else its first words."""
    argv = [a for a in p.command["argv"] if "{" not in a]
    script = next((a for a in argv if a.endswith(".py")), None)
    if script:
        path = Path(script)
        return slug(f"{path.parent.name}-{path.stem}" if path.parent.name else path.stem)
    return slug(" ".join(argv[:2])) or "trainer"


def _command(p: Profile) -> dict:
    c = p.command
    out = {"argv": c["argv"]}
    if c.get("launcher", "torchrun") != "torchrun":
        out["launcher"] = c["launcher"]
    for k in ("relaunch_argv", "env", "key", "watch", "requires"):
        if c.get(k):
            out[k] = c[k]
    if c.get("ckpt_dir", "checkpoints") != "checkpoints":
        out["ckpt_dir"] = c["ckpt_dir"]
    out["complete"] = p.complete
    if p.save_every:
        out["save_every"] = p.save_every
    if c.get("saves_in_flight"):
        out["saves_in_flight"] = c["saves_in_flight"]
    if p.keep_last and isinstance(p.complete, str):  # a pointer names one checkpoint: no set to retain
        out["keep_last"] = p.keep_last
    return out


def _text(p: Profile, why: str, faults: list[dict], tags: list[str], storage: dict | None = None,
          recovery: dict | None = None, expect: dict | None = None, command: dict | None = None) -> str:
    lines = [f"# ckpt-chaos audit: {why}", "# Generated from the trainer's fault-free run; rerun with ckpt-chaos run.",
             f"description = {toml_value(why)}", f"tags = {toml_value(['audit', *tags])}",
             f"world_size = {p.world_size}", f"suites = {toml_value([SUITE])}", "", "[command]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in {**_command(p), **(command or {})}.items()]
    if storage:
        lines += ["", "[storage]"] + [f"{k} = {toml_value(v)}" for k, v in storage.items()]
    for f in faults:
        lines += ["", "[[faults]]"] + [f"{k} = {toml_value(v)}" for k, v in f.items()]
    if recovery:
        lines += ["", "[recovery]"] + [f"{k} = {toml_value(v)}" for k, v in recovery.items()]
    if expect:
        lines += ["", "[expect]"] + [f"{k} = {toml_value(v)}" for k, v in expect.items()]
    return "\n".join(lines) + "\n"


def _reports_at_half(size: int) -> int:
    """How many of one file's write reports have half its bytes or more: one at each tenth of its
    planned size, rounded up, at least a byte apart (``auto_files._Watched._boundary``)."""
    done, n = 0, 0
    while done < size:
        k = done * TENTHS // size + 1
        done = min(size, max(done + 1, -(-k * size // TENTHS)))
        n += done * 2 >= size
    return n


def _mid_write(p: Profile, s: Save, f: SeenFile) -> dict:
    when = {"point": f.point, "rank": f.rank, "path": glob_escape(f.final), "min_fraction": 0.5}
    same = [x for x in _earlier(p, s) for g in x.files if g.final == f.final and g.rank == f.rank]
    if same:  # a file rewritten under the same name every save (a pointer): the k-th save's report
        when["nth"] = len(same) * _reports_at_half(f.size) + 1
    return {"kind": "kill", "target": f"rank:{f.rank}", "when": when}


def _earlier(p: Profile, s: Save) -> list[Save]:
    return p.saves[:p.saves.index(s)]


def _rel(p: Profile, path: str) -> str:
    """A path inside the checkpoint folder, as errno's path glob takes it; a random temporary name
    (safetensors' .tmpXXXXXX) masked as the plan masks it."""
    vocab = {w for s in p.saves for f in s.files for w in follow.WORD.findall(f.final)}
    return follow.masked(path, vocab)[len(p.ckpt_dir.rstrip("/")) + 1:]


def generate(p: Profile, families: tuple[str, ...] = DEFAULT_FAMILIES,
             changes: tuple[Change, ...] = (), resizes: tuple[Resize, ...] = ()) -> list[Generated]:
    """The audit's scenarios for ``p``, in a fixed order, and one per declared relaunch change (``changes``)
    and world-size change (``resizes``), whatever ``families`` says; those this machine cannot run carry
    ``left_out``."""
    if p.complete is None:
        raise ValueError("the profile has no complete rule: " + "; ".join(p.problems))
    name = trainer_name(p)
    target = p.saves[1] if len(p.saves) > 1 else p.saves[0]
    prev = _earlier(p, target)[-1] if _earlier(p, target) else None
    k = p.saves.index(target) + 1
    # between the save before the target and the target: a resume from the one before
    mid = min(target.step, (prev.step if prev else 0) + (p.save_every or 2) // 2 + 1)
    at = f"save {k} (after step {target.step}, {target.entry})"
    writer = target.files[0].rank if target.files else 0
    out: list[Generated] = []

    def add(family: str, point: str, fault: str, why: str, faults: list[dict], tags: list[str], **kw) -> None:
        if family in families:
            n = f"{name}--{slug(family)}--{slug(fault + ' ' + point)}"
            out.append(Generated(n, family, point, fault, _text(p, why, faults, tags, **kw)))

    def skip(family: str, point: str, fault: str, why: str) -> None:
        if family in families:
            n = f"{name}--{slug(family)}--{slug(fault + ' ' + point)}"
            out.append(Generated(n, family, point, fault, "", left_out=why))

    for f in target.roles:
        role = f.role[len(p.ckpt_dir.rstrip("/")) + 1:]
        add("mid-write", role, "kill at half",
            f"rank {f.rank} is SIGKILLed half-way through writing {f.final} ({f.size} bytes, written by "
            f"{f.writer}{' through faultfs, which sees native writers' if f.writer == NATIVE else ''}) in {at}",
            [_mid_write(p, target, f)], ["mid-write"])

    inside = p.ckpt_dir.rstrip("/") + "/"
    outside = sorted({n.rsplit("/", 1)[0] for f in target.files for n in f.names if not n.startswith(inside)})
    before = target.marks.get("before_commit")
    if before:
        what = f"the pointer {target.pointer}" if target.pointer else f"the rename of {target.entry} into place"
        add("commit", "before commit", "kill",
            f"rank {before['rank']} is SIGKILLed after the data of {at} is written ({before['point']} of "
            f"{before.get('path')}) and before {what}",
            [{"kind": "kill", "target": f"rank:{before['rank']}", "when": before}], ["commit"])
    elif target.commit == "in-place":
        skip("commit", "before commit", "kill", f"{at} is written in place: it has no commit step to cut before")
    else:
        skip("commit", "before commit", "kill",
             f"{at} commits by {target.commit}, but no event of its data in the checkpoint folder comes before the "
             f"commit on the committing rank (its data is written elsewhere, {', '.join(outside) or 'unseen'}, and "
             "moved in): no point here to cut between them")

    end = target.marks.get("end")
    # power loss mounts faultfs on the checkpoint folder, which puts a folder the save stages in outside
    # it (TMPDIR) on another file system: the move that was a rename in the fault-free run becomes a
    # copy, and its file points are not those the golden run showed; the next step's start is the
    # same moment after a save that blocks training
    moved_in = bool(outside) and target.step < p.steps
    if moved_in:
        end = {"point": "step.begin", "rank": 0, "step": target.step + 1}
    for mode in ("undo", "entries-kept"):
        if end:
            add("power-loss", "after save", f"power loss {mode}",
                f"power is cut right after {at} ends ({end['point']} of "
                f"{end.get('path') or 'step ' + str(end.get('step'))}, rank {end['rank']}); "
                f"mode {mode}: un-fsynced data lost, and directory entries no folder fsync made durable "
                f"{'undone' if mode == 'undo' else 'kept'}", [{"kind": "power_loss", "mode": mode, "when": end}],
                ["power-loss"])

    commit = target.marks.get("commit")
    if commit and commit["point"] == "file.rename" and moved_in:
        skip("power-loss", "commit", "power loss entries-kept",
             f"{at} is staged in {', '.join(outside)} and moved in: under faultfs, which power loss mounts on the "
             "checkpoint folder, the move is a copy, so the rename that commits it in the fault-free run does not "
             "happen (the power cut after the save covers it)")
    elif commit and commit["point"] == "file.rename":
        # ext4's kind of crash right after the rename: the new name kept, un-fsynced data lost; a save
        # that renamed before its data was fsynced leaves an empty or short file under the final name
        add("power-loss", "commit", "power loss entries-kept",
            f"power is cut right after the rename that commits {at} ({commit.get('path')}), before anything "
            "later makes it durable; mode entries-kept: the rename is kept, un-fsynced data lost",
            [{"kind": "power_loss", "mode": "entries-kept", "when": commit}], ["power-loss"])

    last = p.world_size - 1
    add("term", f"step {mid}", f"SIGTERM rank {last}",
        f"only rank {last} gets SIGTERM (a preemption notice that reached one node) as step {mid} begins, "
        f"between saves; the relaunch resumes from {prev.entry if prev else 'scratch'}",
        [{"kind": "term", "target": f"rank:{last}", "grace_s": 10.0,
          "when": {"point": "step.begin", "rank": last, "step": mid}}], ["preemption"])
    add("term", f"step {mid}", "SIGTERM all",
        f"every rank gets SIGTERM as step {mid} begins (a preemption of the whole job), between saves",
        [{"kind": "term", "target": "all", "grace_s": 10.0, "when": {"point": "step.begin", "rank": 0, "step": mid}}],
        ["preemption"])

    size = sum(f.size for s in p.saves for f in s.files)
    add("disk-full", "save start", "disk full",
        f"the checkpoint file system fills up as {at} starts (after step {target.step}); the relaunch, the disk "
        "freed, must resume from a whole checkpoint",
        [{"kind": "disk_full", "when": {"point": "step.end", "rank": writer, "step": target.step}}], ["disk-full"],
        storage={"fs": "tmpfs", "size_mb": max(16, min(4096, 4 * -(-size // 2**20)))})
    add("disk-full", "save start", "inodes full",
        f"every free inode of the checkpoint file system is taken as {at} starts, its bytes still free: the save "
        "fails at its first create although a free-space check would pass; the relaunch, the inodes given back, "
        "must resume from a whole checkpoint",
        [{"kind": "inodes_full", "when": {"point": "step.end", "rank": writer, "step": target.step}}], ["inodes"],
        storage={"fs": "tmpfs", "size_mb": max(16, min(4096, 4 * -(-size // 2**20)))})

    data = [f for f in target.files if f.final != target.pointer]
    big = max(data, key=lambda f: f.size) if data else None
    # errno's path globs the checkpoint folder: a file staged elsewhere (TMPDIR) is aimed at by its first
    # name inside it, where a copy across file systems writes it
    named = [n for n in big.names if n.startswith(inside)] if big else []
    if big and not named:
        skip("errno", _rel(p, big.final), "EIO on write", f"{big.final} is written outside the checkpoint folder "
             f"({big.names[0]}), where errno's paths do not reach")
    elif big:
        add("errno", _rel(p, named[0]), "EIO on write",
            f"the first write of {named[0]} (the largest file of {at}) fails with EIO",
            [{"kind": "errno", "call": "write", "errno": "EIO", "path": _rel(p, named[0]), "nth_call": 1,
              "target": f"rank:{big.rank}", "when": {"point": "step.end", "rank": big.rank, "step": target.step}}],
            ["errno"])
        synced = next((n for n in named if n in target.fsynced), None)
        if synced:
            add("errno", _rel(p, synced), "EIO on fsync",
                f"the fsync of {synced} (the largest file of {at}) fails with EIO",
                [{"kind": "errno", "call": "fsync", "errno": "EIO", "path": _rel(p, synced), "nth_call": 1,
                  "target": f"rank:{big.rank}", "when": {"point": "step.end", "rank": big.rank, "step": target.step}}],
                ["errno", "fsync"])
        else:
            skip("errno", _rel(p, big.final), "EIO on fsync", f"{big.final} is never fsynced: no fsync to fail "
                 "(the power-loss scenarios show what that costs)")

    add("kill", f"step {mid}", "SIGKILL all",
        f"every rank is SIGKILLed as step {mid} begins, between saves; the relaunch resumes from "
        f"{prev.entry if prev else 'scratch'} and must train on as the fault-free run did",
        [{"kind": "kill", "target": "all", "when": {"point": "step.begin", "rank": 0, "step": mid}}], ["mid-interval"])

    for c in changes:
        fault = f"{c.key} = {toml_value(c.value)} {'refused' if c.refused else 'accepted'}"
        n = f"{name}--change--{slug(c.key + ' ' + str(c.value))}"
        if prev is None:
            out.append(_nothing_to_resume(n, "change", fault, mid))
            continue
        declared = (f"which the user declares a resume must refuse: the relaunch must exit non-zero naming {c.key}, "
                    f"leave its checkpoints as they were, and the next relaunch, as before, resume from {prev.entry}"
                    if c.refused else f"which the user declares a resume may take (--resumable): the relaunch must "
                    f"resume from {prev.entry} and train on")
        tables = with_change({}, c)
        out.append(Generated(n, "change", "relaunch", fault, _text(
            p, f"every rank is SIGKILLed as step {mid} begins and the relaunch is given {c.key} = "
               f"{toml_value(c.value)} on its command line (command.change_argv), {declared}",
            [{"kind": "kill", "target": "all", "when": {"point": "step.begin", "rank": 0, "step": mid}}],
            ["config-change"], recovery=tables["recovery"], expect=tables["expect"])))

    out += _resizes(p, name, resizes, families, prev, mid)

    if prev is None:
        skip("load", "relaunch load", "kill", "the first save is the target: no checkpoint before it to load")
        skip("corrupt", "newest checkpoint", "truncate", "no checkpoint before the target save to corrupt")
        return out
    first = max((f for f in prev.files if f.final != prev.pointer), key=lambda f: f.size, default=None)
    if p.loads_with_torch and first is not None and first.writer == "torch.save":
        load = {"point": "load.begin", "rank": 0}
        how = "its torch.load"
    elif first is not None:
        load = {"point": "faultfs.open", "rank": 0, "path": glob_escape(first.final)}
        how = f"its open of {first.final} (faultfs: whatever reads it)"
    else:
        load = None
    if load:
        add("load", "relaunch load", "kill",
            f"every rank is SIGKILLed as step {mid} begins; the relaunch's rank 0 is SIGKILLed again at {how}; "
            f"the third launch must resume from {prev.entry} once more: a load only reads",
            [{"kind": "kill", "target": "all", "when": {"point": "step.begin", "rank": 0, "step": mid}},
             {"kind": "kill", "target": "rank:0", "attempt": 1, "when": load}], ["load", "double-fault"],
            recovery={"max_restarts": 2})
    folder = [f for f in prev.files if prev.entry and f.final.startswith(f"{p.ckpt_dir.rstrip('/')}/{prev.entry}/")]
    if folder:
        victim = max(folder, key=lambda f: f.size)
        base = victim.final.rsplit("/", 1)[1]
        add("corrupt", "newest checkpoint", "truncate",
            f"{base} of the newest checkpoint, {prev.entry}, is truncated to half as step {mid} begins and every rank "
            "is SIGKILLed: the relaunch must not train on from a damaged checkpoint",
            [{"kind": "corrupt", "corruption": "truncate", "file": glob_escape(base), "checkpoint": prev.entry,
              "when": {"point": "step.begin", "rank": 0, "step": mid}},
             {"kind": "kill", "target": "all", "when": {"point": "step.begin", "rank": 0, "step": mid}}],
            ["corruption"])
    else:
        skip("corrupt", "newest checkpoint", "truncate",
             f"the corrupt fault damages the files of a checkpoint folder, and this trainer's checkpoints are "
             f"single files ({prev.entry})")
    return out


def _resizes(p: Profile, name: str, resizes: tuple[Resize, ...], families: tuple[str, ...], prev: Save | None,
             mid: int) -> list[Generated]:
    """A scenario per declared world-size change: every rank killed as step ``mid`` begins (the ``kill``
    family's fault), the first relaunch on another number of ranks. Undeclared, a row left out saying
    what to declare (in the ``resize`` family): whether a trainer may resume on another number of ranks
    is its own promise, which no run shows."""
    kill = [{"kind": "kill", "target": "all", "when": {"point": "step.begin", "rank": 0, "step": mid}}]
    other = 1 if p.world_size > 1 else 2
    if p.command.get("launcher", "torchrun") == "self":
        why = ("the trainer starts its own ranks (--launcher self): how many is its command's to say, not a "
               "relaunch's to change")
        return [Generated(f"{name}--resize--{r.world}-ranks", "resize", "relaunch", f"{r.world} ranks", "",
                          left_out=why) for r in resizes] or (
            [Generated(f"{name}--resize--world-size-change", "resize", "relaunch", "world size change", "",
                       left_out=why)] if "resize" in families else [])
    if not resizes:
        return [Generated(f"{name}--resize--world-size-change", "resize", "relaunch", "world size change", "",
                          left_out=f"declare --resize {other}=resumes or {other}=refused: whether a trainer may "
                                   "resume on another number of ranks is its own promise")] \
            if "resize" in families else []
    out = []
    for r in resizes:
        word = "resumes" if r.resumes else "refused"
        n, fault = f"{name}--resize--{r.world}-ranks-{word}", f"{r.world} ranks {word}"
        if prev is None:
            out.append(_nothing_to_resume(n, "resize", fault, mid))
            continue
        declared = (f"which the user declares it refuses: the relaunch must exit non-zero, train no step and leave "
                    f"its checkpoints as they were, and the next relaunch, on {p.world_size} rank(s) again, resume "
                    f"from {prev.entry}" if not r.resumes else
                    f"which the user declares it takes: it must resume from {prev.entry}, the newest whole checkpoint, "
                    f"and train on within {with_resize({}, r)['expect']['rel_tol']:.0%} of the fault-free "
                    f"run's losses (bit for bit is not promised across a world-size change), each rank's random "
                    f"stream as rule {r.rng} says (command.resize_rng)")
        tables = with_resize({}, r)
        out.append(Generated(n, "resize", "relaunch", fault, _text(
            p, f"every rank is SIGKILLed as step {mid} begins and the job is relaunched on {r.world} rank(s) instead "
               f"of {p.world_size}, {declared}", kill, ["world-size-change"], recovery=tables["recovery"],
            expect=tables["expect"], command=tables["command"])))
    return out


def _nothing_to_resume(name: str, family: str, fault: str, mid: int) -> Generated:
    """A relaunch case (an option or the world size changed) left out: no save before the target one."""
    return Generated(name, family, "relaunch", fault, "", left_out=(
        f"the first save is the target: a relaunch as step {mid} begins has no checkpoint to resume or to "
        "refuse to resume"))


def check(gen: list[Generated], folder: Path, golden: Path | None = None) -> list[Generated]:
    """Load each scenario as ``ckpt-chaos run`` will (a malformed one is a bug here: it raises), and
    mark those whose faults this machine cannot inject as left out, with the harness's reason. With
    the golden run it was generated from, hold each trigger to it as the run will
    (``command.check_triggers``; those on faultfs's points need a golden run under faultfs, which
    the run makes): a refused one is left out, saying so, rather than run to an error."""
    from ckpt_chaos.faults import requirements
    from ckpt_chaos.run.command import check_triggers, uses_faultfs
    from ckpt_chaos.scenario import ScenarioError, from_dict

    for g in gen:
        if g.left_out:
            continue
        s = from_dict(tomllib.loads(g.text), str(folder / f"{g.name}.toml"), g.name)
        why = requirements(s)
        if why:
            g.left_out = f"cannot inject {why}"
        elif golden is not None and not uses_faultfs(s):
            try:
                check_triggers(s, golden)
            except ScenarioError as e:
                g.left_out = f"the harness refuses its trigger (a bug of the audit's generation): {e}"
    return gen


def write(gen: list[Generated], folder: Path) -> list[Path]:
    """The scenarios that run here, as files in ``folder`` (the audit's own earlier files replaced)."""
    folder.mkdir(parents=True, exist_ok=True)
    names = {g.name for g in gen if g.left_out is None}
    for old in folder.glob("*.toml"):
        if old.stem not in names and old.read_text().startswith("# ckpt-chaos audit:"):
            old.unlink()
    out = []
    for g in gen:
        if g.left_out is None:
            path = folder / f"{g.name}.toml"
            path.write_text(g.text)
            out.append(path)
    return out
