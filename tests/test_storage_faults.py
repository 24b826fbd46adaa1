"""Storage faults are real and leave nothing behind; planted storage bugs are caught and named.

These tests mount file systems (tmpfs, FUSE): without root, /dev/fuse or the Debian packages
that ``make setup`` installs they are skipped, with the reason, and never pass.
"""

from __future__ import annotations

import dataclasses
import errno
import mmap
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.run.runner import run_scenario
from ckpt_chaos.scenario import load
from ckpt_chaos.env.storage import Storage, StorageSpec, leftovers, missing, remove_leftovers
from ckpt_chaos.faults.process import _running, wait_gone
from tests.helpers import start_cli

SCENARIOS = builtin_scenarios() / "storage"
NO_FAULTFS = missing("tmpfs", faultfs=True)
needs_faultfs = pytest.mark.skipif(NO_FAULTFS is not None, reason=f"cannot mount faultfs here: {NO_FAULTFS}")


def ours(pid: int) -> list[str]:
    """Mounts and faultfs processes that harness process ``pid`` made."""
    return leftovers(owner=pid)


# ---- faultfs on its own: the power-loss model, errno rules ------------------------------------------

@needs_faultfs
def test_a_run_folder_given_relative_is_unmounted_and_its_checkpoints_kept(tmp_path, monkeypatch):
    # `ckpt-chaos run --reports rel`: the faultfs mount was left behind and its copy-out crashed
    monkeypatch.chdir(tmp_path)
    with Storage(Path("rel"), StorageSpec(fs="tmpfs", size_mb=16, faultfs=True)) as st:
        (st.ckpt / "step_00000002").mkdir()
        (st.ckpt / "step_00000002" / "manifest.json").write_text("{}")
    assert not ours(os.getpid())
    assert (tmp_path / "rel" / "checkpoints" / "step_00000002" / "manifest.json").read_text() == "{}"
    assert not (tmp_path / "rel" / ".storage").exists()


@needs_faultfs
def test_power_loss_keeps_exactly_what_was_made_durable(tmp_path):
    with Storage(tmp_path, StorageSpec(fs="tmpfs", size_mb=16, faultfs=True, lazy=True)) as st:
        m = st.ckpt
        with open(m / "synced", "wb") as f:  # data and name both made durable
            f.write(b"durable")
            f.flush()
            os.fsync(f.fileno())
        fd = os.open(m, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        (m / "unsynced").write_bytes(b"lost")  # neither data nor name fsynced
        os.mkdir(m / "dir")
        with open(m / "dir" / "named-only", "wb") as f:  # name made durable, data not
            f.write(b"gone")
        fd = os.open(m / "dir", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        with open(m / "synced", "ab") as f:  # appended after the fsync: the append is lost
            f.write(b" + more")
        os.rename(m / "synced", m / "renamed")  # never made durable: undone
        lost = st.client.call("crash")
        assert sorted(os.listdir(m)) == ["synced"]
        assert (m / "synced").read_bytes() == b"durable"
        assert "rename synced -> renamed" in lost["undone"] and "create unsynced" in lost["undone"]
        # "dir" itself was never made durable in its parent, so its durable content goes with it.
        assert "mkdir dir" in lost["undone"]
    assert not (tmp_path / ".storage").exists()


def _fsync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _written(path, data: bytes, fsync: bool = False) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())


@needs_faultfs
@pytest.mark.parametrize("mode", ["undo", "entries-kept"])
def test_power_loss_of_a_file_written_and_renamed_without_fsync(tmp_path, mode):
    """Neither the data nor the folder fsynced: undo brings the old name back and empties it; entries-kept
    leaves the file under its new name, empty (ext4's zero-length file after a crash)."""
    with Storage(tmp_path, StorageSpec(fs="tmpfs", size_mb=16, faultfs=True, lazy=True)) as st:
        m = st.ckpt
        _written(m / "step_8.pt.tmp", b"x" * 5000)
        os.rename(m / "step_8.pt.tmp", m / "step_8.pt")
        lost = st.client.call("crash", mode=mode)
        assert lost["mode"] == mode
        # the data is lost in both modes, named where the file was at the crash
        assert lost["data_lost"] == [{"path": "step_8.pt", "size_before": 5000, "size_after": 0,
                                      "ever_fsynced": False}]
        if mode == "undo":
            assert os.listdir(m) == []  # the rename is undone, then the create
            assert lost["entries_undone"] == [
                {"op": "rename", "path": "step_8.pt", "src": "step_8.pt.tmp", "folder_ever_fsynced": False},
                {"op": "create", "path": "step_8.pt.tmp", "folder_ever_fsynced": False}]
            assert lost["entries_kept"] == []
            assert lost["undone"] == ["rename step_8.pt.tmp -> step_8.pt", "create step_8.pt.tmp"]
        else:
            assert os.listdir(m) == ["step_8.pt"] and (m / "step_8.pt").stat().st_size == 0
            assert lost["entries_undone"] == [] and lost["undone"] == []
            assert lost["entries_kept"] == [
                {"op": "create", "path": "step_8.pt.tmp", "folder_ever_fsynced": False},
                {"op": "rename", "path": "step_8.pt", "src": "step_8.pt.tmp", "folder_ever_fsynced": False}]
        assert lost["truncated"] == ["step_8.pt"] and lost["restored"] == []
        # nothing pending is left: a second crash loses nothing more
        again = st.client.call("crash", mode=mode)
        assert again["data_lost"] == again["entries_undone"] == again["entries_kept"] == []


@needs_faultfs
@pytest.mark.parametrize("mode", ["undo", "entries-kept"])
def test_power_loss_of_a_file_fsynced_then_appended_keeps_the_fsynced_prefix(tmp_path, mode):
    with Storage(tmp_path, StorageSpec(fs="tmpfs", size_mb=16, faultfs=True, lazy=True)) as st:
        m = st.ckpt
        _written(m / "log.bin", b"a" * 1000, fsync=True)
        _fsync_dir(m)  # its name is durable too
        with open(m / "log.bin", "ab") as f:
            f.write(b"b" * 234)
        lost = st.client.call("crash", mode=mode)
        assert (m / "log.bin").read_bytes() == b"a" * 1000  # short: only the fsynced prefix
        assert lost["data_lost"] == [{"path": "log.bin", "size_before": 1234, "size_after": 1000,
                                      "ever_fsynced": True}]
        assert lost["restored"] == ["log.bin"] and lost["entries_undone"] == lost["entries_kept"] == []


@needs_faultfs
@pytest.mark.parametrize("mode", ["undo", "entries-kept"])
def test_power_loss_in_a_folder_never_fsynced(tmp_path, mode):
    """Files fsynced in a folder that was never fsynced (nor its parent after the mkdir): undo takes the
    folder away with them; entries-kept keeps the folder and the files with their fsynced data, and
    the removal of an old file stays done."""
    with Storage(tmp_path, StorageSpec(fs="tmpfs", size_mb=16, faultfs=True, lazy=True)) as st:
        m = st.ckpt
        _written(m / "old.pt", b"o" * 10, fsync=True)
        _fsync_dir(m)  # old.pt is durable, the root folder has been fsynced once
        os.mkdir(m / "step_4")
        _written(m / "step_4" / "model.pt", b"m" * 300, fsync=True)
        _written(m / "step_4" / "optim.pt", b"p" * 200)  # never fsynced
        os.unlink(m / "old.pt")
        lost = st.client.call("crash", mode=mode)
        assert lost["data_lost"] == [{"path": "step_4/optim.pt", "size_before": 200, "size_after": 0,
                                      "ever_fsynced": False}]
        if mode == "undo":
            assert sorted(os.listdir(m)) == ["old.pt"] and (m / "old.pt").read_bytes() == b"o" * 10
            assert [(e["op"], e["path"], e["folder_ever_fsynced"]) for e in lost["entries_undone"]] == [
                ("unlink", "old.pt", True), ("create", "step_4/optim.pt", False),
                ("create", "step_4/model.pt", False), ("mkdir", "step_4", True)]
        else:
            assert sorted(os.listdir(m)) == ["step_4"]
            assert (m / "step_4" / "model.pt").read_bytes() == b"m" * 300
            assert (m / "step_4" / "optim.pt").stat().st_size == 0
            assert [(e["op"], e["path"], e["folder_ever_fsynced"]) for e in lost["entries_kept"]] == [
                ("mkdir", "step_4", True), ("create", "step_4/model.pt", False),
                ("create", "step_4/optim.pt", False), ("unlink", "old.pt", True)]
            assert lost["entries_undone"] == []
        assert not os.listdir(tmp_path / ".storage" / "fs" / ".faultfs")  # nothing kept aside any more


@needs_faultfs
def test_an_unknown_power_loss_mode_is_refused_and_loses_nothing(tmp_path):
    from ckpt_chaos.env.storage import StorageError

    with Storage(tmp_path, StorageSpec(fs="tmpfs", size_mb=16, faultfs=True, lazy=True)) as st:
        _written(st.ckpt / "f", b"x")
        with pytest.raises(StorageError, match="unknown power-loss mode 'keep'; allowed: undo, entries-kept"):
            st.client.call("crash", mode="keep")
        assert (st.ckpt / "f").read_bytes() == b"x"


@needs_faultfs
def test_errno_rule_fails_the_nth_matching_call_only(tmp_path):
    with Storage(tmp_path, StorageSpec(fs="host", faultfs=True)) as st:
        st.client.call("arm", rule={"call": "open", "path": "b*", "errno": errno.EDQUOT, "nth": 2, "count": 1})
        (st.ckpt / "a1").write_bytes(b"x")  # does not match the path
        (st.ckpt / "b1").write_bytes(b"x")  # 1st match
        with pytest.raises(OSError) as e:
            (st.ckpt / "b2").write_bytes(b"x")  # 2nd match: fails (an openat from Python's open)
        assert e.value.errno == errno.EDQUOT
        (st.ckpt / "b3").write_bytes(b"x")  # count = 1: only one failure
        status = st.client.call("status")
        assert [(i["op"], i["path"], i["errno"]) for i in status["injected"]] == [("create", "/b2", "EDQUOT")]


# ---- files unlinked while open or mapped: a local file system's semantics (hard_remove) ----------

@needs_faultfs
def test_a_mapped_file_unlinked_leaves_its_folder_removable_and_its_mapping_readable(tmp_path):
    """What safetensors' load_file leaves (a private read-only mapping), then a retention's rmtree:
    without hard_remove libfuse renamed the file to .fuse_hidden* and the rmdir failed (ENOTEMPTY)."""
    data = bytes(range(256)) * (16 << 10)  # 4 MiB: beyond the readahead of the first page's fault
    with Storage(tmp_path, StorageSpec(fs="host", faultfs=True)) as st:
        os.mkdir(st.ckpt / "global_step4")
        (st.ckpt / "global_step4" / "model.safetensors").write_bytes(data)
        with open(st.ckpt / "global_step4" / "model.safetensors", "rb") as f:
            m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        try:
            assert m[:256] == data[:256]
            before = st.client.call("status")["calls"]["read"]
            os.unlink(st.ckpt / "global_step4" / "model.safetensors")
            assert os.listdir(st.ckpt / "global_step4") == [] == os.listdir(st.view / "global_step4")
            os.rmdir(st.ckpt / "global_step4")
            assert os.listdir(st.ckpt) == []
            assert m[:] == data  # the pages not read yet come through the handle, with no path
            assert st.client.call("status")["calls"]["read"] > before
        finally:
            m.close()
        assert os.listdir(st.view) == []


_MAPPED_WRITER = r"""
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)  # as an mmap checkpoint writer does
os.ftruncate(fd, 3 << 20)
with mmap.mmap(fd, 3 << 20) as m:  # a shared, writable mapping
    m[:] = bytes(range(256)) * (3 << 12)
    m.flush()
os.close(fd)
with open(sys.argv[1], "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:  # a shared reader
    assert m[:256] == bytes(range(256))
"""


@needs_faultfs
def test_a_shared_mapping_writes_and_reads_on_faultfs_and_its_pages_are_the_writers_writes(tmp_path):
    """A job's shared mmap works on faultfs (direct_io made the kernel refuse it: ENODEV), its pages reach
    faultfs when the kernel writes them back, counted as the job process's writes at each MiB, and a
    file's times are the backing file's (the nanoseconds mfusepy expects, not seconds read as 1.8 s)."""
    from ckpt_chaos.env.storage import FAULTFS_POINTS
    from ckpt_chaos.run.controller import ProbeServer

    events = []
    with ProbeServer(events.append) as server, Storage(tmp_path, StorageSpec(faultfs=True)) as st:
        st.client.call("report", controller=server.address, points=list(FAULTFS_POINTS), prefix="checkpoints")
        out = subprocess.run([sys.executable, "-c", _MAPPED_WRITER, str(st.ckpt / "m.bin")], capture_output=True,
                             text=True, timeout=60, env={**os.environ, "CKPT_CHAOS_CONTROLLER": server.address,
                                                         "RANK": "1"})
        assert out.returncode == 0, out.stderr
        assert (st.ckpt / "m.bin").read_bytes() == bytes(range(256)) * (3 << 12)
        assert abs((st.ckpt / "m.bin").stat().st_mtime - time.time()) < 60
        assert (st.ckpt / "m.bin").stat().st_mtime_ns == (st.view / "m.bin").stat().st_mtime_ns
    writes = sorted(e["info"]["bytes"] for e in events if e["point"] == "faultfs.write")
    assert writes == [1 << 20, 2 << 20, 3 << 20], events
    assert {e["rank"] for e in events if e["point"] == "faultfs.write"} == {1}


@needs_faultfs
def test_a_read_error_a_rule_injects_once_is_the_readers_and_a_shared_reader_maps_without_a_rule(tmp_path):
    """A file opened to read goes through the page cache, so a shared mapping of it works; while a rule
    on reads is armed, it is read directly, so that the one error a rule injects reaches the reader's
    read(2) (through the cache a readahead takes it, the kernel drops it, and the read that follows
    succeeds)."""
    data = bytes(range(256)) * 256
    with Storage(tmp_path, StorageSpec(fs="host", faultfs=True)) as st:
        (st.ckpt / "w.bin").write_bytes(data)
        with open(st.ckpt / "w.bin", "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            assert m[:] == data
        st.client.call("arm", rule={"call": "read", "path": "w.bin", "errno": errno.EIO, "nth": 1, "count": 1})
        with open(st.ckpt / "w.bin", "rb") as f:
            with pytest.raises(OSError) as e:
                f.read()
            assert e.value.errno == errno.EIO
        assert (st.ckpt / "w.bin").read_bytes() == data  # count = 1: the next read is whole
        st.client.call("disarm")
        with open(st.ckpt / "w.bin", "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            assert m[:256] == data[:256]


@needs_faultfs
def test_an_open_file_unlinked_still_reads_writes_and_obeys_the_rules_by_its_name(tmp_path):
    with Storage(tmp_path, StorageSpec(fs="host", faultfs=True)) as st:
        with open(st.ckpt / "w.bin", "w+b", buffering=0) as f:  # created for reading too
            f.write(b"hello")
            os.rename(st.ckpt / "w.bin", st.ckpt / "w.final")
            os.unlink(st.ckpt / "w.final")
            assert os.listdir(st.ckpt) == [] == os.listdir(st.view)
            assert os.pwrite(f.fileno(), b"HELLO world", 0) == 11
            assert os.pread(f.fileno(), 100, 0) == b"HELLO world"
            os.ftruncate(f.fileno(), 5)
            os.fsync(f.fileno())
            assert os.pread(f.fileno(), 100, 0) == b"HELLO"
            # a rule on the name it had last (after the rename) matches its calls
            st.client.call("arm", rule={"call": "write", "path": "w.final", "errno": errno.EIO})
            with pytest.raises(OSError) as e:
                os.pwrite(f.fileno(), b"x", 0)
            assert e.value.errno == errno.EIO
        injected = st.client.call("status")["injected"]
        assert [(i["op"], i["path"]) for i in injected] == [("write", "/w.final")]  # as the kernel names it


@needs_faultfs
def test_power_loss_reverts_an_unlinked_file_that_comes_back_to_its_fsynced_data(tmp_path):
    """Written through its handle after an unlink no folder fsync made durable: undo brings the file
    back, with only the data that was fsynced."""
    with Storage(tmp_path, StorageSpec(fs="tmpfs", size_mb=16, faultfs=True, lazy=True)) as st:
        m = st.ckpt
        _written(m / "old.pt", b"o" * 10, fsync=True)
        _fsync_dir(m)
        with open(m / "old.pt", "r+b", buffering=0) as f:
            os.unlink(m / "old.pt")
            f.write(b"new data")
        lost = st.client.call("crash", mode="undo")
        assert os.listdir(m) == ["old.pt"] and (m / "old.pt").read_bytes() == b"o" * 10
        assert lost["data_lost"] == [{"path": "old.pt", "size_before": 10, "size_after": 10, "ever_fsynced": True}]
        assert lost["undone"] == ["unlink old.pt"]


# A writer Python cannot see: one write(2) of the whole file, from a process of the job (the
# controller's address in its environment), as safetensors' Rust writer does.
_WRITER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
os.write(fd, bytes(range(256)) * 4096)
os.fsync(fd)
os.close(fd)
os.rename(sys.argv[1], sys.argv[1] + ".final")
os.unlink(sys.argv[1] + ".final")
"""


def _job_writer(path, controller, **env):
    return subprocess.Popen([sys.executable, "-c", _WRITER, str(path)],
                            env={**os.environ, "CKPT_CHAOS_CONTROLLER": controller, "RANK": "1", **env})


@needs_faultfs
def test_faultfs_reports_every_call_of_a_job_process_with_its_rank_and_path(tmp_path):
    from ckpt_chaos.env.storage import FAULTFS_POINTS
    from ckpt_chaos.run.controller import ProbeServer

    events = []
    with ProbeServer(events.append) as server, Storage(tmp_path, StorageSpec(faultfs=True)) as st:
        st.client.call("report", controller=server.address, points=list(FAULTFS_POINTS), prefix="checkpoints")
        assert _job_writer(st.ckpt / "w.bin", server.address).wait(30) == 0
        # the harness's own calls (no controller in its environment) are not the job's
        (st.ckpt / "mine").write_bytes(b"x" * (2 << 20))
    seen = [(e["point"], e["info"]["path"], e["info"].get("bytes"), e["rank"]) for e in events]
    # without a plan (a fault-free run) a write is reported at each MiB it reaches
    assert seen == [("faultfs.truncate", "checkpoints/w.bin", None, 1),  # created: empty, before its first byte
                    ("faultfs.write", "checkpoints/w.bin", 1 << 20, 1),
                    ("faultfs.fsync", "checkpoints/w.bin", None, 1),
                    ("faultfs.done", "checkpoints/w.bin", 1 << 20, 1),
                    ("faultfs.rename", "checkpoints/w.bin.final", None, 1),
                    ("faultfs.remove", "checkpoints/w.bin.final", None, 1)], seen
    assert events[4]["info"]["src"] == "checkpoints/w.bin"
    assert all(e["info"]["source"] == "faultfs" for e in events)


@needs_faultfs
def test_a_kill_held_at_a_planned_fraction_leaves_exactly_that_fraction_on_disk(tmp_path):
    from ckpt_chaos.run.controller import ProbeServer

    hits = []

    def kill_at_half(e):
        if e["point"] == "faultfs.write" and e["info"]["fraction"] >= 0.5 and not hits:
            hits.append(e)
            os.kill(e["pid"], signal.SIGKILL)
            # as the kill nemesis does: the writer, held until this answer, counts as dead already
            wait_gone([e["pid"]], timeout=5)
            hits.append(_running(psutil.Process(e["pid"])))

    with ProbeServer(kill_at_half) as server, Storage(tmp_path, StorageSpec(faultfs=True)) as st:
        st.client.call("report", controller=server.address, points=["faultfs.write"], prefix="checkpoints",
                       planned={"checkpoints/w.bin": 1 << 20})
        proc = _job_writer(st.ckpt / "w.bin", server.address)
        proc.wait(30)
        size = (st.view / "w.bin").stat().st_size
    assert proc.returncode == -signal.SIGKILL
    assert [h["info"]["fraction"] for h in hits[:1]] == [0.5]
    assert hits[1] is False, "the harness waited for a held writer to die, which it cannot before the answer"
    assert size == 1 << 19, f"{size} bytes on disk, the kill was held at {1 << 19}"


_READER = """
import mmap, sys
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    print(len(m[:]), flush=True)
"""


@needs_faultfs
def test_a_kill_held_at_faultfs_open_lands_before_any_reader_reads(tmp_path):
    """A relaunch's load, whatever code reads the file (here a map, as safetensors' loader does):
    faultfs holds a read-only open until the controller has answered, so a kill there reads nothing."""
    from ckpt_chaos.run.controller import ProbeServer

    hits = []

    def kill_at_open(e):
        if e["point"] == "faultfs.open" and not hits:
            hits.append(e)
            os.kill(e["pid"], signal.SIGKILL)
            wait_gone([e["pid"]], timeout=5)

    with ProbeServer(kill_at_open) as server, Storage(tmp_path, StorageSpec(faultfs=True)) as st:
        (st.ckpt / "model.bin").write_bytes(b"m" * 8192)  # the harness's own write: not reported
        st.client.call("report", controller=server.address, points=["faultfs.open"], prefix="checkpoints")
        reader = subprocess.Popen([sys.executable, "-c", _READER, str(st.ckpt / "model.bin")], stdout=subprocess.PIPE,
                                  env={**os.environ, "CKPT_CHAOS_CONTROLLER": server.address, "RANK": "0"})
        out, _ = reader.communicate(timeout=30)
    assert reader.returncode == -signal.SIGKILL and out == b""
    assert [(h["info"]["path"], h["rank"]) for h in hits] == [("checkpoints/model.bin", 0)]


@needs_faultfs
def test_disk_full_is_a_real_enospc(tmp_path):
    with Storage(tmp_path, StorageSpec(fs="tmpfs", size_mb=8)) as st:
        filled = st.fill(headroom=64 * 1024)
        assert filled["free_after"] <= 64 * 1024
        with pytest.raises(OSError) as e:
            (st.ckpt / "big").write_bytes(b"x" * (1 << 20))
        assert e.value.errno == errno.ENOSPC
        assert st.drain()
        (st.ckpt / "big").write_bytes(b"x" * (1 << 20))
    assert (tmp_path / "checkpoints" / "big").stat().st_size == 1 << 20  # copied out for post-mortem
    assert not os.path.ismount(tmp_path / "checkpoints")


@needs_faultfs
@pytest.mark.parametrize("fs", ["tmpfs", "ext4"])
def test_inodes_full_takes_every_inode_with_space_left_and_gives_them_back(tmp_path, fs):
    """A create fails with ENOSPC while a free-space check sees room; the end of the launch gives the
    inodes back (and a tmpfs its own inode count)."""
    from ckpt_chaos.faults import Setting
    from ckpt_chaos.faults.inodes import InodeNemesis
    from ckpt_chaos.scenario import Fault, Trigger

    if fs == "ext4" and (why := missing("ext4")):
        pytest.skip(why)
    with Storage(tmp_path, StorageSpec(fs=fs, size_mb=16)) as st:
        nemesis = InodeNemesis(Setting(tmp_path, st))
        record: dict = {}
        fault = Fault(kind="inodes_full", when=Trigger(point="ckpt.stage"), headroom=1)
        nemesis.inodes_full(fault, {"rank": 0}, record)
        assert record["after"]["inodes_free"] <= 1 and shutil.disk_usage(st.ckpt).free > 8 << 20
        (st.ckpt / "within-the-headroom").touch()
        with pytest.raises(OSError) as e:
            (st.ckpt / ".tmp-step_00000004").mkdir()
        assert e.value.errno == errno.ENOSPC
        given = nemesis.heal()["inodes_given_back"]
        assert given["files"] == record["files"] and nemesis.heal() == {}
        (st.ckpt / ".tmp-step_00000004").mkdir()
        if fs == "tmpfs":
            assert given["nr_inodes"] == record["nr_inodes"]["was"] == os.statvfs(st.fs).f_files


@needs_faultfs
def test_disk_full_leaves_no_room_when_the_first_allocation_does_not_fit(tmp_path, monkeypatch):
    # as when the job writes while the ballast is sized: the space measured is no longer there
    with Storage(tmp_path, StorageSpec(fs="tmpfs", size_mb=8)) as st:
        real = st.free_bytes
        calls = iter([real() + (256 << 10)])
        monkeypatch.setattr(st, "free_bytes", lambda: next(calls, None) or real())
        filled = st.fill(headroom=0)
        assert filled["free_after"] < 4096 * 2, filled
        with pytest.raises(OSError) as e:
            (st.ckpt / "small").write_bytes(b"x" * (64 << 10))
        assert e.value.errno == errno.ENOSPC


# ---- nothing is left behind ----------------------------------------------------------------------


def _wait_for_mounts(cli: subprocess.Popen, n: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len([x for x in ours(cli.pid) if x.startswith("mount ")]) < n:
        assert cli.poll() is None, cli.communicate()[0]
        time.sleep(0.1)
    assert len([x for x in ours(cli.pid) if x.startswith("mount ")]) >= n, "the scenario never mounted its storage"


# Nightly: the leftovers test below removes a killed harness's mounts in make test; this reaches them by Ctrl-C.
@pytest.mark.nightly
@pytest.mark.slow
@needs_faultfs
def test_interrupted_storage_scenario_leaves_no_mount_process_or_directory(tmp_path):
    cli = start_cli(tmp_path, "power-loss-mid-shard-write")
    try:
        _wait_for_mounts(cli, 1)  # faultfs (over a plain directory)
        time.sleep(2)  # into training, with files open on faultfs
        cli.send_signal(signal.SIGINT)
        out, _ = cli.communicate(timeout=120)
    finally:
        cli.kill()
    assert cli.returncode == 130, out
    assert ours(cli.pid) == []
    assert not list((tmp_path / "r").rglob(".storage")), "the storage directory was left behind"


@pytest.mark.slow
@needs_faultfs
def test_leftovers_of_a_killed_harness_are_removed(tmp_path, golden_root):
    cli = start_cli(tmp_path, "disk-full-mid-shard-write", golden=golden_root)  # done before any mount
    try:
        _wait_for_mounts(cli, 2)  # tmpfs + bind mount
        # Stopped, the harness is alive, so no other harness (a test on another xdist worker) takes its
        # mounts for leftovers yet; SIGKILL then gives it no chance to clean up.
        cli.send_signal(signal.SIGSTOP)
        mounted = [x for x in ours(cli.pid) if x.startswith("mount ")]
    finally:
        cli.kill()
        cli.wait()
    assert len(mounted) >= 2, "expected the harness to hold its mounts when it was killed"
    removed = remove_leftovers()  # or an earlier call by a harness beside this test
    assert ours(cli.pid) == [], removed


# ---- planted storage bugs ------------------------------------------------------------------------

def run_planted(tmp_path, golden_root, scenario_file: str, module: str):
    s = dataclasses.replace(load(SCENARIOS / scenario_file), trainer_module=module)
    result = run_scenario(s, tmp_path, golden_root)
    assert result.verdict == "fail", "the harness missed the planted bug"
    assert ours(os.getpid()) == []
    return {c["name"]: c["detail"] for c in result.checks if c["verdict"] == "fail"}


@pytest.mark.slow
@needs_faultfs
def test_rename_without_fsync_is_caught_by_power_loss(tmp_path, golden_root):
    bad = run_planted(tmp_path, golden_root, "power-loss-after-latest.toml", "tests.planted.rename_without_fsync")
    detail = bad["committed_survives@0"]
    assert "step_00000008 was committed before the crash but is not valid after it" in detail
    assert "after power_loss at ckpt.latest (rank 0), which lost the un-fsynced data" in detail
    # step 4 was committed the same way: nothing survives, the relaunch starts over
    assert "launch 1 resumed from scratch, expected step_00000008" in bad["resume_from"]


@pytest.mark.slow
def test_loader_trusting_the_newest_directory_is_caught(tmp_path, golden_root):
    bad = run_planted(tmp_path, golden_root, "corrupt-bitflip-in-shard.toml", "tests.planted.loader_trusts_newest")
    detail = bad["never_loaded_torn@1"]
    assert "launch 1 loaded step_00000008 although it was not a valid checkpoint" in detail
    assert "__0_0.distcp fails its XXH3-128 checksum" in detail
    assert "after corrupt (flip __0_0.distcp: 8 bits flipped" in detail
    assert "did not reject it; it resumed from step_00000008" in bad["fault_0_detected"]


@pytest.mark.slow
@needs_faultfs
def test_save_swallowing_enospc_is_caught(tmp_path, golden_root):
    bad = run_planted(tmp_path, golden_root, "errno-enospc-mid-shard-write.toml", "tests.planted.save_swallows_enospc")
    assert "reported no failure" in bad["fault_0_surfaced"] and "an error was swallowed" in bad["fault_0_surfaced"]
    detail = bad["committed_valid@step_00000008"]
    assert "the trainer reported step_00000008 committed, but it is not a valid checkpoint" in detail
    assert "after errno (ENOSPC on write of .tmp-*/__1_0.distcp) at ckpt.stage (rank 1)" in detail


def test_a_machine_without_what_a_fault_needs_skips_loudly(tmp_path, monkeypatch):
    import ckpt_chaos.faults.storage

    monkeypatch.setattr(ckpt_chaos.faults.storage, "missing", lambda *a, **k: "mounting a file system needs root")
    result = run_scenario(load(SCENARIOS / "disk-full-mid-shard-write.toml"), tmp_path / "r", tmp_path / "golden")
    assert result.verdict == "skipped"
    assert result.reason == ("cannot inject disk_full on fs=tmpfs: mounting a file system needs root")
    assert not (tmp_path / "r").exists(), "a skipped scenario must not run or write anything"


# make nightly's search (seed 20261127), shrunk: the disk fills as rank 1 begins a save and the power
# is lost as rank 0 begins the same one. The launch ends before any call is seen failing.
MASKED_DISK_FULL = """
name = "explore-fault-surfaced-1f59fa"
description = "a disk filled at rank 1's save, and a power loss at rank 0's same save"
tags = [
    "explore",
]
suites = [
    "default",
    "full",
]
world_size = 2
trainer_module = "reference_trainer"
probe = true

[[faults]]
kind = "disk_full"
target = "triggering"
attempt = 0

[faults.when]
point = "ckpt.stage"
rank = 1
nth = 1
name = "step_00000002"

[[faults]]
kind = "power_loss"
target = "triggering"
attempt = 0

[faults.when]
point = "ckpt.stage"
rank = 0
nth = 1
name = "step_00000002"
after = 0

[trainer]
max_steps = 8
ckpt_every_steps = 2
dataset_size = 96
global_batch = 16
grad_accum = 2
collective_timeout_s = 8

[storage]
fs = "tmpfs"
size_mb = 16

[recovery]
relaunch = "harness"
max_restarts = 1
changes = []

[expect]
trajectory = "bit-exact"
rel_tol = 0.03
max_lost_steps = 8
deadline_s = 300.0
refused = []
"""


@pytest.mark.nightly  # make test: the ENOSPC swallow test
@pytest.mark.slow
def test_a_disk_full_cut_short_by_a_power_loss_is_not_called_a_swallowed_error(tmp_path, golden_root):
    """No failed call, no report, and a later fault that ended the launch: the evidence does not show
    whether the trainer would have reported the failure, so fault_0_surfaced could not tell; it used to
    fail the trainer for swallowing an error nobody saw happen."""
    path = tmp_path / "masked.toml"
    path.write_text(MASKED_DISK_FULL)
    r = run_scenario(load(path), tmp_path / "runs", golden_root)
    checks = {c["name"]: c for c in r.checks}
    assert not [n for n, c in checks.items() if c["verdict"] == "fail"], r.checks
    fired = checks["fault_0_fired"]
    if fired["verdict"] == "unknown":  # rank 0's power loss ended the launch before rank 1 reached its save
        assert "fault 1 (power_loss) ended launch 0" in fired["detail"], fired
        assert "fault_0_surfaced" not in checks, r.checks
        return
    surfaced = checks["fault_0_surfaced"]
    if surfaced["verdict"] == "unknown":  # when rank 1's write did fail first, the trainer reports it: pass
        assert "power_loss" in surfaced["detail"] and "was not shown" in surfaced["detail"], surfaced


def test_a_fault_whose_launch_another_fault_ended_first_is_unknown_not_unfired(tmp_path):
    """Rank 0's power loss at the save ended the launch before rank 1 reached the same save's probe:
    the disk-full never fired, and the run cannot show whether it would have. Not the scenario's
    fault nor the trainer's: unknown, naming the fault that ended the launch."""
    from ckpt_chaos.check.outcome import faults_fired as _faults_fired
    from ckpt_chaos.check.history import Exited, FaultFired
    from ckpt_chaos.check.verdict import Report, Run

    path = tmp_path / "masked.toml"
    path.write_text(MASKED_DISK_FULL)
    s = load(path)
    power = FaultFired(index=1, fault="power_loss", target="triggering", launch=0, t=2.0,
                       at={"point": "ckpt.stage", "rank": 0, "info": {"name": "step_00000002"}})
    report = Report()
    _faults_fired(Run(s, tmp_path, tmp_path, [power, Exited(launch=0, rc=137, snapshot={})], []), report)
    verdicts = {c.fault: (c.verdict, c.detail) for c in report.checks}
    assert verdicts[1][0] == "pass"
    assert verdicts[0][0] == "unknown" and "fault 1 (power_loss) ended launch 0" in verdicts[0][1], verdicts
    # with no fault that ends a launch, a trigger never reached is the scenario's to fix: still unknown
    report = Report()
    _faults_fired(Run(s, tmp_path, tmp_path, [Exited(launch=0, rc=0, snapshot={})], []), report)
    assert [c.verdict for c in report.checks] == ["unknown", "unknown"], report.checks
    assert "check faults[0].when against the points the trainer reports" in report.checks[0].detail


# ---- which report answers for which fault ------------------------------------------------------

def _fired(index: int, t: float, point: str, name: str | None) -> "FaultFired":
    from ckpt_chaos.check.history import FaultFired

    return FaultFired(index=index, fault="errno", target="rank:0", launch=0, t=t,
                      at={"point": point, "rank": 0, "info": {"name": name} if name else {}},
                      detail={"via": "faultfs", "rule": index + 1, "pids": [7]})


def test_a_failed_call_is_tied_to_the_checkpoint_it_was_part_of():
    from ckpt_chaos.faults.storage import _failed_in

    manifest = _fired(1, 2.0, "ckpt.fsync", "step_00000004")
    assert _failed_in(manifest, [{"path": "/.tmp-step_00000004/manifest.json.tmp", "t": 2.1}]) == {"step_00000004"}
    # outside any checkpoint (the directory, latest.tmp): the save the fault fired in
    root = _fired(2, 3.0, "ckpt.manifest", "step_00000006")
    assert _failed_in(root, [{"path": "/", "t": 3.1}, {"path": "/latest.tmp", "t": 3.2}]) == {"step_00000006"}
    # another checkpoint's call (retention renaming step 2 to trash): it, and the save that retires it
    retire = _fired(3, 4.0, "ckpt.latest", "step_00000006")
    assert _failed_in(retire, [{"path": "/step_00000002", "t": 4.1}]) == {"step_00000002", "step_00000006"}
    assert _failed_in(retire, [{"path": "/.trash-step_00000002", "t": 4.1}]) == {"step_00000002", "step_00000006"}
    # nothing names one (a fault fired at a step): every report still counts
    assert _failed_in(_fired(0, 1.0, "step.begin", None), [{"path": "/", "t": 1.1}]) == set()
    assert _failed_in(manifest, None) == set()


def test_a_later_faults_report_does_not_answer_for_an_earlier_swallowed_one():
    """Two faults in one launch: the save of step 4 swallowed its manifest's fsync error (no report),
    the save of step 6 reported its own. fault_1_surfaced used to pass on step 6's report."""
    import types

    from ckpt_chaos.check.verdict import Report
    from ckpt_chaos.faults.storage import _surfaced

    f1, f2 = _fired(1, 2.0, "ckpt.fsync", "step_00000004"), _fired(2, 3.0, "ckpt.manifest", "step_00000006")
    events = [{"event": "save_failed", "name": "step_00000006", "attempt": 0, "t": 3.2}]
    fault = types.SimpleNamespace(kind="errno", params=types.SimpleNamespace(errno="EIO", call="fsync"),
                                  spec=types.SimpleNamespace(fills_disk=False))
    run = types.SimpleNamespace(s=types.SimpleNamespace(faults=[fault] * 3), events=events,
                                exit_of=lambda launch: types.SimpleNamespace(rc=0), faults=lambda: [f1, f2],
                                probes=lambda *a: [])
    verdicts = {}
    for h, path in ((f1, "/.tmp-step_00000004/manifest.json.tmp"), (f2, "/")):
        report = Report()
        _surfaced(run, h, report, [{"path": path, "t": h.t + 0.1, "pid": 7}])
        (check,) = report.checks
        verdicts[h.index] = (check.verdict, check.detail)
    assert verdicts[2][0] == "pass" and "save_failed step_00000006" in verdicts[2][1]
    assert verdicts[1][0] == "fail", verdicts[1]
    assert "for step_00000004; it reported only save_failed step_00000006" in verdicts[1][1]


def test_a_report_made_before_the_call_failed_does_not_answer_for_it():
    """The relaunch rejects a torn step 8 (ckpt_rejected step 8), then moving it aside fails and the
    trainer swallows that: the rejection came before the failed call and is not its report."""
    import types

    from ckpt_chaos.check.verdict import Report
    from ckpt_chaos.faults.storage import _surfaced

    h = _fired(0, 1.0, "train.start", None)
    fault = types.SimpleNamespace(kind="errno", params=types.SimpleNamespace(errno="EIO", call="rename"),
                                  spec=types.SimpleNamespace(fills_disk=False))
    hits = [{"path": "/step_00000008", "t": 1.5, "pid": 7}]
    for t, verdict in ((1.2, "fail"), (1.6, "pass")):
        events = [{"event": "ckpt_rejected", "name": "step_00000008", "attempt": 0, "t": t}]
        run = types.SimpleNamespace(s=types.SimpleNamespace(faults=[fault]), events=events,
                                    exit_of=lambda launch: types.SimpleNamespace(rc=0), faults=lambda: [h],
                                    probes=lambda *a: [])
        report = Report()
        _surfaced(run, h, report, hits)
        (check,) = report.checks
        assert check.verdict == verdict, (t, check)
