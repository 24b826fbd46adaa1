"""The remote tier: restores after a lost disk, planted uploader bug caught, bad [remote] input named.

Every scenario here runs a real moto S3 server and the fault proxy as child processes; the
tests also assert that neither, nor any uploader, outlives the run.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.env import launcher
from ckpt_chaos.run.runner import run_scenario
from ckpt_chaos.scenario import ScenarioError, from_dict, load
from tests.helpers import golden_of_the_reference

SCENARIOS = builtin_scenarios() / "remote"


def _children() -> dict[tuple[int, float], str]:
    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out[p.pid, p.create_time()] = " ".join(p.cmdline()[:4])
        except psutil.NoSuchProcess:
            pass
    return out


def _no_children_left(before: dict[tuple[int, float], str]) -> None:
    """Nothing the run started outlives it. Only what it started: a worker process keeps children of
    its own across tests (multiprocessing's resource tracker, once any test used a semaphore)."""
    launcher.close_spares()  # the warm launcher agents are the harness's, kept for the next launch
    alive = [cmd for key, cmd in _children().items() if key not in before]
    assert not alive, f"left running: {alive}"


def _run(tmp_path, golden_root, scenario_file: str, module: str = "reference_trainer"):
    s = dataclasses.replace(load(SCENARIOS / scenario_file), trainer_module=module)
    golden_of_the_reference(s, golden_root)
    before = _children()
    result = run_scenario(s, tmp_path, golden_root)
    _no_children_left(before)
    return result


# Nightly: the default suite's remote scenarios lose the disk and restore (make chaos, every CI run).
@pytest.mark.nightly
@pytest.mark.slow
def test_a_node_that_lost_its_disk_restores_the_newest_durable_checkpoint(tmp_path, golden_root):
    result = _run(tmp_path, golden_root, "disk-lost-before-upload-finished.toml")
    assert result.verdict == "pass", [c for c in result.checks if c["verdict"] == "fail"]
    events = [json.loads(line) for line in (tmp_path / "disk-lost-before-upload-finished" / "events.jsonl").open()]
    restored = [e["name"] for e in events if e["event"] == "restored_from_remote"]
    assert restored == ["step_00000004"]


@pytest.mark.slow
@pytest.mark.nightly
def test_a_job_that_finished_training_but_died_draining_its_uploads_is_started_again(tmp_path, golden_root):
    # The node is lost while rank 0 drains the final upload: training had finished, but the launch exited
    # -9 with the final checkpoint on no disk that survives. The harness used to stop there (job_completed
    # failed); a scheduler starts the job again, which restores step 6 and trains steps 7 and 8 again.
    result = _run(tmp_path, golden_root, "disk-lost-during-final-drain.toml")
    assert result.verdict == "pass", [c for c in result.checks if c["verdict"] == "fail"]
    history = [json.loads(line) for line in (tmp_path / "disk-lost-during-final-drain" / "history.jsonl").open()]
    exits = [h["rc"] for h in history if h["source"] == "harness" and h["kind"] == "exit"]
    assert exits == [-9, 0]
    assert result.resumed_from == ["step_00000006"]


@pytest.mark.slow
def test_an_uploader_that_marks_durable_before_its_objects_is_caught(tmp_path, golden_root):
    result = _run(tmp_path, golden_root, "uploader-killed-mid-object.toml", "tests.planted.uploader_marks_durable_early")
    assert result.verdict == "fail", "the harness missed the planted bug"
    bad = {c["name"]: c["detail"] for c in result.checks if c["verdict"] == "fail"}
    detail = bad["remote_durable_complete@fault_0"]
    assert "step_00000002 is marked durable (manifest.json uploaded) but" in detail
    assert "is missing" in detail
    assert "the uploader marked it durable before every object was complete" in detail


def _scenario(**extra) -> dict:
    base = {"world_size": 2, "trainer": {"max_steps": 8, "ckpt_every_steps": 2}}
    base.update(extra)
    return base


@pytest.mark.parametrize("data, key, words", [
    (_scenario(faults=[{"kind": "toxic", "when": {"point": "upload.begin"}}]),
     "faults[0].kind", "needs a remote tier"),
    (_scenario(remote={}, faults=[{"kind": "toxic", "toxic": "netem", "when": {"point": "upload.begin"}}]),
     "faults[0].toxic", "unknown toxic 'netem'"),
    (_scenario(remote={}, faults=[{"kind": "toxic", "toxic": "bandwidth", "attributes": {"latency": 5},
                                   "when": {"point": "upload.begin"}}]),
     "faults[0].attributes.latency", "bandwidth takes rate"),
    (_scenario(remote={"proxy": False}, faults=[{"kind": "toxic", "when": {"point": "upload.begin"}}]),
     "faults[0].link", "set [remote] proxy = true"),
    (_scenario(faults=[{"kind": "kill", "target": "uploader", "when": {"point": "upload.begin"}}]),
     "faults[0].target", "add a [remote] table"),
    (_scenario(remote={"retries": "many"}), "remote.retries", "wrong type"),
    (_scenario(remote={"bucket": "x"}), "remote.bucket", "unknown key"),
])
def test_bad_remote_input_names_the_file_key_and_fix(data, key, words):
    with pytest.raises(ScenarioError) as e:
        from_dict(data, "scenarios/remote/x.toml", "x")
    assert f"scenarios/remote/x.toml: {key}:" in str(e.value)
    assert words in str(e.value)


@pytest.mark.parametrize("keep", [True, False])
def test_a_heal_in_a_later_launch_lifts_a_kept_toxic_only(keep):
    data = _scenario(remote={}, recovery={"max_restarts": 1}, faults=[
        {"kind": "toxic", "toxic": "reset_peer", "keep": keep, "when": {"point": "step.end", "rank": 0, "step": 3}},
        {"kind": "kill", "target": "rank:1", "when": {"point": "step.end", "rank": 1, "step": 4, "after": 0}},
        {"kind": "heal", "attempt": 1, "when": {"point": "step.end", "rank": 0, "step": 5}}])
    if keep:
        from_dict(data, "scenarios/remote/x.toml", "x")
        return
    with pytest.raises(ScenarioError, match="faults\\[2\\].kind: heal without a toxic in the same launch"):
        from_dict(data, "scenarios/remote/x.toml", "x")


def test_the_remote_tier_lists_and_removes_what_a_dead_harness_left(tmp_path):
    import os
    import subprocess

    from ckpt_chaos.env import objectstore

    with objectstore.RemoteTier(tmp_path, "leftovers", proxy=False) as tier:
        mine = objectstore.leftovers(owner=os.getpid())
        assert mine == [f"process {tier.s3.proc.pid}"], mine
        assert not set(mine) & set(objectstore.leftovers()), "a live harness's server is not a leftover"
    assert objectstore.leftovers(owner=os.getpid()) == []
    dead = subprocess.Popen(["true"])
    dead.wait()  # a harness pid that no longer runs
    # It says so once it runs: until execve has set up the new stack, /proc/PID/environ reads empty, and
    # Popen can return (the vfork parent resumes) before that.
    orphan = subprocess.Popen([sys.executable, "-c", "print('ready', flush=True); import time; time.sleep(60)"],
                              env={**os.environ, objectstore.OWNER_ENV: str(dead.pid)}, stdout=subprocess.PIPE, text=True)
    try:
        assert orphan.stdout.readline().strip() == "ready"
        assert f"process {orphan.pid}" in objectstore.leftovers()
        assert f"process {orphan.pid}" in objectstore.remove_leftovers()
        assert orphan.wait(10) == -9
    finally:
        orphan.kill()
        orphan.wait()


def test_the_uploaders_retries_keep_the_launch_attempt_of_their_events(tmp_path):
    """Its events carry the launch in ``attempt`` like every trainer event: a retry's own number must
    not overwrite it (the checks took each retry for a launch of its own)."""
    import io

    from reference_trainer import remote

    class Unreachable:
        def matches(self, *a):
            raise ConnectionError("reset")

    up = object.__new__(remote.Uploader)
    up.events, up.attempt, up.process_id, up.store, up.done = io.StringIO(), 0, "p", Unreachable(), set()
    manifest = {"format": 1, "files": {".metadata": {"size": 1, "sha256": "x"}}}
    assert up._upload("step_00000002", tmp_path, manifest, retries=3, backoff=0.0, started=0.0) is False
    events = [json.loads(line) for line in up.events.getvalue().splitlines()]
    assert [e["event"] for e in events] == ["upload_retry", "upload_attempt", "upload_retry", "upload_attempt",
                                            "upload_retry", "upload_failed"]
    assert {e["attempt"] for e in events} == {0}
    assert [e["upload_attempt"] for e in events[:5]] == [1, 2, 2, 3, 3]



def _uploader_args(run_dir: Path, parent_pid: int) -> str:
    return json.dumps({"remote_url": "s3://bucket/run", "remote_endpoint": "http://127.0.0.1:9", "remote_timeout_s": 1,
                       "remote_keep_last": 1, "upload_retries": 0, "upload_backoff_s": 0, "run_dir": str(run_dir),
                       "ckpt_dir": str(run_dir / "checkpoints"), "parent_pid": parent_pid})


def test_an_uploader_whose_rank_0_is_already_gone_kills_itself(tmp_path):
    """Rank 0 can die between starting the uploader and the uploader's prctl: the uploader has then
    been re-parented already, and must not live on unowned."""
    from reference_trainer import remote

    p = subprocess.run([sys.executable, "-m", remote.UPLOADER_MODULE, _uploader_args(tmp_path, 1)], input=b"",
                       timeout=60)
    assert p.returncode == -9
    assert not (tmp_path / "events.jsonl").exists()  # killed before it did anything


def test_the_uploader_dies_with_rank_0(tmp_path):
    """Started without a preexec_fn (so that Popen can vfork on the training loop), the uploader ties
    its life to rank 0 itself: a SIGKILLed rank 0 takes its uploader with it, as on a lost node."""
    rank0 = (
        "import os, subprocess, sys, time\n"
        "from reference_trainer import remote\n"
        "from tests.test_remote_tier import _uploader_args\n"
        "from pathlib import Path\n"
        "up = subprocess.Popen([sys.executable, '-m', remote.UPLOADER_MODULE, _uploader_args(Path(sys.argv[1]), os.getpid())],\n"
        "                      stdin=subprocess.PIPE)\n"
        # a process that outlives rank 0 holds the pipe open: the uploader sees no end of its input
        "holder = subprocess.Popen(['sleep', '600'], pass_fds=(up.stdin.fileno(),), start_new_session=True)\n"
        "print(up.pid, holder.pid, flush=True)\n"
        "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", rank0, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        up_pid, holder_pid = map(int, parent.stdout.readline().split())
        uploader, holder = psutil.Process(up_pid), psutil.Process(holder_pid)
        up = tmp_path / "events.jsonl"
        deadline = time.monotonic() + 60
        while not (up.exists() and "uploader_up" in up.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "uploader_up" in up.read_text() and uploader.ppid() == parent.pid
        parent.kill()
        uploader.wait(10)  # gone, though its input is still open: PR_SET_PDEATHSIG's SIGKILL
        assert holder.is_running()
    finally:
        parent.kill()
        parent.wait()
        for pid in (up_pid, holder_pid) if "holder_pid" in locals() else ():
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass


def test_rank_0_trains_only_once_its_uploader_is_up(tmp_path, monkeypatch):
    """``UploadQueue.start`` returns after the uploader has imported its S3 client and said so: an
    uploader still starting (seconds, niced, on a busy node) skipped every checkpoint committed
    meanwhile but the newest, and a scenario aimed at the step-4 upload never fired. One that dies
    first is logged and does not hold training up."""
    from types import SimpleNamespace

    from reference_trainer import remote

    (tmp_path / "checkpoints").mkdir()
    cfg = SimpleNamespace(remote_url="s3://bucket/run", remote_endpoint="http://127.0.0.1:9", remote_timeout_s=1,
                          remote_keep_last=1, upload_retries=0, upload_backoff_s=0, run_dir=str(tmp_path),
                          checkpoint_dir=tmp_path / "checkpoints")
    logged = []
    q = remote.UploadQueue(cfg, lambda event, **f: logged.append(event))
    q.start()
    try:
        events = [json.loads(line)["event"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
        assert "uploader_up" in events and logged == ["uploader_started"]
    finally:
        q.proc.stdin.close()
        q.proc.wait(30)

    monkeypatch.setattr(remote, "UPLOADER_MODULE", "json.tool")  # takes the arguments for a file: exits 1, saying nothing on the pipe
    q = remote.UploadQueue(cfg, lambda event, **f: logged.append((event, f)))
    q.start()
    q.proc.wait(30)
    assert logged[-1][0] == "uploader_not_ready" and logged[-1][1]["waited_s"] is None, logged


def test_a_server_whose_port_was_taken_before_it_bound_it_starts_again_on_another(tmp_path, monkeypatch):
    """Four test workers side by side: moto died with "Port ... is in use by another program" when a
    process bound its freshly chosen port first. The harness starts it again on another port."""
    import socket

    from ckpt_chaos.env import objectstore

    taken = socket.socket()  # bound, not listening: as an outgoing connection holds its port
    taken.bind(("127.0.0.1", 0))
    ports = iter([taken.getsockname()[1], objectstore.free_port()])
    monkeypatch.setattr(objectstore, "free_port", lambda: next(ports))
    log = tmp_path / "server.log"
    proc, port = objectstore._serve(lambda p: [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(p)],
                                    "a test server", log, None)
    try:
        assert port != taken.getsockname()[1]
        assert "in use" in log.read_text().lower()
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        proc.kill()
        proc.wait()
        taken.close()

    # any other way of dying is not retried: it says so at once
    calls = []
    monkeypatch.setattr(objectstore, "free_port", lambda: calls.append(1) or 1)
    with pytest.raises(RuntimeError, match="a failing server exited with 3"):
        objectstore._serve(lambda p: [sys.executable, "-c", "raise SystemExit(3)"], "a failing server", log, None)
    assert len(calls) == 1
