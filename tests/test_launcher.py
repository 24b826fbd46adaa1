"""The forking launcher agent behaves as torchrun does where scenarios can tell: what each rank is
given, exit statuses, the teardown of a failed job, a preemption notice; and the probe of a forked
rank reports on its own connection."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ckpt_chaos.env import launcher
from ckpt_chaos.env.agent import _entry_imports, warm_imports

LAUNCHERS = ("torchrun", "agent")


def start(tmp_path: Path, how: str, action: str, **kw) -> launcher.Job:
    return launcher.launch(tmp_path, 2, [str(tmp_path), action], module="tests.launch_target", launcher=how,
                           env={"CKPT_CHAOS_ATTEMPT": "3"}, **kw)


def ranks(tmp_path: Path) -> list[dict]:
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def wait_for(path: Path, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize("how", LAUNCHERS)
def test_each_rank_gets_torchruns_environment_and_a_session_of_its_own(tmp_path, how):
    job = start(tmp_path, how, "collective")
    try:
        assert job.wait(120) == 0, (tmp_path / "torchrun.log").read_text()[-3000:]
    finally:
        job.kill()
    seen = ranks(tmp_path)
    for r, rank in enumerate(seen):
        env = rank["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (str(r), str(r), "2", "2")
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True" and env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["OMP_NUM_THREADS"] == "1" and env["CKPT_CHAOS_ATTEMPT"] == "3"
        assert rank["argv"] == [str(tmp_path), "collective"] and rank["sid_is_pid"]
    assert [(tmp_path / f"sum{r}").read_text() for r in (0, 1)] == ["3.0", "3.0"]
    if how == "agent":
        assert job.rank_pids() == {0: seen[0]["pid"], 1: seen[1]["pid"]}


@pytest.mark.slow
@pytest.mark.parametrize("how", LAUNCHERS)
def test_a_failed_rank_gets_its_peers_closed_and_the_job_exits_1(tmp_path, how):
    job = start(tmp_path, how, "fail")
    try:
        rc = job.wait(120)
    finally:
        job.kill()
    log = (tmp_path / "torchrun.log").read_text()
    assert rc == 1, log[-3000:]
    peer = ranks(tmp_path)[0]["pid"]
    assert f"Sending process {peer} closing signal SIGTERM" in log  # what the runner reads to reap stopped ranks
    assert (tmp_path / "term0").exists()


@pytest.mark.slow
@pytest.mark.parametrize("how", LAUNCHERS)
def test_sigterm_to_the_launcher_reaches_the_ranks_and_the_job_exits_1(tmp_path, how):
    job = start(tmp_path, how, "term")
    try:
        for r in (0, 1):
            wait_for(tmp_path / f"rank{r}.json")
        job.signal(signal.SIGTERM)
        rc = job.wait(120)
    finally:
        job.kill()
    assert rc == 1, (tmp_path / "torchrun.log").read_text()[-3000:]
    assert (tmp_path / "term0").exists() and (tmp_path / "term1").exists()


@pytest.mark.slow
def test_kill_leaves_no_process_of_the_job(tmp_path):
    job = start(tmp_path, "agent", "term")
    for r in (0, 1):
        wait_for(tmp_path / f"rank{r}.json")
    pids = [r["pid"] for r in ranks(tmp_path)] + job.launcher_pids()
    job.kill()
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not job.processes()


def test_the_agent_warms_what_the_trainers_entry_file_imports_even_inside_functions():
    names = _entry_imports("reference_trainer")
    # reference_trainer.__main__ imports .train inside main(), and train imports torch and torchdata
    assert "reference_trainer.train" in names and "torch" in names and "torchdata.stateful_dataloader" in names


def test_a_spare_imports_ahead_only_what_its_trainers_ranks_would_import():
    """torch._dynamo, which FSDP2's fully_shard imports when called, is warmed for a trainer that
    imports FSDP, and not for one that does not: imported into the ranks of a plain DDP trainer, it
    made one launch in ten deadlock in gloo's process group at exit, which never happened under
    torchrun."""
    fsdp, plain = warm_imports("reference_trainer"), warm_imports("tests.launch_target")
    assert "torch.distributed.fsdp" in fsdp and "torch._dynamo" in fsdp
    assert "torch.distributed" in plain and "torch._dynamo" not in plain and "torch.distributed.fsdp" not in plain
    assert not [n for n in fsdp + plain if n.endswith("__main__")]


def test_launches_that_test_torchrun_itself_keep_torchrun(monkeypatch):
    monkeypatch.delenv(launcher.ENV_LAUNCHER, raising=False)
    assert launcher.chosen_launcher() == "agent"
    assert launcher.chosen_launcher(max_restarts=2) == "torchrun"
    assert launcher.chosen_launcher(rendezvous="127.0.0.1:29500") == "torchrun"
    monkeypatch.setenv(launcher.ENV_LAUNCHER, "torchrun")
    assert launcher.chosen_launcher() == "torchrun"
    monkeypatch.setenv(launcher.ENV_LAUNCHER, "mpirun")
    with pytest.raises(ValueError, match="CKPT_CHAOS_LAUNCHER='mpirun': use one of agent, torchrun"):
        launcher.chosen_launcher()


@pytest.mark.slow
def test_a_launch_never_lands_on_a_spare_whose_last_job_is_still_being_killed(tmp_path):
    # kill() finds a job's processes by its spare's marker, pass after pass; a relaunch started on
    # that spare between two passes (the job's exit already reported) would be killed with it.
    first = start(tmp_path / "a", "agent", "term")
    for r in (0, 1):
        wait_for(tmp_path / "a" / f"rank{r}.json")
    first.kill()
    first.killing = True  # as if a kill were still between two of its passes
    second = start(tmp_path / "b", "agent", "term")
    try:
        assert second.marker != first.marker, "the relaunch shared the spare of a job still being killed"
    finally:
        first.killing = False
        second.kill()
    third = start(tmp_path / "c", "agent", "term")
    third.kill()
    assert third.marker in (first.marker, second.marker), "an idle spare was not reused"


@pytest.mark.slow
def test_a_second_kill_of_a_launch_waits_for_the_first(tmp_path, monkeypatch):
    # A grace timer's kill and the supervisor's overlap when the grace runs out as the launch ends. The
    # second returning first would let the next launch fork from the spare while the first still sweeps
    # the spare's marker, and be killed with this one (a planted-bug test that followed a grace test).
    import threading

    job = start(tmp_path, "agent", "term")
    for r in (0, 1):
        wait_for(tmp_path / f"rank{r}.json")
    real, entered = launcher.kill_processes, threading.Event()

    def slow_sweep(procs):
        entered.set()
        time.sleep(2.0)
        real(procs)

    monkeypatch.setattr(launcher, "kill_processes", slow_sweep)
    first = threading.Thread(target=job.kill)
    first.start()
    assert entered.wait(30)
    monkeypatch.setattr(launcher, "kill_processes", real)
    job.kill()  # the supervisor's, while the timer's is under way
    first.join(0.2)
    assert not first.is_alive(), "the second kill returned while the first still swept the spare's marker"
    assert not job.killing and not job.processes()


@pytest.mark.parametrize("how", LAUNCHERS)
def test_a_rank_starts_and_exits_as_a_fresh_interpreter_would(tmp_path, how):
    """Under torchrun or forked by the agent: the module runs as ``__main__`` with the current
    directory first on the path, NumPy's unseeded stream draws other numbers on each rank and launch,
    and the rank's threads and ``atexit`` functions are let finish before it exits."""
    runs = []
    for attempt in (0, 1):
        out = tmp_path / str(attempt)
        job = launcher.launch(out, 2, [str(out)], module="tests.launch_exit", launcher=how)
        try:
            assert job.wait(120) == 0, (out / "torchrun.log").read_text()[-3000:]
        finally:
            job.kill()
        assert ("ckpt-chaos agent" in (out / "torchrun.log").read_text()) == (how == "agent")
        # torchrun's own folder goes with the run, not into /tmp (which it never cleans)
        assert (out / "torchelastic").is_dir() == (how == "torchrun")
        seen = [json.loads((out / f"script{r}.json").read_text()) for r in (0, 1)]
        for rank in seen:
            assert rank["name"] == "__main__" and rank["argv"][1:] == [str(out)]
            assert rank["path0"] == os.getcwd()
        assert all((out / f"{what}{r}").exists() for what in ("thread", "atexit") for r in (0, 1))
        runs.append([rank["draw"] for rank in seen])
    draws = [d for run in runs for d in run]
    assert len(set(draws)) == len(draws), runs


def test_a_harness_worker_imports_its_parent_s_harness_not_the_one_in_the_current_directory(tmp_path, monkeypatch):
    # a mutation run's copy of the checkout: its ckpt_chaos (probe.layout mutated) is for the ranks only
    import ckpt_chaos

    shadow = tmp_path / "ckpt_chaos"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)

    def imported(pythonpath: str) -> Path:
        out = subprocess.run([sys.executable, "-c", "import ckpt_chaos; print(ckpt_chaos.__file__)"],
                             env={**os.environ, "PYTHONSAFEPATH": "1", "PYTHONPATH": pythonpath},
                             capture_output=True, text=True, check=True, cwd=tmp_path)
        return Path(out.stdout.strip()).resolve()

    assert imported(launcher.worker_pythonpath()) == (shadow / "__init__.py").resolve()  # the ranks' view
    assert imported(launcher.harness_pythonpath()) == Path(ckpt_chaos.__file__).resolve()


@pytest.mark.slow
def test_a_spare_with_a_preloaded_library_s_thread_imports_nothing_ahead_and_its_ranks_start_with_exec(tmp_path):
    """libfiu's preload starts a thread before any import: such a spare can never fork, so it must not
    spend the CPU on imports its ranks make again; the launch it serves still runs as torchrun's would."""
    from ckpt_chaos.env.storage import FIU_LIBS

    missing = [lib for lib in FIU_LIBS if not Path(lib).exists()]
    if missing:
        pytest.skip(f"libfiu is not installed ({', '.join(missing)} missing): make setup installs it")
    env = {"LD_PRELOAD": " ".join(FIU_LIBS), "FIU_CTRL_FIFO": str(tmp_path / "fiu")}
    launcher.prewarm("tests.launch_target", env, wait=True)
    key = launcher._Spares._key("tests.launch_target", launcher._start_env("tests.launch_target", env))
    ready = launcher._spares_pool()._warm[key][0].ready
    assert ready["forkable"] is False
    assert not [p for p in ready["sources"] if "/tests/" in p], f"the spare imported the trainer's code: {ready}"
    out = tmp_path / "run"
    job = launcher.launch(out, 2, [str(out), "collective"], module="tests.launch_target", env=env, launcher="agent")
    try:
        assert job.wait(120) == 0, (out / "torchrun.log").read_text()[-3000:]
    finally:
        job.kill()
    assert "starting the ranks with exec" in (out / "torchrun.log").read_text()
    assert [(out / f"sum{r}").read_text() for r in (0, 1)] == ["3.0", "3.0"]
