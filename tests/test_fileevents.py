"""The fanotify recorder (ckpt_chaos/env/fileevents.py): what processes, Python or native, did to the
files under a run's checkpoint folder, each named by its process (job or not, rank)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ckpt_chaos.env import fileevents
from ckpt_chaos.env.fileevents import FILES, FileEvents, available
from ckpt_chaos.probe.auto_state import ENV_RUN_DIR

needs_fanotify = pytest.mark.skipif(available() is not None, reason=f"fanotify: {available()}")


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / FILES).read_text().splitlines()]


def of(run: Path, pid: int) -> list[tuple]:
    return [(r["op"], r["path"], r.get("wrote"), r.get("size"), r.get("src"), r["dir"])
            for r in records(run) if r.get("pid") == pid]


class Held:
    """A child that does its work, says so, and lives on until told to go: the recorder reads its
    environment while it lives, as it does a trainer's (a process gone before its first event is
    read is recorded with ``job: null``)."""

    def __init__(self, code: str, env: dict[str, str], cwd: Path):
        script = textwrap.dedent(code) + "\nprint('done', flush=True)\nsys.stdin.readline()\n"
        self.p = subprocess.Popen([sys.executable, "-c", "import sys, os\n" + script], env=env, cwd=cwd,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.p.stdout.readline().strip() == "done"
        self.pid = self.p.pid

    def release(self) -> None:
        self.p.communicate("\n", timeout=20)
        assert self.p.returncode == 0


@pytest.fixture
def run(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    return run


def job_env(run: Path, rank: int) -> dict[str, str]:
    return {**os.environ, ENV_RUN_DIR: str(run), "RANK": str(rank)}


@needs_fanotify
def test_each_process_is_recorded_with_what_it_did_to_the_checkpoint_files(run):
    ckpt = run / "checkpoints"
    with FileEvents(run, [ckpt]) as fe:
        fe.launch(0)
        (ckpt / "weights.bin").write_bytes(b"w" * 8192)  # the harness's own: not recorded
        (ckpt / "big.bin").write_bytes(os.urandom(1 << 20))
        # (1) a temporary name, fsynced, renamed into place (safetensors, torch.save done safely)
        writer = Held("""
            with open("checkpoints/model.safetensors.tmp", "wb") as f:
                f.write(b"x" * 5000)
                f.flush()
                os.fsync(f.fileno())
            os.replace("checkpoints/model.safetensors.tmp", "checkpoints/model.safetensors")
        """, job_env(run, 0), run)
        # (2) a reader that reads through a mapping only (numpy's mmap_mode, safetensors' safe_open)
        mapper = Held("""
            import mmap
            fd = os.open("checkpoints/weights.bin", os.O_RDONLY)
            m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
            os.close(fd)
            assert m[:4] == b"wwww"
        """, job_env(run, 1), run)
        # (3) a native reader: cat, held on its full pipe until the recorder has seen its open
        cat = subprocess.Popen(["cat", str(ckpt / "big.bin")], env=job_env(run, 2), stdout=subprocess.PIPE)
        # (4) a process of no job, in the same folder
        stranger = Held("""
            open("checkpoints/stranger.txt", "w").write("not the job's")
        """, {k: v for k, v in os.environ.items() if k != ENV_RUN_DIR}, run)
        # (5) a folder made and written at once (a save into step_8/)
        saver = Held("""
            os.mkdir("checkpoints/step_8")
            with open("checkpoints/step_8/shard_0.bin", "wb") as f:
                f.write(b"s" * 3000)
        """, job_env(run, 3), run)
        assert fe.drain()
        assert len(cat.communicate(timeout=20)[0]) == 1 << 20
        for child in (writer, mapper, stranger, saver):
            child.release()  # the mapping goes with the process: its file's close comes now
        assert fe.drain()
        assert fe.stats["overflow"] == 0

    out = records(run)
    assert out[0] == {"op": "watch", "launch": 0, "t": out[0]["t"], "source": "fanotify", "roots": ["checkpoints"]}
    assert os.getpid() not in {r.get("pid") for r in out}
    assert all(r["launch"] == 0 and r["source"] == "fanotify" for r in out)
    who = {r["pid"]: (r["job"], r["rank"]) for r in out if "pid" in r}
    assert who[writer.pid] == (True, 0) and who[mapper.pid] == (True, 1) and who[cat.pid] == (True, 2)
    assert who[stranger.pid] == (False, None) and who[saver.pid] == (True, 3)

    tmp, final = "checkpoints/model.safetensors.tmp", "checkpoints/model.safetensors"
    assert of(run, writer.pid) == [("create", tmp, None, None, None, False), ("open", tmp, None, None, None, False),
                                   ("close", tmp, True, 5000, None, False),
                                   ("rename", final, None, None, tmp, False)]
    assert of(run, mapper.pid) == [("open", "checkpoints/weights.bin", None, None, None, False),
                                   ("close", "checkpoints/weights.bin", False, 8192, None, False)]
    assert of(run, cat.pid) == [("open", "checkpoints/big.bin", None, None, None, False),
                                ("close", "checkpoints/big.bin", False, 1 << 20, None, False)]
    assert ("close", "checkpoints/stranger.txt", True, 13, None, False) in of(run, stranger.pid)
    assert of(run, saver.pid) == [("create", "checkpoints/step_8", None, None, None, True),
                                  ("create", "checkpoints/step_8/shard_0.bin", None, None, None, False),
                                  ("open", "checkpoints/step_8/shard_0.bin", None, None, None, False),
                                  ("close", "checkpoints/step_8/shard_0.bin", True, 3000, None, False)]


@needs_fanotify
def test_a_renamed_folder_names_its_events_by_the_path_they_happened_at(run):
    ckpt = run / "checkpoints"
    with FileEvents(run, [ckpt, run / "staging"]) as fe:
        fe.launch(0)
        fe.drain()
        fe.launch(1)
        mover = Held("""
            os.mkdir("checkpoints/step_4.tmp")
            open("checkpoints/step_4.tmp/a", "w").write("a")
            os.rename("checkpoints/step_4.tmp", "checkpoints/step_4")
            open("checkpoints/step_4/b", "w").write("b")
            os.makedirs("staging")
            os.rename("checkpoints/step_4/b", "staging/b")
            os.unlink("staging/b")
        """, job_env(run, 0), run)
        assert fe.drain()
        mover.release()
    out = records(run)
    assert [(r["op"], r["launch"], r["roots"]) for r in out if r["op"] == "watch"] == \
        [("watch", 0, ["checkpoints", "staging"]), ("watch", 1, ["checkpoints", "staging"])]
    ops = [(op, path, src) for op, path, _w, _s, src, _d in of(run, mover.pid) if op != "open"]
    assert ops == [("create", "checkpoints/step_4.tmp", None), ("create", "checkpoints/step_4.tmp/a", None),
                   ("close", "checkpoints/step_4.tmp/a", None),
                   ("rename", "checkpoints/step_4", "checkpoints/step_4.tmp"),
                   ("create", "checkpoints/step_4/b", None), ("close", "checkpoints/step_4/b", None),
                   ("create", "staging", None),
                   ("rename", "staging/b", "checkpoints/step_4/b"), ("delete", "staging/b", None)]
    assert {r["launch"] for r in out if r.get("pid") == mover.pid} == {1}


@needs_fanotify
def test_a_folder_moved_in_from_elsewhere_is_watched_from_then_on(run):
    # The kernel is told to drop the opens and closes of folders away from the roots (they are most
    # of a file system's events); one moved into a root is heard again.
    step = textwrap.dedent("""
        import os, sys
        def step():
            print("step", flush=True)
            sys.stdin.readline()
        os.makedirs("../elsewhere")
        open("../elsewhere/x", "w").write("x")
        step()
        os.rename("../elsewhere", "checkpoints/moved")
        step()
        open("checkpoints/moved/x").read()
        step()
    """)
    with FileEvents(run, [run / "checkpoints"]) as fe:
        fe.launch(0)
        p = subprocess.Popen([sys.executable, "-c", step], env=job_env(run, 0), cwd=run, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        for _ in range(3):
            assert p.stdout.readline().strip() == "step"
            assert fe.drain()
            p.stdin.write("\n")
            p.stdin.flush()
        p.communicate(timeout=20)
        assert fe._quiet, "the folder away from the roots was not quieted"
    assert [(op, path) for op, path, *_ in of(run, p.pid)] == [
        ("rename", "checkpoints/moved"), ("open", "checkpoints/moved/x"), ("close", "checkpoints/moved/x")]


def test_a_recorder_that_cannot_run_says_why_in_each_launch(run, monkeypatch):
    monkeypatch.setenv(fileevents.ENV_SWITCH, "off")
    with FileEvents(run, [run / "checkpoints"]) as fe:
        fe.launch(0)
        (run / "checkpoints" / "x").write_text("x")
        assert fe.drain()
        fe.launch(1)
    out = records(run)
    assert [r["op"] for r in out] == ["unavailable", "unavailable"] and [r["launch"] for r in out] == [0, 1]
    assert fileevents.ENV_SWITCH in out[0]["why"]


@needs_fanotify
def test_on_faultfs_the_mount_is_watched_and_the_recorders_opens_are_not_the_jobs(run):
    from ckpt_chaos.env.storage import Storage, StorageSpec, missing

    why = missing(faultfs=True)
    if why:
        pytest.skip(why)
    with Storage(run, StorageSpec(faultfs=True)) as storage, FileEvents(run, [run / "checkpoints"]) as fe:
        fe.launch(0)
        writer = Held("""
            with open("checkpoints/model.safetensors", "wb") as f:
                f.write(b"m" * 4096)
            open("checkpoints/model.safetensors", "rb").read()
        """, job_env(run, 0), run)
        assert fe.drain()
        writer.release()
        calls = storage.client.call("status")["calls"]
    out = records(run)
    assert out[0]["source"] == "fanotify-mount" and out[0]["roots"] == ["checkpoints"]
    path = "checkpoints/model.safetensors"
    got = [(r["op"], r.get("wrote"), r.get("size"), r["source"], r["job"], r["rank"])
           for r in out if r.get("pid") == writer.pid and r["path"] == path]
    assert [g for g in got if g[0] == "close"] == [("close", True, 4096, "fanotify-mount", True, 0),
                                                   ("close", False, 4096, "fanotify-mount", True, 0)], got
    # The kernel merges an event into one of the same kind, file and process still queued: when the
    # recorder reads late, the second open is folded into the first (the close says it was a read).
    assert got[0] == ("open", None, None, "fanotify-mount", True, 0), got
    assert [g for g in got if g[0] == "open"] in ([got[0]], [got[0]] * 2), got
    # the job's one open and one create; the recorder's four opens of the same file are not counted
    assert calls.get("open", 0) == 1 and calls.get("create", 0) == 1
