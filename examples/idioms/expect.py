"""What each idiom must get under each fault, from the idiom's own semantics: a small model of crash
semantics, independent of the harness.

A save is the list of calls the idiom's code makes (``save_ops``: create, write, fsync, rename,
mkdir, the folder's fsync, per rank). A fault cuts that list (a kill at half of a file's bytes, before
a rename, in the pointer's write; a disk or an inode table that fills as the save starts) or follows
it (a power cut right after the save, a SIGTERM, a kill during the relaunch's load). What is left on
disk is then what POSIX lets a crash leave: everything the calls did, for a killed process; for a
power cut (the harness's faultfs model, docs/faults.md) only fsynced data, and only the directory
entries a folder's fsync made durable (``undo``) or every entry (``entries-kept``). The idiom's
resume rule then picks a checkpoint from that, its reader reads it or raises, and the verdict follows:
which checkpoint it resumed from, against the newest whole one, and how many steps were trained again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from idioms import Idiom

STEPS, EVERY = 16, 4
SAVES = tuple(range(EVERY, STEPS + 1, EVERY))
TARGET = 8  # the save the faults during a save aim at (the 2nd): step_4 is there to fall back on
TERM_AT = 14  # SIGTERM to rank 1 as step 14 begins, after step_12 (which string max misses)
LOAD_KILL_AT = 10  # every rank killed as step 10 begins; the relaunch killed in its load
WORLD = 2

EXT = {"torch": "pt", "bytesio": "pt", "staging": "pt", "npsave": "npy", "tofile": "bin", "mmap": "bin",
       "safetensors": "safetensors"}
OWN_READER = {"torch": "torch", "bytesio": "torch", "staging": "torch", "npsave": "npy", "tofile": "from_file",
              "mmap": "mmap", "safetensors": "safetensors"}
RAW_READERS = ("mmap", "from_file")  # they check the size only: a file of full size reads, whatever it holds
# writers whose bytes pass through Python's file objects, where the probe layer counts them (file.write);
# np.save and tofile write through the descriptor from C, safetensors from Rust, mmap through a mapping
PYTHON_WRITTEN = ("torch", "bytesio", "staging")
# (temporary name, fsync, renamed before the close), as saving.py's FILE_COMMIT
FILE_COMMIT = {"fsync_rename": (True, True, False), "nofsync_rename": (True, False, False),
               "rename_before_close": (True, True, True), "in_place": (False, False, False),
               "tmp_folder": (False, True, False)}


# ---- the calls of one save ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    call: str  # mkdir | create | write | fsync | rename | fsyncdir | barrier
    path: str = ""  # relative to the checkpoint folder
    dst: str = ""  # rename
    file: str = ""  # write: the file it ends as (its final name), for a fault that names the final name
    sized: bool = False  # create: the length is set before the bytes come (mmap, safetensors)
    rank: int = 0
    python: bool = True  # write: through Python's file objects (seen by the probe layer)


def data_files(i: Idiom, step: int) -> list[tuple[int, str]]:
    """(rank, final path) of each data file of a save."""
    name, ext = f"step_{step}", EXT.get(i.writer, "")
    if i.trainer == "dcp_train.py":  # a shard a rank, then rank 0's .metadata, DCP's mark of a whole save
        return [(0, f"{name}/__0_0.distcp"), (1, f"{name}/__1_0.distcp"), (0, f"{name}/.metadata")]
    if i.trainer == "fabric_train.py":
        return [(0, f"{name}.ckpt")]
    if i.layout == "file":
        return [(0, f"{name}.{ext}")]
    if i.layout == "folder":
        return [(0, f"{name}/model.{ext}")]
    return [(r, f"{name}/rank{r}.{ext}") for r in range(WORLD)]


def sidecar(i: Idiom, step: int) -> str | None:
    return None if i.sidecar == "none" else f"step_{step}/meta.{'json' if i.sidecar == 'json' else 'pkl'}"


def entry(i: Idiom, step: int) -> str:
    """The checkpoint's entry in the checkpoint folder: what the resume rules list and the pointer names."""
    if i.trainer != "train.py":
        return data_files(i, step)[0][1] if i.layout == "file" else f"step_{step}"
    return f"step_{step}.{EXT[i.writer]}" if i.layout == "file" else f"step_{step}"


def same_fs_staging(i: Idiom, f: "Fault") -> bool:
    """Fabric's TMPDIR on the checkpoint folder's file system: the run directory's, unless the cell mounts
    a file system of its own on the folder (faultfs, or the tmpfs of a storage fault)."""
    return i.tmpdir == "watched" and f.kind in ("kill_file_write", "term_rank1")


def framework_ops(i: Idiom, step: int, f: "Fault") -> list[Op]:
    name = f"step_{step}"
    if i.trainer == "dcp_train.py":
        ops = [Op("mkdir", name)]
        for rank, shard in data_files(i, step)[:2]:
            ops += [Op("create", shard, rank=rank), Op("write", shard, file=shard, rank=rank), Op("fsync", shard, rank=rank)]
        meta = f"{name}/.metadata"
        return ops + [Op("barrier"), Op("create", meta + ".tmp"), Op("write", meta + ".tmp", file=meta),
                      Op("fsync", meta + ".tmp"), Op("rename", meta + ".tmp", meta)]
    final, staged = f"{name}.ckpt", f"@tmp/{name}"  # fsspec's mkstemp file in TMPDIR, outside the folder
    if same_fs_staging(i, f):
        return [Op("create", staged), Op("write", staged, file=final), Op("rename", staged, final)]
    return [Op("create", staged), Op("write", staged), Op("create", final), Op("write", final, file=final)]


def parent(path: str) -> str:
    return path.rpartition("/")[0]


def file_ops(i: Idiom, rank: int, final: str, writer: str, commit: str, logical: str = "") -> list[Op]:
    """The calls that write one file whose final path is ``final`` (``logical`` once its folder is renamed)."""
    logical = logical or final
    tmp, sync, early = FILE_COMMIT[commit]
    target = final + ".tmp" if tmp else final
    python = writer in PYTHON_WRITTEN or writer == "small"
    if writer == "safetensors":  # its Rust writer: a .tmpXXXXXX beside it, sized, written, renamed, closed
        inner = f"{parent(target)}/.tmpXXXXXX".lstrip("/")
        ops = [Op("create", inner, sized=True, rank=rank), Op("write", inner, file=logical, rank=rank, python=False),
               Op("rename", inner, target, rank=rank)]
    else:
        ops = [Op("create", target, sized=writer == "mmap", rank=rank),
               Op("write", target, file=logical, rank=rank, python=python)]
        if writer == "mmap":  # saving.py flushes the mapping (mmap.flush: msync(MS_SYNC)), whatever the commit
            ops.append(Op("fsync", target, rank=rank))
    if sync:
        ops.append(Op("fsync", target, rank=rank))
    if tmp:
        ops.append(Op("rename", target, final, rank=rank))
        if sync:
            ops.append(Op("fsyncdir", parent(final), rank=rank))
    return ops


def save_ops(i: Idiom, step: int, f: "Fault | None" = None) -> list[Op]:
    """The calls one save of the idioms trainer makes (saving.py's write_checkpoint), in an order a run may
    take: ranks' files before the barrier, rank 0's sidecar, folder and pointer after it."""
    if i.trainer != "train.py":
        return framework_ops(i, step, f)
    name = f"step_{step}"
    pointer = Op("write", "latest", file="latest")
    pointer_ops = ([Op("create", "latest.tmp"), Op("write", "latest.tmp", file="latest"), Op("fsync", "latest.tmp"),
                    Op("rename", "latest.tmp", "latest"), Op("fsyncdir", "")]
                   if i.pointer in ("atomic", "before_data") else [Op("create", "latest"), pointer])
    ops: list[Op] = pointer_ops[:] if i.pointer == "before_data" else []
    folder = f".tmp-{name}" if i.commit == "tmp_folder" else name
    if i.layout != "file":
        ops.append(Op("mkdir", folder))
    for rank, final in data_files(i, step):
        ops += file_ops(i, rank, final.replace(f"{name}/", f"{folder}/"), i.writer, i.commit, final)
    if i.layout != "file":
        ops.append(Op("barrier"))
        side = sidecar(i, step)
        if side is not None:
            ops += file_ops(i, 0, side.replace(f"{name}/", f"{folder}/"), "small", i.commit, side)
        if FILE_COMMIT[i.commit][1]:
            ops += [Op("fsyncdir", folder)]
        if i.commit == "tmp_folder":
            ops.append(Op("rename", folder, name))
        if FILE_COMMIT[i.commit][1]:
            ops.append(Op("fsyncdir", ""))
    if i.pointer in ("atomic", "in_place"):
        ops += pointer_ops
    return ops


# ---- a file system that crashes ------------------------------------------------------------------------

@dataclass
class Inode:
    holds: str = ""  # what its bytes are: a checkpoint's state ("step_8", or "step_9" handed uncopied), a pointer
    written: float = 0.0  # the share of its bytes written
    sized: bool = False  # its length was set before the bytes came
    synced: tuple[str, float] | None = None  # (holds, written) at its last fsync


@dataclass
class FS:
    entries: dict[str, Inode | None] = field(default_factory=lambda: {"": None})  # None: a folder
    # namespace changes no folder's fsync has made durable yet: (the folders whose fsync would, its undo)
    pending: list[tuple[tuple[str, ...], dict[str, Inode | None], tuple[str, ...]]] = field(default_factory=list)

    def _under(self, *paths: str) -> dict[str, Inode | None]:
        return {k: v for k, v in self.entries.items() if any(k == p or k.startswith(p + "/") for p in paths)}

    def apply(self, op: Op, holds: str, fraction: float = 1.0) -> None:
        e = self.entries
        if op.call in ("mkdir", "create") and op.path not in e:
            # undone, the entry goes, and whatever was made inside it with it
            self.pending.append(((parent(op.path),), {}, (op.path,)))
            e[op.path] = None if op.call == "mkdir" else Inode()
        if op.call == "create":  # a new file, or an existing one truncated (open "w")
            e[op.path].holds, e[op.path].written, e[op.path].sized = holds, 0.0, op.sized
        elif op.call == "write":
            e[op.path].holds, e[op.path].written = holds, fraction
        elif op.call == "fsync":
            e[op.path].synced = (e[op.path].holds, e[op.path].written)
        elif op.call == "rename":
            before = self._under(op.path, op.dst)
            for k in before:
                del e[k]
            e.update({op.dst + k[len(op.path):]: v for k, v in before.items()
                      if k == op.path or k.startswith(op.path + "/")})
            # undone: what lay under both names before it comes back, what it put there goes
            self.pending.append(((parent(op.path), parent(op.dst)), before, (op.dst,)))
        elif op.call == "fsyncdir":  # a rename is durable once either of its folders is fsynced
            self.pending = [p for p in self.pending if op.path not in p[0]]

    def power_cut(self, mode: str) -> None:
        """What faultfs's model leaves: un-fsynced data gone (a file never fsynced is empty), and with
        ``undo`` the namespace changes no folder's fsync made durable undone, newest first."""
        for node in self.entries.values():
            if node is not None:
                node.holds, node.written = node.synced or (node.holds, 0.0)
                node.sized = node.sized and node.synced is not None
        if mode == "undo":
            for _, before, made in reversed(self.pending):
                for k in self._under(*made):
                    del self.entries[k]
                self.entries.update(before)
        self.pending = []


# ---- the faults --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Fault:
    kind: str  # below, FAULT_KINDS
    file: str = ""  # the final path of the file a kill mid-write aims at, relative to the checkpoint folder

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.file}" if self.file else self.kind


FAULT_KINDS = {
    "kill_file_write": "rank killed at half of the file's bytes, as the probe layer counts them (file.write)",
    "kill_faultfs_write": "rank killed at half of the file's bytes, as faultfs counts them (faultfs.write)",
    "kill_before_rename": "rank 0 killed as it renames the save into place (faultfs.rename)",
    "kill_mid_pointer": "rank 0 killed at half of the pointer's bytes (file.write on latest)",
    "kill_between_data_and_pointer": "rank 0 killed when the first of data and pointer is written and the "
                                     "second just begun",
    "power_loss_undo": "power cut right after the save (mode undo)",
    "power_loss_entries_kept": "power cut right after the save (mode entries-kept)",
    "term_rank1": "SIGTERM to rank 1 alone as step 14 begins",
    "disk_full": "the disk fills as the save begins",
    "inodes_full": "the inode table fills as the save begins",
    "kill_during_load": "every rank killed as step 10 begins, then rank 0 killed in the relaunch's load",
}


def written_files(i: Idiom, step: int = TARGET) -> list[tuple[int, str]]:
    out = data_files(i, step)
    if i.trainer != "train.py":
        return out
    side = sidecar(i, step)
    return out + ([(0, side)] if side else [])


def faults(i: Idiom) -> list[Fault]:
    """Every fault that applies to the idiom."""
    out = [Fault(k, f) for k in ("kill_file_write", "kill_faultfs_write") for _, f in written_files(i)]
    if i.trainer == "dcp_train.py" or (i.trainer == "train.py" and (i.commit != "in_place" or i.writer == "safetensors")):
        out.append(Fault("kill_before_rename"))
    if i.pointer != "none":
        out += [Fault("kill_mid_pointer"), Fault("kill_between_data_and_pointer")]
    return out + [Fault(k) for k in ("power_loss_undo", "power_loss_entries_kept", "term_rank1", "disk_full",
                                     "inodes_full", "kill_during_load")]


# ---- the expected verdict -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Expected:
    verdict: str  # pass | fail | refused (the harness must refuse to aim there, the reason in `cause`)
    resumed: str  # the checkpoint the (last) relaunch resumes from, "scratch", or "" where it crashes
    checks: tuple[str, ...] = ()  # a fail: the checks, any of which must fail saying `cause`
    cause: tuple[str, ...] = ()  # words the failing check's detail must hold
    why: str = ""  # the model's account, for the table
    refusal_ok: str = ""  # a refusal naming this is as good as the verdict (a writer the layer may decline)


def allowed_loss(i: Idiom) -> int:
    """An asynchronous save may be lost with the one before it (``saves_in_flight = 1``)."""
    return 2 * EVERY if i.is_async else EVERY


def written_late(i: Idiom) -> int:
    """Steps between a save's step and its bytes: a writer thread writes once the next step trained, and
    DCP's async_save while it trains."""
    return 1 if i.is_async else 0


def holds(i: Idiom, step: int) -> str:
    """What a save's files hold: the state of its step, or of the next with the live tensors handed over."""
    return f"step_{step + 1}" if i.thread == "nocopy" else f"step_{step}"


def cut_at(i: Idiom, f: Fault, ops: list[Op]) -> tuple[int, float] | None:
    """Where in the target save's calls the fault lands: (index of the call, share of its bytes written)."""
    for n, op in enumerate(ops):
        if f.kind in ("kill_file_write", "kill_faultfs_write") and op.call == "write" and op.file == f.file:
            return n, 0.5
        if f.kind == "kill_before_rename" and op.call == "rename" and (
                op.dst == entry(i, TARGET) or op.dst in [p for _, p in data_files(i, TARGET)]):
            return n, 0.0
        if f.kind == "kill_mid_pointer" and op.call == "write" and op.file == "latest":
            return n, 0.5
        if f.kind == "kill_between_data_and_pointer" and op.call == "write" and (
                (op.file == "latest") == (i.pointer != "before_data")):
            return n, 0.1
        if op.path.startswith("@tmp/"):  # TMPDIR is not on the file system that fills up
            continue
        if f.kind == "disk_full" and op.call == "write":
            return n, 0.0
        if f.kind == "inodes_full" and op.call in ("create", "mkdir") and (
                op.call == "mkdir" or op.path != "latest"):  # truncating latest takes no new inode
            return n, 0.0
    return None


def refused(i: Idiom, f: Fault) -> str:
    """Why the harness must refuse the fault's trigger: a file no point it names can see being written."""
    if f.kind == "kill_file_write" and i.trainer == "train.py":
        rank_writer = "small" if f.file.endswith((".json", ".pkl")) else i.writer
        if rank_writer not in PYTHON_WRITTEN and rank_writer != "small":
            return "native writer"
    return ""


def after_crash(i: Idiom, f: Fault) -> tuple[FS, int, str]:
    """The checkpoint folder the relaunch finds, the last step the faulted launch finished, and what
    happened, in words."""
    fs = FS()
    last = STEPS
    story = ""
    for step in SAVES:
        ops = save_ops(i, step, f)
        cut = cut_at(i, f, ops) if step == TARGET and f.kind not in (
            "power_loss_undo", "power_loss_entries_kept", "term_rank1", "kill_during_load") else None
        if step == TARGET and cut is None and f.kind in ("kill_file_write", "kill_faultfs_write",
                                                         "kill_before_rename", "kill_mid_pointer",
                                                         "kill_between_data_and_pointer", "disk_full",
                                                         "inodes_full"):
            raise ValueError(f"{i.name}: {f.name} lands nowhere in the save of step {TARGET}")
        for n, op in enumerate(ops if cut is None else ops[:cut[0] + 1]):
            if cut is not None and n == cut[0]:
                if op.call == "write":
                    fs.apply(op, holds(i, step), cut[1])
                break
            if op.call != "barrier":
                fs.apply(op, holds(i, step))
        if cut is not None:
            # an asynchronous save's error (a full disk) surfaces where the next save waits for it
            surfaces = EVERY if i.trainer == "dcp_train.py" and i.is_async and f.kind in ("disk_full", "inodes_full") \
                else written_late(i)
            last, story = step + surfaces, f"the save of step {step} stopped at its {ops[cut[0]].call} " \
                                           f"of {ops[cut[0]].path or 'the checkpoint folder'}"
            break
        if step == TARGET and f.kind.startswith("power_loss"):
            fs.power_cut(f.kind.removeprefix("power_loss_").replace("_", "-"))
            last, story = step + written_late(i), "power cut after the save of step 8"
            break
        if f.kind == "term_rank1" and step + EVERY > TERM_AT:
            last, story = TERM_AT - 1, f"rank 1 ended by SIGTERM as step {TERM_AT} began"
            break
        if f.kind == "kill_during_load" and step + EVERY > LOAD_KILL_AT:
            last, story = LOAD_KILL_AT - 1, f"killed as step {LOAD_KILL_AT} began, and again in the relaunch's load"
            break
    return fs, last, story


def readable(i: Idiom, fs: FS, name: str) -> tuple[str, str]:
    """How the relaunch's ranks read the checkpoint ``name``: ("ok", what it holds), ("torn", the file
    read though not whole), or ("raises", the file that cannot be read)."""
    step = int(re.match(r"step_(\d+)", name)[1]) if re.match(r"step_(\d+)", name) else None
    if step is None or name not in fs.entries:
        return "raises", name or "the checkpoint folder"
    files = [p for _, p in data_files(i, step)] + ([sidecar(i, step)] if sidecar(i, step) else [])
    reader, got, torn = i.reader or OWN_READER.get(i.writer, "torch"), set(), ""
    for path in files:
        node = fs.entries.get(path)
        if node is None or (node.written < 1.0 and not (node.sized and reader in RAW_READERS
                                                        and not path.endswith((".json", ".pkl")))):
            return "raises", path
        if node.written < 1.0:
            torn = path
        got.add(node.holds)
    return ("torn", torn) if torn else ("ok", got.pop() if len(got) == 1 else "mixed")


def whole(i: Idiom, fs: FS, name: str) -> bool:
    kind, held = readable(i, fs, name)
    return kind == "ok"


def listed(i: Idiom, fs: FS) -> list[str]:
    """The entries the rule lists, in its order, newest last."""
    suffix = entry(i, 0).removeprefix("step_0")
    pattern = re.compile(r"step_(\d+)" + re.escape(suffix))
    found = [k for k in fs.entries if "/" not in k and pattern.fullmatch(k)]
    if i.trainer == "dcp_train.py":  # torchtitan's rule: a folder holding DCP's .metadata
        found = [k for k in found if f"{k}/.metadata" in fs.entries]
    if i.resume == "string_max":
        return sorted(found)
    return sorted(found, key=lambda k: int(pattern.fullmatch(k)[1]))


def pick(i: Idiom, fs: FS) -> tuple[str, str, str]:
    """What the resume rule does: ("scratch"|name, outcome, detail); outcome ok | torn | raises."""
    if i.resume == "pointer":
        node = fs.entries.get("latest")
        if node is None:
            return "scratch", "ok", ""
        # the content is right-aligned: a pointer cut short holds blanks, a name only when whole
        name = node.holds if node.written >= 1.0 else ""
        return (name or "(blank pointer)"), *readable(i, fs, name)
    found = listed(i, fs)
    if i.resume == "fallback":
        for name in reversed(found):
            kind, detail = readable(i, fs, name)
            if kind != "raises":
                return name, kind, detail
        return "scratch", "ok", ""
    if not found:
        return "scratch", "ok", ""
    return found[-1], *readable(i, fs, found[-1])


def newest_whole(i: Idiom, fs: FS) -> str | None:
    """The newest checkpoint the trainer's own complete rule counts that is whole: the one a right resume takes."""
    if i.resume == "pointer":
        node = fs.entries.get("latest")
        name = node.holds if node is not None and node.written >= 1.0 else None
        return name if name and whole(i, fs, name) else None
    found = [k for k in listed(i, fs) if whole(i, fs, k)]
    return max(found, key=lambda k: int(re.match(r"step_(\d+)", k)[1]), default=None)


def step_of(name: str) -> int:
    m = re.match(r"step_(\d+)", name)
    return int(m[1]) if m else 0


def expect(i: Idiom, f: Fault) -> Expected:
    """The verdict the idiom must get under the fault."""
    why = refused(i, f)
    if why:
        return Expected("refused", "", cause=(why,), why=f"{f.file} is written by {i.writer}'s native code")
    fs, last, story = after_crash(i, f)
    name, kind, detail = pick(i, fs)
    best = newest_whole(i, fs)
    ok_os_write = "os.write" if i.writer == "bytesio" and f.kind == "kill_file_write" else ""
    if kind == "raises":
        if name == "(blank pointer)":
            return Expected("fail", "", ("job_completed", "resumed_newest@1", "committed_valid"), (),
                            f"{story}; latest is left blank and the relaunch cannot read what it names",
                            ok_os_write)
        return Expected("fail", "", ("no_torn_read@1",), (detail,),
                        f"{story}; the relaunch takes {name} and cannot read {detail}", ok_os_write)
    if kind == "torn":
        return Expected("fail", name, ("no_torn_read@1", "trajectory"), (detail,),
                        f"{story}; the relaunch reads {detail}, whole in size, torn in content", ok_os_write)
    if name != "scratch" and detail != name.split(".")[0]:
        resumed_step = step_of(name)
        return Expected("fail", name, ("trajectory",), (f"diverges at step {resumed_step + 1}",),
                        f"{story}; {name} holds the state of {detail}: the resumed run diverges at step "
                        f"{resumed_step + 1}", ok_os_write)
    if best is not None and (name == "scratch" or step_of(name) < step_of(best)):
        return Expected("fail", name, ("resumed_newest@1",), (best,),
                        f"{story}; the rule takes {name} while {best} is the newest whole checkpoint", ok_os_write)
    lost = last - step_of(name)
    if i.trainer == "dcp_train.py" and i.is_async and f.kind in ("term_rank1", "kill_during_load"):
        # the save before the fault writes while training goes on: whole by then or not, as the writer
        # thread was scheduled; the one before it is whole, and either is within two intervals
        earlier = f"step_{step_of(name) - EVERY}"
        assert last - step_of(earlier) <= allowed_loss(i)
        return Expected("pass", "", why=f"{story}; it resumes from {name}, or from {earlier} where the save "
                                        f"of {name} was still being written")
    if i.trainer == "dcp_train.py" and i.is_async and f.kind in ("disk_full", "inodes_full") \
            and lost <= allowed_loss(i):
        # the save before the target writes while training goes on and is waited for only as the target's
        # save begins, so the disk that fills at the end of the step before may meet it: then nothing is
        # whole, and its error surfaces as the target's save waits for it, TARGET steps trained again
        earlier = f"step_{step_of(name) - EVERY}" if step_of(name) > EVERY else "scratch"
        assert TARGET - step_of(earlier) <= allowed_loss(i)
        return Expected("pass", "", why=f"{story}; it resumes from {name}, or from {earlier} where the save "
                                        f"of {name}, still being written, met the full disk")
    if lost > allowed_loss(i):
        return Expected("fail", name, ("lost_work@1",), (),
                        f"{story}; nothing newer survives: it resumes from {name} and trains {lost} steps "
                        f"again, more than {allowed_loss(i)}", ok_os_write)
    return Expected("pass", name, why=f"{story}; it resumes from {name}", refusal_ok=ok_os_write)
