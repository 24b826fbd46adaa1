"""Storage faults, on the run's storage stack (``ckpt_chaos/env/storage.py``): a ballast file that fills
the disk, faultfs rules (errno, latency, bandwidth) or libfiu, a simulated power cut, and damage to
the bytes of committed checkpoints. They run on the local backend.
"""

from __future__ import annotations

import errno as errno_module
import fnmatch
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ckpt_chaos.check.expected import faults_before
from ckpt_chaos.check.history import Healed
from ckpt_chaos.env.storage import POWER_LOSS_MODES, missing
from ckpt_chaos.faults.kind import Effects, FaultKind, Nemesis
from ckpt_chaos.faults.registry import Invalid
from ckpt_chaos.faults.search_rules import CORRUPT, DISK_FULL, ERRNO, POWER_LOSS, SLOW
from ckpt_chaos.probe.layout import TMP_PREFIX, TRASH_PREFIX, parse_name

if TYPE_CHECKING:
    from ckpt_chaos.check.history import FaultFired
    from ckpt_chaos.check.verdict import Report, Run
    from ckpt_chaos.scenario import Fault, Scenario

Call = Literal["open", "write", "read", "fsync", "rename", "unlink", "mkdir", "rmdir", "truncate", "any"]
LIBFIU_CALLS = ("open", "write", "fsync", "rename", "unlink", "truncate")
Corruption = Literal["truncate", "flip", "append", "delete", "wrong_format", "wrong_step", "unlist_metadata"]
Via = Literal["faultfs", "libfiu"]
PowerLossMode = Literal[POWER_LOSS_MODES]
# what the scenario loader calls a value of each set in its messages ("unknown call 'fsynk'")
CHOICES = {Call: "call", Corruption: "corruption", Via: "mechanism", PowerLossMode: "power-loss mode"}
STRAY_BYTES = 4096  # what `append` adds: a page, as a stray writer would
# Corruptions that edit what a manifest says (a bad copy, a tool rewriting it, a directory renamed
# by hand) instead of damaging bytes: the manifest stays readable JSON, with its sizes and checksums.
MANIFEST_EDITS = ("wrong_format", "wrong_step", "unlist_metadata")
# Trainer events that report a storage failure: the ranks' and the uploader's (a staged copy that
# fails to read, or to be made).
SURFACED = ("save_failed", "ckpt_rejected", "load_failed", "remote_download_failed", "upload_retry", "upload_failed",
            "upload_abandoned")


@dataclass
class DiskFullParams:
    headroom_kb: int = 0  # free space left on the file system
    keep_full: bool = False  # the disk stays full across relaunches (else the ballast goes at the launch's end)


@dataclass
class ErrnoParams:
    call: Call = "any"  # which calls fail
    errno: str = "EIO"  # the error, by name
    path: str = "*"  # glob over paths inside the checkpoint directory
    nth_call: int = 1  # the first matching call (counted from the trigger) that fails
    count: int = 1  # how many matching calls fail from there (0: all)
    probability: float | None = None  # instead, each matching call fails with this chance ...
    seed: int = 0  # ... drawn from a generator seeded with this
    via: Via = "faultfs"  # faultfs (any call, path globs) | libfiu (the next call of the process)


@dataclass
class SlowParams:
    call: Call = "any"  # which calls are slowed
    path: str = "*"  # glob over paths inside the checkpoint directory
    latency_ms: float = 0.0  # added to each matching call
    bandwidth_mb_s: float = 0.0  # cap on write bandwidth (MiB/s), 0: none


@dataclass
class PowerLossParams:
    """What the power cut leaves. Un-fsynced file data is lost in every mode (a file keeps its last
    fsynced bytes: a never-fsynced file is empty, one appended to since its fsync is short); the mode
    says what becomes of the directory entries (creates, renames, removals) no folder fsync made
    durable."""

    mode: PowerLossMode = "undo"  # undo: every such entry is undone, newest first (the worst POSIX allows) |
    # entries-kept: every one is kept, as ext4 (data=ordered, delayed allocation) often leaves it: a
    # file renamed into place without an fsync is there under its new name, empty or short


@dataclass
class CorruptParams:
    corruption: Corruption = "truncate"  # truncate (to half) | flip (8 bits in the middle) | append (a page of
    # stray bytes at the end, as another writer in the directory would) | delete
    # | on manifest.json only (MANIFEST_EDITS): wrong_format (an unknown format number), wrong_step
    # (a step other than the directory's name), unlist_metadata (DCP's .metadata left out of its files)
    file: str = "*.distcp"  # glob over the checkpoint's files
    checkpoint: str = "newest"  # newest | oldest | a checkpoint name | in_progress (the save being written)


class StorageNemesis(Nemesis):
    """Disk full, errno injection, slow storage, power loss and corruption, for the whole run.

    faultfs rules and the ballast outlive a launch only if the scenario says so: ``heal`` at the
    end of each launch disarms every rule and, unless a disk_full asked to keep the disk full,
    gives the space back (as an operator who frees space before restarting the job would)."""

    keep_full = False

    @staticmethod
    def missing(s: Scenario) -> str | None:
        spec = s.storage_spec()
        why = missing(spec.fs, spec.faultfs, spec.libfiu)
        if why:
            kinds = sorted({f.kind for f in s.faults if f.spec.nemesis is StorageNemesis}) or ["the storage stack"]
            return f"{', '.join(kinds)} on fs={spec.fs}{' + faultfs' if spec.faultfs else ''}: {why}"
        return None

    def disk_full(self, fault: Fault, event: dict, record: dict) -> None:
        self.keep_full |= fault.params.keep_full
        record.update(self.setting.storage.fill(fault.params.headroom_kb * 1024))

    def errno(self, fault: Fault, event: dict, record: dict) -> None:
        p = fault.params
        pids = self.target_pids(fault, event, record)
        if p.via == "libfiu":
            for pid in self.reached(pids, record).values():
                self.setting.storage.fiu_fail(pid, p.call, getattr(errno_module, p.errno), p.probability)
            record["via"] = "libfiu"
            return
        self._arm(fault, pids, record, errno=getattr(errno_module, p.errno), nth=p.nth_call, count=p.count,
                  probability=p.probability, seed=p.seed)

    def slow(self, fault: Fault, event: dict, record: dict) -> None:
        p = fault.params
        self._arm(fault, self.target_pids(fault, event, record), record, errno=0, delay_s=p.latency_ms / 1000,
                  bytes_per_s=p.bandwidth_mb_s * (1 << 20))

    def _arm(self, fault: Fault, pids: dict[int, int], record: dict, **effect) -> None:
        if fault.target != "all":  # a rule for no pid matches no call
            self.reached(pids, record)
        rule = {"call": fault.params.call, "path": fault.params.path,
                "pids": None if fault.target == "all" else sorted(pids.values()), **effect}
        record["rule"] = self.setting.storage.client.call("arm", rule=rule)["id"]
        record["via"] = "faultfs"

    def power_loss(self, fault: Fault, event: dict, record: dict) -> None:
        job = self.launch.job
        record.update(pids=sorted(self.launch.pids.values()), launcher_pid=job.launcher_pids()[0])
        job.kill()  # the whole node goes down at once
        storage = self.setting.storage
        # faultfs's account (paths inside the mount), and where the mount is in the run directory
        record["lost"] = {**storage.client.call("crash", mode=fault.params.mode),
                          "root": os.path.relpath(storage.ckpt, storage.run_dir)}

    def corrupt(self, fault: Fault, event: dict, record: dict) -> None:
        record.update(corrupt(self.setting.storage.view, fault))

    def heal(self) -> dict:
        """End of a launch: disarm faultfs rules (returning what they did), drain the ballast."""
        storage = self.setting.storage
        out: dict = {}
        if storage.client is not None:
            out["faultfs"] = storage.client.call("status")
            storage.client.call("disarm")
        if not self.keep_full and storage.drain():
            out["ballast_removed"] = True
        return out


def corrupt(root: Path, fault: Fault) -> dict:
    """Damage files of a committed checkpoint under ``root`` (read beneath any fault layer)."""
    from ckpt_chaos.probe.layout import TMP_PREFIX, list_checkpoints

    p = fault.params
    if p.checkpoint == "in_progress":  # files already written, not yet committed: lost after the write
        tmps = sorted(d for d in root.iterdir() if d.is_dir() and d.name.startswith(TMP_PREFIX))
        if not tmps:
            raise RuntimeError(f"corrupt: no save in progress in {root}; trigger the fault during a save")
        return {**_damage(tmps[-1], p), "in_progress": True}
    ckpts = list_checkpoints(root)
    if not ckpts:
        raise RuntimeError(f"corrupt: no checkpoint in {root} to corrupt yet; trigger the fault later")
    if p.checkpoint == "newest":
        target = ckpts[0]
    elif p.checkpoint == "oldest":
        target = ckpts[-1]
    else:
        target = root / p.checkpoint
        if not target.is_dir():
            raise RuntimeError(f"corrupt: {p.checkpoint} does not exist; have {[c.name for c in ckpts]}")
    return _damage(target, p)


def _damage(target: Path, p: CorruptParams) -> dict:
    files = sorted(f for f in target.iterdir() if f.is_file() and fnmatch.fnmatch(f.name, p.file))
    if not files:
        raise RuntimeError(f"corrupt: no file of {target.name} matches {p.file!r}")
    done = []
    for f in files:
        size = f.stat().st_size
        if p.corruption == "truncate":
            os.truncate(f, size // 2)
            done.append(f"{f.name}: {size} -> {size // 2} bytes")
        elif p.corruption == "flip":
            with open(f, "r+b") as fh:
                fh.seek(size // 2)
                byte = fh.read(1)
                fh.seek(size // 2)
                fh.write(bytes([byte[0] ^ 0xFF]))
            done.append(f"{f.name}: 8 bits flipped at byte {size // 2}")
        elif p.corruption == "append":
            with open(f, "ab") as fh:
                fh.write(b"\xa5" * STRAY_BYTES)
            done.append(f"{f.name}: {size} -> {size + STRAY_BYTES} bytes")
        elif p.corruption in MANIFEST_EDITS:
            done.append(f"{f.name}: {_edit_manifest(f, p.corruption)}")
        else:
            f.unlink()
            done.append(f"{f.name}: deleted")
    return {"checkpoint": target.name, "files": done}


def _edit_manifest(path: Path, how: str) -> str:
    """Rewrite a manifest as ``how`` says, in place (as a tool that edits it would); what changed."""
    manifest = json.loads(path.read_text())
    if how == "wrong_format":
        manifest["format"], said = 99, f"format {manifest.get('format')!r} -> 99"
    elif how == "wrong_step":
        manifest["step"], said = manifest["step"] + 1, f"step {manifest['step']} -> {manifest['step'] + 1}"
    else:
        manifest["files"].pop(".metadata", None)
        said = ".metadata left out of its files"
    path.write_text(json.dumps(manifest, indent=1))
    return said


# ---- validation ----------------------------------------------------------------------------------

def _on_local_storage(s: Scenario, f: Fault) -> None:
    if not s.cluster.one_host:
        raise Invalid("storage", f"storage faults run on the local or slurm backend, not {s.cluster.backend!r}",
                      "drop [storage] and storage faults, or use backend = \"local\"", top=True)
    if f.when.external:
        raise Invalid("when.point", f"{f.kind} acts at a probe point", "use a probe point")


def _check_disk_full(s: Scenario, f: Fault) -> None:
    _on_local_storage(s, f)
    if s.storage.fs == "host":
        raise Invalid("kind", "disk_full needs a file system of limited size",
                      "add [storage] with fs = \"tmpfs\" or \"ext4\" and size_mb")
    if f.params.headroom_kb < 0:
        raise Invalid("headroom_kb", f"{f.params.headroom_kb}", "use 0 or more")


def _check_errno(s: Scenario, f: Fault) -> None:
    _on_local_storage(s, f)
    p = f.params
    if not (p.errno.startswith("E") and isinstance(getattr(errno_module, p.errno, None), int)):
        raise Invalid("errno", f"unknown errno {p.errno!r}", "use a name such as ENOSPC, EIO, EDQUOT, EROFS")
    if p.nth_call < 1 or p.count < 0:
        raise Invalid("nth_call", f"nth_call={p.nth_call}, count={p.count}",
                      "nth_call counts from 1; count is 0 (every call) or more")
    if p.probability is not None and not 0 < p.probability <= 1:
        raise Invalid("probability", f"{p.probability}", "use a probability in (0, 1]")
    if p.via == "libfiu":
        if p.call not in LIBFIU_CALLS:
            raise Invalid("call", f"libfiu cannot fail {p.call!r} (it does not wrap openat, renameat, mkdir...)",
                          f"use via = \"faultfs\", or a call of {', '.join(LIBFIU_CALLS)}")
        if p.path != "*" or p.nth_call != 1 or p.count != 1 or p.seed != 0:
            raise Invalid("via", "libfiu fails the next call of the process (or each with a probability), whatever "
                          "the path", "drop path/nth_call/count/seed, or use via = \"faultfs\"")


def _check_slow(s: Scenario, f: Fault) -> None:
    _on_local_storage(s, f)
    if f.params.latency_ms <= 0 and f.params.bandwidth_mb_s <= 0:
        raise Invalid("latency_ms", "neither latency_ms nor bandwidth_mb_s is set",
                      "set latency_ms > 0 and/or bandwidth_mb_s > 0")


def _check_corrupt(s: Scenario, f: Fault) -> None:
    _on_local_storage(s, f)
    if f.params.checkpoint == "in_progress" and f.params.corruption in MANIFEST_EDITS:
        raise Invalid("checkpoint", "a save in progress has no manifest yet",
                      "use truncate, flip or delete, or a committed checkpoint")
    if f.params.corruption in MANIFEST_EDITS and f.params.file != "manifest.json":
        raise Invalid("file", f"corruption {f.params.corruption!r} edits a manifest, not {f.params.file!r}",
                      "use file = \"manifest.json\"")


# ---- effect checks -------------------------------------------------------------------------------

def _went_on(run: Run, hits: list[dict]) -> bool:
    """Whether a process whose call failed did anything after the failure (a probe event)."""
    first = min(x["t"] for x in hits)
    pids = {x["pid"] for x in hits}
    return any(e.pid in pids and e.t > first for e in run.probes())


def _save_failed_before(fault: Fault, reported: list[dict]) -> str | None:
    """Why an errno fault's call never came, if the save it was aimed at failed on its own first (an
    earlier fault filled the disk: the shard's write fails before any fsync of it); None otherwise.
    ``reported``: the failures the trainer reported in the fault's launch after it fired."""
    name = fault.when.name
    for e in reported:
        if e["event"] == "save_failed" and (name is None or e.get("name") == name):
            error = e.get("error", "").strip().splitlines()[-1:] or ["?"]
            return (f"save {e.get('name')} failed before any {fault.params.call} on a path matching "
                    f"{fault.params.path!r} ({error[0]}), and the trainer reported it")
    return None


def _cut_short(run: Run, h: FaultFired) -> FaultFired | None:
    """The later fault that ended ``h``'s launch before the trainer could show what ``h`` did: the launch
    exited non-zero, no save committed after ``h``, and that fault hit ``h``'s processes (any, where ``h``
    names none, as a full disk does); None otherwise."""
    ex = run.exit_of(h.launch)
    if ex is None or ex.rc == 0 or any(e.get("t", 0) > h.t for e in run.trainer("committed", h.launch)):
        return None
    return next((x for x in run.faults() if x.launch == h.launch and x.t >= h.t and x.index != h.index
                 and (not h.pids or set(x.pids) & set(h.pids))), None)


def _reported(run: Run, h: FaultFired) -> list[dict]:
    return [e for e in run.events if e["event"] in SURFACED and e.get("attempt") == h.launch and e.get("t", 0) >= h.t]


def _failed_in(h: FaultFired, hits: list[dict] | None) -> set[str]:
    """The checkpoints the failed calls belonged to: named by each call's path (``.tmp-step_N/...``,
    ``step_N/...``), or, for a call outside any checkpoint (the directory itself, ``latest.tmp``), the
    one whose save the fault fired in (its ``ckpt.*`` probe event's name). That save is named too
    where a call was another checkpoint's (retention renaming an older one to trash fails the save
    that retires it, which is what the trainer reports). Empty where a call cannot be tied to one:
    any report then counts, as it must for a fault whose call is not a checkpoint's."""
    at = h.at.get("info", {}).get("name") if str(h.at.get("point", "")).startswith("ckpt.") else None
    names = set()
    for x in hits or []:
        name = x["path"].lstrip("/").split("/")[0].removeprefix(TMP_PREFIX).removeprefix(TRASH_PREFIX)
        name = name if parse_name(name) else at
        if not name:
            return set()
        names.add(name)
    return names | {at} if names and at else names


def _surfaced(run: Run, h: FaultFired, report: Report, hits: list[dict] | None) -> None:
    """A fault that made the trainer's I/O fail was reported by the trainer, or stopped the launch.

    The launch stopping counts as reporting the fault only if no later fault stopped it, or the
    processes whose calls failed did nothing more (they could not report it: a peer's fault left
    them waiting in a collective until the launch ended)."""
    fault = run.s.faults[h.index]
    ex = run.exit_of(h.launch)
    reported = _reported(run, h)
    if hits:
        # a report made before the call failed (the checkpoint found corrupt, then moving it aside
        # failed) is not a report of the failure
        first = min(x["t"] for x in hits)
        reported = [e for e in reported if e.get("t", 0) >= first]
    # with several faults in a launch, a later one's failure is reported too: only a report of the
    # checkpoint this fault's calls failed in answers for it
    failed_in = _failed_in(h, hits)
    others = [e for e in reported if failed_in and e.get("name") and e["name"] not in failed_in]
    reported = [e for e in reported if e not in others]
    later = [x for x in run.faults() if x.launch == h.launch and x.t > h.t and x.index != h.index]
    stopped = ex is not None and ex.rc != 0 and (not later or (bool(hits) and not _went_on(run, hits)))
    if fault.spec.fills_disk:
        saves = [e for e in run.probes("ckpt.stage") if e.launch == h.launch and e.t >= h.t]
        if not saves and not reported and not stopped:
            report.add("surfaced", "n/a", "no save began while the disk was full: nothing failed to report",
                       fault=h.index)
            return
    ok = bool(reported) or stopped
    what = (f"{fault.kind} ({fault.params.errno} on {fault.params.call})" if fault.kind == "errno"
            else fault.kind)
    if not ok and hits is None and (cut := _cut_short(run, h)) is not None:
        report.add("surfaced", "unknown", fault=h.index, detail=
                   f"fault {cut.index} ({cut.fault}) ended launch {h.launch} (status {ex.rc}) before "
                   f"any save committed after {what}, and no failed call was recorded: whether it made a call fail, "
                   "and whether the trainer would have reported that, was not shown")
        return
    report.add("surfaced", ok, fault=h.index, detail=
               f"the trainer reported it: {reported[0]['event']} {reported[0].get('name', '')}".rstrip()
               if reported else f"launch {h.launch} stopped with status {ex.rc}" + (
                   f": the process whose call failed did nothing more before fault {later[0].index} "
                   f"({later[0].fault}) ended the launch, so it had no chance to report it"
                   if later else "") if ok else
               f"{what} made the trainer's I/O fail, but it reported no failure (no {', '.join(SURFACED[:-1])} "
               f"or {SURFACED[-1]} event" + (f" for {', '.join(sorted(failed_in))}; it reported only "
                                             f"{', '.join(sorted({e['event'] + ' ' + e['name'] for e in others}))}"
                                             if others else "") + ") and kept going: an error was swallowed")


def _errno_effect(run: Run, h: FaultFired, report: Report) -> None:
    """Injected through faultfs: some call failed (or the save it aimed at failed first); then surfaced."""
    fault = run.s.faults[h.index]
    hits = None
    if h.detail.get("via") == "faultfs":
        hits = [item for heal in run.records(Healed, h.launch) for item in heal.injected
                if item["rule"] == h.detail.get("rule")]
        if not hits:
            failed_first = _save_failed_before(fault, _reported(run, h))
            if fault.params.probability is not None:
                report.add("injected", "n/a", "no matching call failed: the probability drew it that way",
                           fault=h.index)
            elif failed_first is not None:
                report.add("injected", "n/a", f"not reached: {failed_first}", fault=h.index)
            elif (cut := _cut_short(run, h)) is not None:
                report.add("injected", "n/a", fault=h.index, detail=
                           f"not reached: fault {cut.index} ({cut.fault}) hit the same process(es) before any save "
                           f"committed and launch {h.launch} ended with status {run.exit_of(h.launch).rc}, so no "
                           f"{fault.params.call} call could come")
            else:
                report.add("injected", False, fault=h.index, detail=
                           f"no {fault.params.call} call on a path matching {fault.params.path!r} came after the "
                           f"trigger; check faults[{h.index}].call, .path and .when")
            return
        calls = ", ".join(f"{x['op']} {x['path']} -> {x['errno']}" for x in hits[:3])
        report.add("injected", True, f"{len(hits)} call(s) failed: {calls}", fault=h.index)
    _surfaced(run, h, report, hits)


def _disk_full_effect(run: Run, h: FaultFired, report: Report) -> None:
    _surfaced(run, h, report, None)


def corruption_detected(run: Run, h: FaultFired, report: Report, rejected_event: str = "ckpt_rejected",
                        where: str = "") -> None:
    """The next launch rejected the corrupted checkpoint (``where``: on the remote tier, after its
    download), with its reason, before it could load it."""
    name = h.detail.get("checkpoint")
    if h.detail.get("in_progress"):  # damaged between its write and its commit: the commit must refuse it
        step = name[len(".tmp-"):]
        failed = [e for e in run.trainer("save_failed", h.launch) if e.get("name") == step]
        committed = [e for e in run.trainer("committed", h.launch) if e.get("name") == step]
        report.add("detected", bool(failed) and not committed, fault=h.index, detail=
                   f"the save of {step} failed: {failed[0].get('error', '')}"[:300] if failed and not committed else
                   f"{step} was damaged after its files were written ({'; '.join(h.detail.get('files', []))}) "
                   f"but {'it was committed' if committed else 'its save did not fail'}")
        return
    # damaged as a launch's load began (after its validation): that launch must find it
    at_load = h.at.get("point") == "load.begin"
    later = [x for x in run.launches() if x > h.launch or (at_load and x == h.launch)]
    if not later:
        report.add("detected", "unknown", f"{name} was corrupted{where} but no launch came after to load it",
                   fault=h.index)
        return
    # the launches up to the first that resumed: one whose load failed (an I/O error) resumed nothing
    upto = next((i for i, x in enumerate(later) if run.resumed_from(x).decided), 0)
    looked = later[:upto + 1]
    launch = looked[-1]
    rejected = [(x, e) for x in looked for e in run.trainer(rejected_event, x) if e["name"] == name]
    r = run.resumed_from(launch)
    point = (r.checkpoint, (r.first_step or 1) - 1) if r.decided else None
    if rejected:
        report.add("detected", True, f"launch {rejected[0][0]} rejected {name}{where}: {rejected[0][1]['reason']}",
                   fault=h.index)
    elif point and point[0] and point[0] > name:
        report.add("detected", "n/a", f"launch {launch} resumed from the newer {point[0]}: {name} was never a "
                   "candidate", fault=h.index)
    else:
        report.add("detected", False, fault=h.index, detail=
                   f"{name} was corrupted{where} ({'; '.join(h.detail.get('files', []))}) but launch {launch} did "
                   f"not reject it" + (f"; it resumed from {point[0]}" if point and point[0] else ""))


# ---- coverage: when a fault of a kind here gets a verdict from its checks -------------------------

def _save_on_full_disk(s: Scenario, f: Fault) -> bool:
    """n/a if no save began on the full disk; one is under way when it fills inside a save."""
    return f.when.point.startswith("ckpt.")


def _errno_injected(s: Scenario, f: Fault) -> bool:
    """faultfs fails a call, unless a probability decides or an earlier fault made the save fail first."""
    return (f.params.via == "faultfs" and f.params.probability is None
            and not any(g.spec.fails_saves for g in faults_before(s, f)))


def _errno_surfaced(s: Scenario, f: Fault) -> bool:
    return f.params.via == "libfiu" or _errno_injected(s, f)


def _newest_damaged(s: Scenario, f: Fault) -> bool:
    """n/a where the relaunch resumed from a newer checkpoint than the one corrupted."""
    return f.params.checkpoint == "newest"


# where the family's kinds come in the registry, and its nemesis in a run's (faults/__init__.py)
ORDER = 3
KINDS = (
    FaultKind(name="disk_full", family="storage",
              doc="fill the checkpoint file system until headroom_kb is left (ballast kept until the next launch, or"
                  " for good with keep_full)",
              params=DiskFullParams, nemesis=StorageNemesis, action=StorageNemesis.disk_full, colour="#8c510a",
              effects=Effects(fails_saves=True, fills_disk=True), validate=_check_disk_full,
              needs=lambda p: frozenset({"sized_fs"}), effect_check=_disk_full_effect,
              coverage={"fault_surfaced": _save_on_full_disk}, search=DISK_FULL),
    FaultKind(name="errno", family="storage",
              doc="fail chosen calls with an errno: the nth_call matching call (count times) or each with a seeded "
                  "probability; via faultfs (any call, path globs) or libfiu (the next call)",
              params=ErrnoParams, nemesis=StorageNemesis, action=StorageNemesis.errno, colour="#bf812d",
              effects=Effects(fails_saves=True), validate=_check_errno, needs=lambda p: frozenset({p.via}),
              effect_check=_errno_effect,
              coverage={"fault_injected": _errno_injected, "fault_surfaced": _errno_surfaced},
              describe=lambda f, h: f"errno ({f.params.errno} on {f.params.call} of {f.params.path})", search=ERRNO),
    FaultKind(name="slow", family="storage",
              doc="add latency_ms to each matching call and/or cap the write bandwidth (bandwidth_mb_s)",
              params=SlowParams, nemesis=StorageNemesis, action=StorageNemesis.slow, colour="#dfc27d",
              validate=_check_slow, needs=lambda p: frozenset({"faultfs"}), timed=True, search=SLOW),
    FaultKind(name="power_loss", family="storage",
              doc="SIGKILL the whole node, then lose every write not yet made durable by fsync, and undo every "
                  "create and rename not yet made durable (mode undo) or keep them (entries-kept)",
              params=PowerLossParams, nemesis=StorageNemesis, action=StorageNemesis.power_loss, colour="#543005",
              effects=Effects(ends_launch=True, crashes=True, loses_unsynced=True), validate=_on_local_storage,
              needs=lambda p: frozenset({"faultfs", "lazy"}),
              describe=lambda f, h: "power_loss" if f.params.mode == "undo" else f"power_loss ({f.params.mode})",
              search=POWER_LOSS),
    FaultKind(name="corrupt", family="storage",
              doc="truncate, flip bits in, append to or delete files of a committed checkpoint (newest, oldest or by"
                  " name), or edit its manifest",
              params=CorruptParams, nemesis=StorageNemesis, action=StorageNemesis.corrupt, colour="#b2182b",
              effects=Effects(corrupts_local=True, damages=True), validate=_check_corrupt,
              effect_check=corruption_detected, coverage={"fault_detected": _newest_damaged},
              describe=lambda f, h: f"corrupt ({f.params.corruption} {'; '.join(h.detail.get('files', []))})",
              search=CORRUPT),
)
