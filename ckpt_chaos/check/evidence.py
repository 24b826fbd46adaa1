"""What each launch of a ``[command]`` trainer did to its checkpoint files, from every source a stored
run holds, and the one answer to "which checkpoint did launch N resume from" that every check, every
diagnosis and the report take.

The sources, most precise first:

* a load a patch of the probe layer recognised (``load.begin``: ``torch.load``, ``dcp.load``,
  Accelerate's ``load_state``): the path it loaded, the first load that raised no error (one that
  raised was tried and left: a trainer that falls back to an older checkpoint on an error);
* the files of the checkpoint folder the launch's processes opened to read before they first wrote
  there: through Python (the layer's ``file.read``: ``json.load``, ``pickle``, ``np.load``) and, as
  root, through fanotify (``files.jsonl``), which sees every reader, native ones (safetensors, mmap,
  C++) included. Where several checkpoints were read (a trainer that looks at each before choosing),
  the one with the most bytes read from is the one it resumed from, the later one on a tie; one
  whose files were all opened before any of it was, it tried and went on from;
* the trajectory: the step a launch began at is the optimizer's own count (held to the trainer's
  own where they differ: ``Evidence.numbering``), so a launch that began at step s resumed the state
  of step s-1, which a checkpoint written right after step s-1 holds; a launch that began at step 1
  with the golden run's first loss started from the initial model.

Where none of them decides, the answer is undecided and says what was missing: a check turns that
into ``unknown``, never into ``fail``.

A checkpoint is named by its entry in the checkpoint folder (``checkpoints/step_8`` for every file
in that folder, ``checkpoints/step_8.pt`` for a file).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ckpt_chaos.check.history import read_jsonl, trajectory_records
from ckpt_chaos.check.names import step_in_name, within
from ckpt_chaos.probe import follow
from ckpt_chaos.probe.run_files import FILES, LISTING, PROBE_LOG, TRAJECTORY

WRITES = ("file.write", "file.done", "ckpt.shard.write", "ckpt.shard.done", "ckpt.metadata", "ckpt.stage",
          "file.rename", "file.copy", "faultfs.write", "faultfs.done", "faultfs.rename")
DONE = ("file.done", "ckpt.shard.done", "faultfs.done", "file.rename", "faultfs.rename", "ckpt.metadata")
NO_FANOTIFY = ("which files it opened is not known: the run has no fanotify record (the harness records every "
               "process's opens as root; run it as root to have them)")


@dataclass
class Read:
    path: str
    source: str  # "probe layer" | "fanotify"
    t: float
    size: int | None = None
    failed: str | None = None  # its process died failing to find it (the layer's record of the error)


@dataclass
class Resume:
    """Where launch ``launch`` resumed from: ``checkpoint`` (None: it started fresh) when ``decided``;
    else ``missing`` says what evidence would have told."""

    launch: int
    decided: bool
    checkpoint: str | None = None
    how: str = ""  # the evidence, in words
    first_step: int | None = None
    files: list[str] = field(default_factory=list)  # the checkpoint files it read, where seen
    missing: str = ""
    # checkpoints it read before ``checkpoint`` and went on from: a load that raised, or files of
    # another checkpoint opened before it read any of its own (a fall back on an error)
    tried: list[str] = field(default_factory=list)
    died: bool = False  # it took ``checkpoint`` but died before it loaded it (a file it lacks)

    def label(self) -> str:
        """For a report column: the checkpoint, "scratch", or "?"."""
        return "?" if not self.decided else self.checkpoint or "scratch"


def _tried(reads: list[Read], chosen: str, checkpoint_of) -> list[str]:
    """The checkpoints a launch read before the one it resumed from (``chosen``, by the most bytes read)
    and went on from: in every source that saw both, each of their files was opened before the first
    of ``chosen``'s (each source stamps its own in order; fanotify later than the others)."""
    first: dict[tuple[str, str], float] = {}  # (source, checkpoint) -> its first read
    last: dict[tuple[str, str], float] = {}
    for r in reads:
        key = (r.source, checkpoint_of(r.path))
        first[key] = min(r.t, first.get(key, r.t))
        last[key] = max(r.t, last.get(key, r.t))
    others = dict.fromkeys(c for _, c in first if c != chosen)
    out = []
    for c in others:
        both = [src for src, x in first if x == c and (src, chosen) in first]
        if both and all(last[src, c] < first[src, chosen] for src in both):
            out.append(c)
    return out


def _basis(by_samples: int | None) -> str:
    return "its name and the samples it trained on" if by_samples is not None else "its name"


@dataclass(frozen=True)
class Numbering:
    """A launch's numbering: ``offset`` added to its recorded steps; where not 0, ``recorded`` (its
    first step as the optimizer's count said), ``first`` (as the job's) and ``basis`` (what said so)."""

    offset: int
    recorded: int | None = None
    first: int | None = None
    basis: str = ""


class Evidence:
    """The evidence of one stored run, computed once and shared by its checks."""

    def __init__(self, run):
        self.run = run
        self.ckpt = run.s.command.ckpt_dir.strip("/") if run.s.command else "checkpoints"
        self.log = read_jsonl(run.dir / FILES) if (run.dir / FILES).exists() else []
        self.traj = trajectory_records(run.dir)
        self.gold_traj = {r["step"]: r for r in read_jsonl(run.golden / TRAJECTORY)}
        self._resumes: dict[int, Resume] = {}
        self._saved: dict[str, int] | None = None
        self._numbering: dict[int, Numbering] = {}
        self._gold: tuple[dict[str, int], set[str], frozenset[str]] | None = None
        self._aliases: dict[str, list[str]] = {}  # a file being written -> its golden run's names (faultfs)
        self._lefts: dict[int, tuple[dict[str, str], dict[str, str]]] = {}

    # ---- names -------------------------------------------------------------------------------------

    def checkpoint_of(self, path: str | None) -> str | None:
        """The checkpoint a path belongs to: its entry in the checkpoint folder, or deeper where the
        pointer's ``format`` puts checkpoints in a folder of their own (Ray Train's ``run/{}``); None
        outside it."""
        if not path or not path.startswith(self.ckpt + "/"):
            return None
        complete = self.run.s.command.complete if self.run.s.command else None
        fmt = complete.get("format") if isinstance(complete, dict) else None
        depth = len(fmt.split("/")) if fmt else 1
        return "/".join([self.ckpt, *path[len(self.ckpt) + 1:].split("/")[:depth]])

    # ---- what was watched ----------------------------------------------------------------------------

    def fanotify(self, launch: int) -> tuple[bool, str]:
        """Whether fanotify watched the launch, and if not why (one line)."""
        for r in self.log:
            if r.get("launch") == launch and r.get("op") == "watch":
                return True, ""
            if r.get("launch") == launch and r.get("op") == "unavailable":
                return False, f"which files it opened is not known: fanotify could not watch ({r.get('why')})"
        return False, NO_FANOTIFY

    # ---- reads and writes ------------------------------------------------------------------------------

    def _file_ops(self, launch: int) -> tuple[list[Read], float | None]:
        """fanotify's reads of the checkpoint folder by the launch's job processes (an open whose close
        wrote nothing), and when the launch first wrote there."""
        reads, first_write, opened = [], None, {}
        for r in self.log:
            if r.get("launch") != launch or r.get("job") is False or r.get("dir"):
                continue
            op, path, t = r.get("op"), r.get("path", ""), r.get("t", 0.0)
            if not path.startswith(self.ckpt + "/"):
                continue
            if op == "open":
                opened.setdefault((r.get("pid"), path), t)
            elif op == "close":
                t0 = opened.pop((r.get("pid"), path), t)
                if r.get("wrote"):
                    first_write = t0 if first_write is None else min(first_write, t0)
                else:
                    reads.append(Read(path, "fanotify", t0, r.get("size")))
            elif op in ("create", "rename"):
                first_write = t if first_write is None else min(first_write, t)
        # An open with no close of its own name is a file renamed while open (on faultfs the close
        # carries the new name): a writer's temporary file, not a read.
        return reads, first_write

    def reads(self, launch: int) -> list[Read]:
        """The checkpoint-folder files the launch opened to read before it first wrote there.

        Each source's reads are held to its own first write: the file-event recorder stamps events
        when it reads them, later than the process's own probes stamp theirs, so a read it saw
        before a write can bear a later time than the probe's record of that write."""
        logged, logged_write = self._file_ops(launch)
        probes = [h for h in self.run.probes() if h.launch == launch]
        writes = [h.t for h in probes if h.point in WRITES and str(h.info.get("path", "")).startswith(self.ckpt + "/")]
        probed_write = min(writes) if writes else logged_write
        probed = [Read(h.info["path"], "probe layer" if h.point == "file.read" else "faultfs", h.t, h.info.get("size"),
                       h.info.get("failed"))
                  for h in probes if h.point in ("file.read", "faultfs.open")
                  and str(h.info.get("path", "")).startswith(self.ckpt + "/")]
        if logged_write is None:
            logged_write = probed_write
        return sorted([r for r in logged if logged_write is None or r.t <= logged_write]
                      + [r for r in probed if probed_write is None or r.t <= probed_write], key=lambda r: r.t)

    def first_step(self, launch: int) -> int | None:
        steps = [r["step"] for r in self.traj if r.get("attempt", 0) == launch]
        return steps[0] if steps else None

    def offset(self, launch: int) -> int:
        """What to add to a launch's recorded steps (``numbering``)."""
        return self.numbering(launch).offset

    def numbering(self, launch: int) -> Numbering:
        """How a relaunch's recorded steps map to the job's. The layer numbers steps by the optimizer's
        own count, which is the job's step only where the optimizer state the relaunch loaded is that
        of the checkpoint's step. It is held to the step the trainer itself records, the one in the
        checkpoint's name (``step_8``, ``global_step8``, ``epoch=0-step=8``, ``iter_0000008``,
        ``checkpoint-8``), with the samples the relaunch's first steps trained on (the golden run's
        steps with the same ids) as the witness, or where none were recorded the time its checkpoint
        was written (``saved_steps``):

        * an optimizer whose state was not restored counts from 1 again while the relaunch trains
          steps k+1.. of the job (unless its first loss is the golden run's first: it started over);
        * an optimizer state of a later step than the checkpoint's (a writer thread handed the live
          state) counts on from that later step: the name and the samples both say step k+1 where the
          count says more. A name the samples contradict (a data position not restored) leaves the
          count as it is."""
        if launch not in self._numbering:
            self._numbering[launch] = self._numbered(launch)
        return self._numbering[launch]

    def _numbered(self, launch: int) -> Numbering:
        recs = [x for x in self.traj if x.get("attempt", 0) == launch]
        r = self.resumed_from(launch) if launch else None
        if not recs or r is None or not (r.decided and r.checkpoint):
            return Numbering(0)
        count = recs[0]["step"]
        named = step_in_name(r.checkpoint)
        by_name = None if named is None else named + 1
        by_samples = self._sample_step(recs)
        saved = self.saved_steps().get(r.checkpoint)
        by_time = None if saved is None else saved + 1
        if count == 1:
            if recs[0].get("loss_hex") and recs[0]["loss_hex"] == self.gold_traj.get(1, {}).get("loss_hex"):
                return Numbering(0)
            if by_name is not None and by_samples in (None, by_name):
                return Numbering(by_name - 1, count, by_name, _basis(by_samples))
            return Numbering(saved or 0, count, by_time, "the time it was written") if saved else Numbering(0)
        if by_name is None or by_name == count:
            return Numbering(0)
        if by_samples is not None and by_samples != by_name:
            return Numbering(0)  # the samples side with the optimizer's count, or with neither
        if by_samples is None and by_time == count:
            # the time witnesses the state's step, which is the count's wherever the state was handed
            # over live; a state that is the golden run's before step ``count`` trained on another
            # step's data says the count followed the state, and the name the trainer's own step
            if not self._state_ahead(recs[0], count):
                return Numbering(0)
            return Numbering(by_name - count, count, by_name, _basis(by_samples))
        return Numbering(by_name - count, count, by_name, _basis(by_samples))

    def _state_ahead(self, rec: dict, count: int) -> bool:
        """Whether the launch's first record (``rec``, numbered ``count`` by the optimizer) began from the
        golden run's model and optimizer state before step ``count`` (their digests, both recorded) yet
        made another loss than the golden run's step ``count``: the state is of that step, its data not."""
        gold = self.gold_traj.get(count, {})
        keys = [k for k in ("pre_model_digest", "pre_optimizer_digest") if k in gold and k in rec]
        return (bool(keys) and all(gold[k] == rec[k] for k in keys)
                and bool(rec.get("loss_hex")) and bool(gold.get("loss_hex")) and rec["loss_hex"] != gold["loss_hex"])

    def _sample_step(self, recs: list[dict]) -> int | None:
        """The golden run's step whose samples the launch's first steps (up to three) trained on, where
        exactly one step of it fits."""
        head = [x.get("samples") for x in recs[:3]]
        if not head or head[0] is None:
            return None
        fits = [g for g in self.gold_traj if all(self.gold_traj.get(g + j, {}).get("samples") == ids
                                                 for j, ids in enumerate(head) if g + j in self.gold_traj)]
        return fits[0] if len(fits) == 1 else None

    def trained(self, launch: int) -> list[int]:
        """The steps of the job a launch trained, in order (rank 0's records, renumbered by ``offset``)."""
        off = self.offset(launch)
        return [x["step"] + off for x in self.traj if x.get("attempt", 0) == launch]

    def steps(self) -> dict[int, dict]:
        """Step of the job -> rank 0's record; where a relaunch trained a step again, its record wins."""
        return {x["step"] + self.offset(x.get("attempt", 0)): x for x in self.traj}

    def saved_steps(self) -> dict[str, int]:
        """Checkpoint -> the step whose state it holds: the last step a launch had trained when it last
        wrote to that checkpoint (the trajectory's times against the write's)."""
        if self._saved is None:
            self._saved = self._saved_steps()
        return self._saved

    def _saved_steps(self) -> dict[str, int]:
        by_launch: dict[int, list[tuple[float, int]]] = {}
        for r in self.traj:
            if "t" in r:
                by_launch.setdefault(r.get("attempt", 0), []).append((r["t"], r["step"]))
        # (launch, checkpoint) -> when that launch last finished writing it. The probe layer stamps a
        # write in the writing process; the file-event recorder stamps a batch of events when it reads
        # them, which can be after the trainer's next step: its time counts only where no probe saw it.
        probed: dict[tuple[int, str], float] = {}
        logged: dict[tuple[int, str], float] = {}
        for h in self.run.probes():
            ckpt = self.checkpoint_of(h.info.get("path", "")) if h.point in DONE and "path" in h.info else None
            if ckpt is not None:
                probed[h.launch, ckpt] = max(h.t, probed.get((h.launch, ckpt), h.t))
        for r in self.log:
            if (r.get("op") == "close" and r.get("wrote")) or r.get("op") in ("rename", "create"):
                ckpt = self.checkpoint_of(r.get("path", ""))
                key = (r.get("launch", 0), ckpt)
                if ckpt is not None:
                    logged[key] = max(r.get("t", 0.0), logged.get(key, 0.0))
        out: dict[str, int] = {}
        for (launch, ckpt), t in sorted({**logged, **probed}.items()):  # a later launch's write wins
            steps = [s for ts, s in by_launch.get(launch, []) if ts <= t]
            if steps:
                out[ckpt] = steps[-1]
        return out

    # ---- where a launch resumed from -------------------------------------------------------------------

    def resumed_from(self, launch: int) -> Resume:
        if launch not in self._resumes:
            self._resumes[launch] = self._resumed_from(launch)
        return self._resumes[launch]

    def _loads(self, launch: int) -> tuple[list, list]:
        """The launch's loads a patch of the probe layer recognised (``load.begin``), but those that
        raised (their ``load.end`` says ``failed``), and those that raised; of every rank."""
        begun: dict[tuple[int, int], list] = {}
        ok, failed = [], []
        for h in self.run.probes():
            if h.launch != launch or h.point not in ("load.begin", "load.end"):
                continue
            if h.point == "load.begin":
                begun.setdefault((h.rank, h.pid), []).append(h)
                ok.append(h)
            elif h.info.get("failed") and begun.get((h.rank, h.pid)):
                b = begun[(h.rank, h.pid)].pop()
                ok.remove(b)
                failed.append(b)
            elif begun.get((h.rank, h.pid)):
                begun[(h.rank, h.pid)].pop()
        return ok, failed

    def _resumed_from(self, launch: int) -> Resume:
        first = self.first_step(launch)
        every_ok, every_failed = self._loads(launch)

        def went_on(f) -> bool:  # its process loaded something after it that did not raise
            return any(o.rank == f.rank and o.pid == f.pid and o.t > f.t for o in every_ok)

        loads = [h for h in every_ok if h.rank == 0] or every_ok  # rank 0's where it loaded
        failed = [h for h in every_failed if h.rank == 0] or every_failed
        reads = self.reads(launch)
        # a file whose load raised in a process that loaded nothing after it was read, and that process
        # ended in it (a rank that cannot load its own shard), whatever the other ranks went on to load
        files = sorted({r.path for r in reads} | {f.info["path"] for f in every_failed
                                                 if f.info.get("path") and not went_on(f)})
        if loads or failed:
            # the load that ended without an error is the resume; one that raised was tried and left
            # where its process went on to another load (a fall back on an error), unless no load
            # succeeded: the launch ended in it
            h = (loads or failed)[0]
            path = h.info.get("path")
            tried = [] if not loads else list(dict.fromkeys(
                self.checkpoint_of(f.info.get("path")) or f.info.get("path") for f in failed
                if f.t <= h.t and went_on(f)))
            how = f"its {h.info.get('via', 'load')}" + (
                f", after {', '.join(tried)} failed to load ({failed[0].info.get('via', 'load')})" if tried else "")
            return Resume(launch, True, self.checkpoint_of(path) or path, how, first, files, tried=tried)
        if reads:
            size = self._sizes(launch - 1)
            weight: dict[str, tuple[int, float]] = {}
            for r in reads:
                ckpt = self.checkpoint_of(r.path)
                n, _ = weight.get(ckpt, (0, 0.0))
                weight[ckpt] = (n + (r.size if r.size is not None else size.get(r.path, 0)), r.t)
            ckpt = max(weight, key=lambda c: weight[c])
            sources = " and ".join(sorted({r.source for r in reads}))
            tried = _tried(reads, ckpt, self.checkpoint_of)
            lacked = {r.path: r.failed for r in reads if r.failed}
            opened = [f for f in files if f not in lacked]
            how = ([f"{sources} saw it open {', '.join(opened[:6])}{' ...' * (len(opened) > 6)}"] * bool(opened)
                   + [f"its process died looking for {', '.join(f'{p} ({e})' for p, e in sorted(lacked.items()))}"]
                   * bool(lacked) + [f"it opened {', '.join(tried)} first and went on from it"] * bool(tried))
            return Resume(launch, True, ckpt, "; ".join(how), first, files, tried=tried, died=bool(lacked) and not opened)
        watched, why = self.fanotify(launch)
        if watched:
            if first is None:
                return Resume(launch, False, first_step=first, missing=f"launch {launch} opened no checkpoint file "
                              "and trained no step: it ended before it resumed")
            if first == 1:
                return Resume(launch, True, None, "fanotify saw none of its processes open a file of the "
                              "checkpoint folder, and it began at step 1", first)
            return Resume(launch, False, first_step=first, missing=f"launch {launch} began at step {first}, so it "
                          f"resumed the state of step {first - 1}, but none of its processes opened a file of the "
                          f"checkpoint folder {self.ckpt}: it read its state from elsewhere")
        return self._from_trajectory(launch, first, why)

    def _from_trajectory(self, launch: int, first: int | None, why: str) -> Resume:
        if first is None:
            return Resume(launch, False, first_step=first, missing=f"no load of a known framework was seen, {why}, "
                          f"and launch {launch} trained no step")
        if first == 1:
            got = next((r for r in self.traj if r.get("attempt", 0) == launch), {})
            gold = self.gold_traj.get(1, {})
            if gold.get("loss_hex") and got.get("loss_hex") == gold.get("loss_hex"):
                return Resume(launch, True, None, "it began at step 1 with the golden run's first loss, bit for "
                              "bit: the initial model", first)
            return Resume(launch, False, first_step=first, missing=f"launch {launch} began at step 1 but its first "
                          f"loss differs from the golden run's, so it may have loaded a model without the "
                          f"optimizer's step count; no load of a known framework was seen, and {why}")
        before = self.run.exit_of(launch - 1)
        left = None if before is None else before.complete if before.complete is not None else before.files
        there = None if left is None else {self.checkpoint_of(p) for p in left}
        holds = [c for c, step in self.saved_steps().items() if step == first - 1 and (there is None or c in there)]
        if len(holds) == 1:
            return Resume(launch, True, holds[0], f"inferred: it began at step {first} and {holds[0]} holds step "
                          f"{first - 1}; no load of a known framework was seen, and {why}", first)
        return Resume(launch, False, first_step=first, missing=f"launch {launch} began at step {first}, so it "
                      f"resumed the state of step {first - 1}, but "
                      + ("no checkpoint counted complete is known to hold that step" if not holds else
                         f"{', '.join(sorted(holds))} all hold that step") + f"; no load of a known framework was "
                      f"seen, and {why}")

    # ---- what a launch left behind ---------------------------------------------------------------------

    def _sizes(self, launch: int) -> dict[str, int]:
        ex = self.run.exit_of(launch)
        return dict(ex.files or {}) if ex is not None else {}

    def golden_files(self) -> dict[str, int]:
        """The golden run's checkpoint files with their sizes, under their final names: a file renamed
        into place (``write → fsync → close → rename``, a temporary named by pid or a fixed one) is
        followed through its renames, as faultfs (``faultfs.rename``), the probe layer (``file.rename``)
        and fanotify saw them; on faultfs fanotify sees the temporary file's close but not its rename, so
        what faultfs and the layer saw renamed away is no file of a checkpoint. The files of a folder
        renamed as a whole (a save's staging folder) count under both names."""
        return self._golden()[0]

    def _golden(self) -> tuple[dict[str, int], set[str], frozenset[str]]:
        """(golden_files, the names a file of the golden run was renamed away from, the words of the
        names its files kept: ``follow.plan``'s vocabulary)."""
        if self._gold is not None:
            return self._gold
        out: dict[str, int] = {}
        listing = self.run.golden / LISTING
        if listing.exists():
            out.update(json.loads(listing.read_text()))
        events = read_jsonl(self.run.golden / PROBE_LOG) if (self.run.golden / PROBE_LOG).exists() else []
        gone: set[str] = set()
        for f in follow.files(events):  # each file written, through every rename, in the order they came
            names = f["names"]
            out[names[-1]] = max(out.get(names[-1], 0), f["size"])
            for a, b in zip(names, names[1:]):
                if os.path.basename(a) != os.path.basename(b):
                    gone.add(a)  # the file itself was renamed: that name held it only while it was written
                else:
                    out[a] = max(out.get(a, 0), f["size"])  # its folder was
        kept = set(out)
        gold_log = self.run.golden / FILES
        for r in (read_jsonl(gold_log) if gold_log.exists() else []):
            if r.get("op") == "rename" and not r.get("dir"):
                size = out.pop(r.get("src", ""), None)
                gone.add(r.get("src", ""))
                if size is not None:
                    out[r["path"]] = max(out.get(r["path"], 0), size)
            elif r.get("op") == "rename":
                out.pop(r.get("src", ""), None)
            elif r.get("op") == "close" and r.get("wrote") and r.get("size") is not None:
                if r["path"] in gone and r["path"] not in kept:
                    continue  # on faultfs: a temporary name faultfs saw renamed, whose rename fanotify misses
                out[r["path"]] = max(out.get(r["path"], 0), r["size"])  # fanotify sees native writes too
        vocab = frozenset(follow.plan(events)["vocab"])
        self._gold = ({p: s for p, s in out.items() if p.startswith(self.ckpt + "/")}, gone - set(out), vocab)
        return self._gold

    def _golden_size(self, path: str, aliases: list[str] | tuple = ()) -> tuple[str | None, int | None]:
        """The golden run's file that ``path`` is (itself, or the final name among the golden run's
        names of it, ``aliases``) and its size."""
        gold = self.golden_files()
        for name in (path, *aliases):
            if name in gold:
                return name, gold[name]
        return None, None

    def temporary(self, path: str, aliases: list[str] | tuple = ()) -> bool:
        """``path``, inside a checkpoint folder, is a temporary name: no file of the golden run's
        checkpoints, but the name a file was written under and then renamed from (that very name, the
        same name with its random or pid part, masked as ``follow`` masks it, or a file of the golden
        run that faultfs found it to be, ``aliases``)."""
        ckpt = self.checkpoint_of(path)
        gold, gone, vocab = self._golden()
        if ckpt is None or ckpt == path or path in gold:
            return False
        if any(a in gold and a != path for a in aliases):
            return True
        key = follow.masked(path, vocab)
        return path in gone or any(follow.masked(g, vocab) == key for g in gone)

    def in_flight(self, launch: int) -> dict[str, int]:
        """Files of a launch written to but never closed, closed after a write failed, or closed only by
        its process's end short of the golden run's file, as the probe layer and faultfs saw them (path
        -> bytes written); renames followed."""
        open_: dict[str, int] = {}
        for h in self.run.probes():
            if h.launch != launch or "path" not in h.info:
                continue
            path = h.info["path"]
            if h.point in ("file.write", "ckpt.shard.write", "faultfs.write"):
                open_[path] = h.info.get("bytes", 0)
                if h.info.get("aliases"):
                    self._aliases[path] = list(h.info["aliases"])
            elif h.point in ("file.done", "ckpt.shard.done", "faultfs.done") and (
                    h.info.get("failed") or h.info.get("short") or self._cut_short(h.info)):
                # closed after a write failed, short of the golden run's file (a native write failed
                # unseen), or by the kernel as its writer was killed: torn all the same
                open_[path] = h.info.get("bytes", 0)
            elif h.point in ("file.done", "ckpt.shard.done", "faultfs.done", "file.remove", "faultfs.remove"):
                open_.pop(path, None)
            elif h.point in ("file.rename", "faultfs.rename") and h.info.get("src") in open_:
                open_[path] = open_.pop(h.info["src"])
                self._aliases[path] = self._aliases.get(h.info["src"], [])
        return open_

    def _cut_short(self, info: dict) -> bool:
        """A file the kernel closed as its process ended (``exited``: faultfs saw the close come from a
        process in its exit) with fewer bytes than the golden run's, or where there is none to compare."""
        if not info.get("exited"):
            return False
        _, whole = self._golden_size(info["path"], info.get("aliases", ()))
        return whole is None or int(info.get("bytes", 0)) < whole

    def _touched(self, launch: int) -> set[str]:
        """Every path a launch wrote, renamed, removed or made, as any source saw it (a folder stands
        for what is in it)."""
        out = set()
        for h in self.run.probes():
            if h.launch == launch and "path" in h.info and (h.point in WRITES or "remove" in h.point
                                                             or h.point == "file.rmtree"):
                out.add(h.info["path"])
                if h.info.get("src"):
                    out.add(h.info["src"])
        for r in self.log:
            if r.get("launch") == launch and (r.get("op") in ("create", "delete", "rename")
                                              or (r.get("op") == "close" and r.get("wrote"))):
                out.update(p for p in (r.get("path"), r.get("src")) if p)
        return out

    def _left(self, launch: int) -> tuple[dict[str, str], dict[str, str]]:
        """(torn, strays) as launch ``launch`` ended, path -> how (``torn``, ``strays``)."""
        if launch in self._lefts:
            return self._lefts[launch]
        gold = self.golden_files()
        sizes = self._sizes(launch)
        found: dict[str, tuple[int, int]] = {p: (launch, n) for p, n in self.in_flight(launch).items()}
        for k in range(launch - 1, -1, -1):  # an earlier launch's torn file, there still, untouched since
            if not sizes:
                break
            later = set().union(*(self._touched(j) for j in range(k + 1, launch + 1)))
            before = self._sizes(k)
            for p, n in self.in_flight(k).items():
                if p in found or p not in sizes or (p in before and before[p] != sizes[p]):
                    continue
                if not any(within(p, q) for q in later):
                    found[p] = (k, n)
        torn, strays = {}, {}
        for p, (k, n) in sorted(found.items()):
            aliases = self._aliases.get(p, [])
            name, whole = self._golden_size(p, aliases)
            how = (f"{n} of {whole} bytes written" + (" (the golden run's size)" if name == p else
                                                      f" (the golden run's {name})") if whole else f"{n} bytes written")
            how += ", never completed" + (f", by launch {k}" if k != launch else "")
            if self.temporary(p, aliases):
                strays[p] = how + ", never renamed into place"
            else:
                torn[p] = how
        if sizes:
            present = {self.checkpoint_of(p) for p in sizes}
            for p, whole in sorted(gold.items()):
                ckpt = self.checkpoint_of(p)
                if ckpt is None or ckpt not in present or p in torn or ckpt == p and p not in sizes:
                    continue
                if p not in sizes:
                    torn[p] = f"missing ({whole} bytes in the golden run)"
                elif sizes[p] == 0 and whole > 0:
                    torn[p] = f"empty ({whole} bytes in the golden run)"
        self._lefts[launch] = (torn, strays)
        return torn, strays

    def torn(self, launch: int) -> dict[str, str]:
        """What was torn or incomplete as launch ``launch`` ended, path -> how: files it was writing when
        it ended; files an earlier launch left so that are still there, no launch having written,
        renamed or removed them since; and, in a checkpoint the golden run also wrote, files missing or
        empty where the golden run's were not. Temporary files inside a checkpoint folder are not among
        them (``strays``)."""
        return self._left(launch)[0]

    def strays(self, launch: int) -> dict[str, str]:
        """Temporary files (``temporary``) left half written inside a checkpoint folder as launch
        ``launch`` ended, by it or an earlier launch, path -> how: a writer killed before its rename.
        No file of the checkpoint, so a load that opens the checkpoint's files by name never reads them;
        they take space until the folder goes."""
        return self._left(launch)[1]
