"""The corpus: each idiom a named set of the trainer's switches, correct or broken in a way it names.

A name reads writer/commit/layout/resume: ``torch_save/tmp_fsync_rename/rank0_file/highest_step``.
``broken`` says what is wrong with a broken variant, in the words of its own code; the faults that
expose it, and those it survives, follow from ``expect.py``, never from a run of the harness.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WRITER_NAMES = {"torch": "torch_save", "bytesio": "bytesio_os_write", "npsave": "np_save", "tofile": "np_tofile",
                "safetensors": "safetensors", "mmap": "mmap_write", "staging": "staging_copy"}
COMMIT_NAMES = {"fsync_rename": "tmp_fsync_rename", "nofsync_rename": "tmp_rename_no_fsync",
                "rename_before_close": "rename_before_close", "in_place": "in_place", "tmp_folder": "tmp_folder_rename"}
RESUME_NAMES = {"pointer": "pointer", "highest": "highest_step", "string_max": "string_max", "mtime": "newest_mtime",
                "fallback": "newest_fallback"}


@dataclass(frozen=True)
class Idiom:
    writer: str = "torch"
    commit: str = "fsync_rename"
    layout: str = "file"  # file | folder | per_rank
    sidecar: str = "none"  # none | json | pickle
    pointer: str = "none"  # none | atomic | in_place | before_data
    thread: str = "none"  # none | copy | nocopy
    resume: str = "highest"
    reader: str | None = None
    broken: str = ""  # what the broken variant gets wrong; "" for a correct one
    trainer: str = "train.py"  # train.py, or a framework's own: dcp_train.py, fabric_train.py
    extra: tuple[str, ...] = field(default=())  # more switches (a framework trainer's)
    tmpdir: str = "watched"  # where TMPDIR is: watched (run_dir/tmp) | other_fs (a tmpfs of its own)
    label: str = ""  # the name, where the switches do not make it

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        layout = {"file": "rank0_file", "folder": "rank0_folder", "per_rank": "per_rank_files"}[self.layout]
        if self.sidecar != "none":
            layout += f"+{self.sidecar}_sidecar"
        if self.pointer != "none":
            layout += f"+pointer_{self.pointer}"
        writer = WRITER_NAMES[self.writer] + ({"copy": "+thread_copy", "nocopy": "+thread_no_copy"}.get(self.thread, ""))
        name = f"{writer}/{COMMIT_NAMES[self.commit]}/{layout}/{RESUME_NAMES[self.resume]}"
        return name + (f"/{self.reader}_reader" if self.reader else "")

    @property
    def slug(self) -> str:
        return self.name.replace("/", "--").replace("+", "_").replace("=", "-")

    @property
    def is_async(self) -> bool:
        """Saves written while training goes on: a kill may lose up to two intervals (2 x 4 - 1 steps)."""
        return self.thread != "none" or "--async" in self.extra

    def argv(self) -> list[str]:
        if self.trainer != "train.py":
            return list(self.extra)
        out = ["--writer", self.writer, "--commit", self.commit, "--layout", self.layout, "--sidecar", self.sidecar,
               "--pointer", self.pointer, "--thread", self.thread, "--resume", self.resume]
        return out + (["--reader", self.reader] if self.reader else [])


IDIOMS: tuple[Idiom, ...] = (
    # writers, each committed the careful way, resumed from the highest step parsed from the names
    Idiom("torch"),
    Idiom("torch", "in_place", broken="torch.save straight to the final name: a kill leaves a torn newest file"),
    Idiom("torch", "nofsync_rename", broken="renamed without an fsync: a power cut leaves nothing, or empty files"),
    Idiom("torch", "rename_before_close"),
    Idiom("bytesio"),
    Idiom("npsave"),
    Idiom("tofile", "fsync_rename", "folder", sidecar="json", reader="from_file", broken="the folder counts before "
          "its sidecar is written: a kill leaves a newest folder without meta.json"),
    Idiom("tofile", "tmp_folder", "folder", sidecar="json", reader="from_file"),
    Idiom("tofile", reader="mmap"),
    Idiom("safetensors", "in_place", broken="save_file renames its temporary file into place but never fsyncs: "
          "a power cut leaves nothing, or empty files"),
    Idiom("safetensors", "fsync_rename", "folder", sidecar="json", pointer="atomic", resume="pointer"),
    Idiom("mmap"),
    Idiom("mmap", "in_place", broken="mmap writes into the final name, sized first: a kill leaves a newest file of "
          "full size, zeros where the bytes did not come"),
    Idiom("staging"),
    Idiom("staging", "in_place", broken="the staged file is copied into the final name: a kill leaves it torn"),
    Idiom("torch", thread="copy"),
    Idiom("torch", thread="nocopy", broken="the live tensors are handed to the writer thread: the file of step N "
          "holds the state of step N+1"),
    Idiom("torch", "tmp_folder", "per_rank"),
    Idiom("torch", "fsync_rename", "per_rank", broken="the step folder counts as soon as it exists: a kill leaves "
          "a newest folder without every rank's file"),
    Idiom("bytesio", "fsync_rename", "per_rank", pointer="atomic", resume="pointer"),
    Idiom("torch", "fsync_rename", "per_rank", pointer="in_place", resume="pointer",
          broken="the pointer is rewritten in place: a kill while it is written leaves it blank"),
    Idiom("torch", "fsync_rename", "per_rank", pointer="before_data", resume="pointer",
          broken="the pointer moves before the data is written: a kill leaves it naming a torn folder"),
    Idiom("torch", "tmp_folder", "folder", sidecar="pickle"),
    Idiom("torch", resume="string_max", broken="max() of the names as strings: step_8 sorts after step_12"),
    Idiom("torch", resume="mtime"),
    Idiom("torch", "in_place", resume="fallback", broken="torch.save to the final name, read back with a fall "
          "back on error: kills are survived, a power cut empties every file"),
    Idiom("npsave", "in_place", resume="fallback", broken="np.save to the final name with a fall back on error: "
          "kills are survived, a power cut empties every file"),
    # frameworks' own helpers
    Idiom(layout="folder", trainer="dcp_train.py", label="dcp/get_state_dict+dcp_save/step_folder/highest_with_metadata",
          broken="DCP fsyncs its files but no folder: a power cut that undoes unsynced entries takes every "
                 "checkpoint folder with it"),
    Idiom(layout="folder", trainer="dcp_train.py", extra=("--async",),
          label="dcp/get_state_dict+dcp_async_save/step_folder/highest_with_metadata",
          broken="DCP fsyncs its files but no folder: a power cut that undoes unsynced entries takes every "
                 "checkpoint folder with it"),
    Idiom(trainer="fabric_train.py", tmpdir="watched", label="fabric/save_tmpdir_same_fs/rank0_file/highest_step",
          broken="fabric.save renames its TMPDIR file into place but never fsyncs: a power cut leaves nothing, "
                 "or an empty file"),
    Idiom(trainer="fabric_train.py", tmpdir="other_fs", label="fabric/save_tmpdir_other_fs/rank0_file/highest_step",
          broken="with TMPDIR on another file system fabric.save copies into the final name: a kill leaves it torn"),
)


def by_name(name: str) -> Idiom:
    for i in IDIOMS:
        if i.name == name or i.slug == name:
            return i
    raise KeyError(f"no idiom {name!r}; the corpus: {', '.join(i.name for i in IDIOMS)}")
