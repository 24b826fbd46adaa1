"""Scenarios side by side: the verdicts and row order of a serial run, nothing left after an interrupt,
and no run's clean-up touching another live run's mounts or namespaces."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest

from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.env import cluster, storage
from ckpt_chaos.env.launcher import JOB_MARKER
from ckpt_chaos.run import parallel
from ckpt_chaos.run.parallel import Scheduler, Slots, Weight, weight
from ckpt_chaos.scenario import load
from tests.helpers import golden_of_the_reference
from tests.test_cli import cli
from tests.test_pytest_plugin import QUICK

ROOT = Path(__file__).resolve().parents[1]
CATALOGUE = builtin_scenarios()


# ---- the policy: what may run beside what ------------------------------------------------------------

def test_timing_sensitive_and_engine_wide_scenarios_run_alone():
    def w(path: str) -> Weight:
        return weight(load(CATALOGUE / path))

    assert w("process/kill-rank1-mid-shard-write.toml") == Weight(ranks=2)
    assert w("storage/errno-eio-on-shard-fsync.toml") == Weight(ranks=2)
    assert w("process/kill-node-resume-on-two-of-four.toml").ranks == 4  # the relaunch's world counts
    assert w("slurm/slurm-kill-rank1-mid-shard-write.toml") == Weight(ranks=2)  # a private cluster
    for path, why in [("process/hang-rank1-sigstop.toml", "stop fault"),
                      ("storage/slow-storage-sync-save.toml", "slow fault"),
                      ("storage/errno-on-shard-fsync-while-a-peer-is-stopped.toml", "stop fault"),
                      ("process/unprobed-kill-when-shard-file-appears.toml", "triggered from outside"),
                      ("remote/uploader-killed-mid-object.toml", "remote tier"),
                      ("cluster/netns-unplug-node-mid-shard-write.toml", "netns nodes"),
                      ("cluster/docker-kill-node-mid-shard-write.toml", "docker nodes"),
                      ("slurm/slurm-preempt-mid-shard-write-grace-honoured.toml", "preempt fault"),
                      ("slurm/slurm-requeued-three-times.toml", "requeue fault")]:
        assert why in (w(path).alone or ""), (path, w(path))
    # a SIGTERM's grace period is a race only when it is short
    s = load(CATALOGUE / "process/preempt-mid-accumulation.toml")
    assert weight(s).alone is None  # 30 s
    term = s.faults[0]
    short_grace = dataclasses.replace(term, params=dataclasses.replace(term.params, grace_s=5.0))
    short = dataclasses.replace(s, faults=[short_grace])
    assert "term fault" in (weight(short).alone or "")


def test_scheduler_keeps_ranks_within_budget_and_alone_scenarios_alone():
    weights = [Weight(2), Weight(2, alone="stop"), Weight(2), Weight(4), Weight(2), Weight(2)]
    names = ["a", "b", "c", "d", "e", "a"]  # the same name twice: one run directory, never at once
    sched = Scheduler(names, weights, jobs=3, budget=4)
    assert sched.admit() == [0, 2]  # b waits for an idle machine, d for the whole budget
    assert sched.admit() == []
    sched.done(0)
    assert sched.admit() == [4]  # later ones that fit go first
    sched.done(2)
    assert sched.admit() == [5]
    sched.done(4)
    sched.done(5)
    assert sched.admit() == [1]  # alone
    assert sched.admit() == []
    sched.done(1)
    assert sched.admit() == [3]
    sched.done(3)
    assert sched.finished


def test_slots_share_the_budget_between_processes_and_die_with_their_holder(tmp_path):
    slots = Slots(tmp_path, budget=4)
    with slots.hold(Weight(2)), slots.hold(Weight(2)):
        with pytest.raises(TimeoutError):
            with slots.hold(Weight(2), timeout=0.5):
                pass
    with slots.hold(Weight(2)):
        with pytest.raises(TimeoutError):
            with slots.hold(Weight(2, alone="stop"), timeout=0.5):
                pass
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from ckpt_chaos.run.parallel import Slots, Weight
            with Slots({str(tmp_path)!r}, budget=4).hold(Weight(2, alone="stop")):
                print("held", flush=True)
                time.sleep(600)
        """)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(TimeoutError):
            with slots.hold(Weight(2), timeout=0.5):
                pass
    finally:
        holder.kill()  # SIGKILL: its locks go with it
        holder.wait()
    with slots.hold(Weight(4, alone="stop"), timeout=10):
        pass


# ---- leftovers: only those of processes that are gone ---------------------------------------------------

LIVE_HARNESS = """
import sys, time
from pathlib import Path
from ckpt_chaos.env.storage import Storage, StorageSpec
from ckpt_chaos.env.cluster import Cluster
with Storage(Path(sys.argv[1]) / "run", StorageSpec(fs="tmpfs", size_mb=8, faultfs=sys.argv[3] == "faultfs")):
    nodes = Cluster(Path(sys.argv[1]) / "run", "netns", 1, 2, timeout_s=15) if sys.argv[2] == "netns" else None
    print("ready", flush=True)
    time.sleep(600)
"""


@pytest.mark.skipif(storage.missing("tmpfs") is not None, reason=f"cannot mount here: {storage.missing('tmpfs')}")
def test_leftover_removal_leaves_a_live_harness_alone_and_clears_a_dead_ones(tmp_path):
    netns = "netns" if cluster.missing("netns") is None else "none"
    faultfs = "faultfs" if storage.missing("tmpfs", faultfs=True) is None else "none"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    other = subprocess.Popen([sys.executable, "-c", LIVE_HARNESS, str(tmp_path), netns, faultfs], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert other.stdout.readline().strip() == "ready", other.stdout.read()
        mine = storage.leftovers(owner=other.pid) + cluster.leftovers(owner=other.pid)
        assert any(x.startswith("mount ") for x in mine), mine
        if netns == "netns":
            assert any(x.startswith("netns ") for x in mine), mine
        # what a scenario (serial or in a parallel worker) and an interrupted parallel run call
        storage.remove_leftovers()
        cluster.remove_leftovers()
        parallel.remove_leftovers()
        assert sorted(storage.leftovers(owner=other.pid) + cluster.leftovers(owner=other.pid)) == sorted(mine)
        assert os.path.ismount(tmp_path / "run" / ".storage" / "fs")
        assert not set(mine) & set(storage.leftovers() + cluster.leftovers()), "a live harness's are no leftovers"
    finally:
        other.kill()  # SIGKILL: no chance to clean up
        other.wait()
    assert storage.leftovers(owner=other.pid) + cluster.leftovers(owner=other.pid), "expected leftovers"
    for entry in storage.leftovers(owner=other.pid):  # as an interrupted parallel run kills everything it
        if entry.startswith("faultfs process "):       # started: the FUSE mount is left without its daemon
            os.kill(int(entry.split()[-1]), signal.SIGKILL)
    time.sleep(0.5)
    parallel.remove_leftovers()
    assert storage.leftovers(owner=other.pid) + cluster.leftovers(owner=other.pid) == []


# ---- the command line ---------------------------------------------------------------------------------

def _project(root: Path, golden_root: Path) -> Path:
    (root / "chaos").mkdir(parents=True)
    (root / "chaos" / "lose-node.toml").write_text(QUICK.format(module="reference_trainer", known=""))
    (root / "chaos" / "lose-node-at-7.toml").write_text(
        QUICK.format(module="reference_trainer", known="").replace("step = 6", "step = 7"))
    (root / "chaos" / "known-bug.toml").write_text(QUICK.format(module="tests.planted.loader_not_restored",
                                                                known='known_failure = "trajectory"'))
    golden_of_the_reference(load(root / "chaos" / "known-bug.toml"), golden_root)  # the planted bug is the resume's
    (root / "pyproject.toml").write_text('[tool.ckpt-chaos]\nscenarios = ["chaos"]\nbuiltin = false\n')
    return root


@pytest.mark.nightly  # make chaos runs the suite in parallel
@pytest.mark.slow
def test_a_parallel_run_gives_each_scenario_its_verdict_in_catalogue_order(tmp_path, golden_root):
    """Two at a time, with a known failure: the verdicts, the JSON and the JUnit file in the catalogue's
    order whatever order the workers ended in, and no worker files left."""
    project = _project(tmp_path / "project", golden_root)
    out = cli("run", "-n", "2", "--json", "--junitxml", "junit.xml", "--reports", "r", "--golden-dir",
              str(golden_root), cwd=project, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]  # a known failure does not fail the suite
    data = json.loads(out.stdout)
    expected = [("known-bug", "xfail"), ("lose-node", "pass"), ("lose-node-at-7", "pass")]
    assert [(r["scenario"], r["verdict"]) for r in data["results"]] == expected
    cases = {c.get("name"): c for c in ET.parse(project / "junit.xml").iter("testcase")}
    assert list(cases) == [name for name, _ in expected]
    assert cases["known-bug"].find("skipped").get("message").startswith("known failure: trajectory:")
    suite = project / data["out"]
    assert all((suite / name / "result.json").is_file() for name, _ in expected)
    assert not (suite / ".workers").exists()
    assert "XFAIL known-bug" in out.stderr


# Nightly: make chaos runs the default suite with -n auto in every CI run, and the slot tests above
# hold the sharing of the machine; this compares a parallel run's verdicts with a serial one's.
@pytest.mark.nightly
@pytest.mark.slow
def test_parallel_run_has_the_serial_verdicts_in_catalogue_order(tmp_path, golden_root):
    project = _project(tmp_path / "project", golden_root)
    golden = str(golden_root)
    runs = {}
    for jobs in ("1", "2"):
        out = cli("run", "-n", jobs, "--json", "--junitxml", f"junit-{jobs}.xml", "--reports", f"r{jobs}",
                  "--golden-dir", golden, cwd=project, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
        data = json.loads(out.stdout)
        cases = [c.get("name") for c in ET.parse(project / f"junit-{jobs}.xml").iter("testcase")]
        runs[jobs] = ([(r["scenario"], r["verdict"]) for r in data["results"]], cases, data["exit_status"])
        suite = project / data["out"]
        assert sorted(p.name for p in suite.iterdir() if p.is_dir()) == ["known-bug", "lose-node", "lose-node-at-7"]
        assert all((suite / name / "result.json").is_file() for name in ("known-bug", "lose-node", "lose-node-at-7"))
        assert not (suite / ".workers").exists()
    assert runs["1"][0] == [("known-bug", "xfail"), ("lose-node", "pass"), ("lose-node-at-7", "pass")]
    assert runs["2"] == runs["1"]


def _ours(tag: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("CKPT_CHAOS_TEST_TAG") == tag:
                found.append(p)
        except (psutil.Error, OSError):
            pass
    return found


def _markers(procs: list[psutil.Process]) -> set[str]:
    found = set()
    for p in procs:
        try:
            if JOB_MARKER in p.environ():
                found.add(p.environ()[JOB_MARKER])
        except (psutil.Error, OSError):
            pass
    return found


@pytest.mark.slow
def test_ctrl_c_mid_parallel_run_kills_every_process_of_every_scenario_and_exits_130(tmp_path, golden_root):
    # Everything the run starts inherits this variable: the workers, torchrun, the ranks, faultfs.
    tag = uuid.uuid4().hex
    second = "power-loss-mid-shard-write" if storage.missing("tmpfs", faultfs=True) is None \
        else "kill-rank0-mid-shard-write"
    reports = tmp_path / "r"
    env = {**os.environ, "CKPT_CHAOS_TEST_TAG": tag,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    run = subprocess.Popen([sys.executable, "-m", "ckpt_chaos.cli", "run", "-n", "2", "kill-rank1-mid-shard-write",
                            second, "--reports", str(reports), "--golden-dir", str(golden_root)],  # the session's
                           cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(_markers(_ours(tag))) < 2:
            assert run.poll() is None, run.communicate()[0]
            time.sleep(0.2)
        assert len(_markers(_ours(tag))) >= 2, "the two scenarios never had jobs running at once"
        run.send_signal(signal.SIGINT)
        out, _ = run.communicate(timeout=180)
    finally:
        run.kill()
    assert run.returncode == 130, out
    assert "interrupted" in out
    left = _ours(tag)
    assert not left, f"left behind: {[(p.pid, p.cmdline()) for p in left]}"
    assert not list(reports.rglob(".storage")), "a storage stack was left behind"
    assert not [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(tmp_path) in line]
    assert (reports / "custom" / "latest" / "results.json").is_file()
    assert not (reports / "custom" / "latest" / ".workers").exists()


def test_a_paced_scenario_shares_the_golden_run_of_its_unpaced_twin(tmp_path, monkeypatch):
    from ckpt_chaos.run import runner
    cfg = {"max_steps": 6, "ckpt_every_steps": 2}
    paced = {**cfg, "step_delay_s": 0.4}
    assert runner.golden_key("reference_trainer", paced, 2) == runner.golden_key("reference_trainer", cfg, 2)
    assert runner.golden_key("reference_trainer", {**cfg, "max_steps": 7}, 2) != \
        runner.golden_key("reference_trainer", cfg, 2)

    class Launched(Exception):
        pass

    def launch(work, world_size, args, module):
        raise Launched(args)

    monkeypatch.setattr(runner, "launch", launch)
    with pytest.raises(Launched) as e:
        runner.golden_run("reference_trainer", paced, 2, root=tmp_path)
    args = e.value.args[0]
    assert "--max-steps=6" in args and not any(a.startswith("--step-delay-s") for a in args)


def test_a_grace_period_long_enough_lets_a_preemption_share_and_a_short_one_does_not():
    from ckpt_chaos.config import builtin_scenarios
    from ckpt_chaos.run.parallel import alone_because
    from ckpt_chaos.scenario import load

    cat = builtin_scenarios()
    assert alone_because(load(cat / "process" / "preempt-on-the-last-micro-batch-of-a-step.toml")) is None  # 30 s
    assert alone_because(load(cat / "slurm" / "slurm-time-limit-warning-then-requeue.toml")) is None  # 55 s
    assert "a preempt fault" in alone_because(load(cat / "slurm" / "slurm-preempt-mid-shard-write-grace-honoured.toml"))
    assert "a requeue fault" in alone_because(load(cat / "slurm" / "slurm-requeued-three-times.toml"))
