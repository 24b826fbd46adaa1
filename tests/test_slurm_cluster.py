"""A private Slurm cluster starts, runs and requeues a real job, loses a node, and leaves nothing.

Real daemons, no mocks: ``make setup`` installs Debian's slurm-wlm and munge; without them, or
without root, every test is skipped with the reason, never passed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ckpt_chaos.env.slurm import SlurmCluster, SlurmConfig, leftovers, listening, missing, remove_leftovers

REPO = Path(__file__).resolve().parents[1]
NO_SLURM = missing()
pytestmark = pytest.mark.skipif(NO_SLURM is not None, reason=f"no Slurm cluster here: {NO_SLURM}")

# Generous: a requeued job waits for its old credential to expire (cred_expire, 5 s here); with
# Slurm's default of 120 s the requeue test runs out of this and fails, which is what it guards.
WAIT_S = 60

# One task per node; each writes what it sees to a file of its own, then holds its node.
JOB = """#!/bin/bash
srun bash -c 'echo "$SLURM_JOB_ID ${SLURM_RESTART_COUNT:-0} $SLURM_NODEID $(hostname) $SLURMD_NODENAME" \
  > "SEEN/run${SLURM_RESTART_COUNT:-0}-task$SLURM_NODEID.tmp" && \
  mv "SEEN/run${SLURM_RESTART_COUNT:-0}-task$SLURM_NODEID.tmp" "SEEN/run${SLURM_RESTART_COUNT:-0}-task$SLURM_NODEID"; \
  exec sleep 600'
"""


def job_script(seen: Path) -> str:
    seen.mkdir(parents=True, exist_ok=True)
    return JOB.replace("SEEN", str(seen))


def wait_for(what: str, ready, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := ready():
            return result
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def seen_by(seen: Path, run: int, tasks: int = 2) -> list[list[str]] | None:
    """Each task's record of restart ``run`` (job id, restart count, node id, hostname, node name),
    once all ``tasks`` have written theirs."""
    files = sorted(seen.glob(f"run{run}-task[0-9]"))
    return [f.read_text().split() for f in files] if len(files) == tasks else None


def running(c: SlurmCluster, job: int) -> bool:
    return c.job(job).get("JobState") == "RUNNING"


def alive(procs: list[tuple[int, float]]) -> list[int]:
    """Pids (with their start times, so that a reused pid does not count) still running, zombies aside."""
    out = []
    for pid, created in procs:
        try:
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            pass
    return out


def test_two_nodes_come_up_idle_on_the_ports_the_config_names(tmp_path):
    with SlurmCluster(tmp_path / "slurm", SlurmConfig(nodes=2)) as c:
        assert c.node_states() == {"n1": "idle", "n2": "idle"}
        assert listening(c.ports) == sorted(c.ports)
        names = sorted(p.name() for p in c.processes())
        assert names.count("slurmd") == 2 and names.count("slurmctld") == 1, names
        assert f"SlurmctldPort={c.ctld_port}" in c.conf.read_text()


@pytest.mark.nightly
def test_a_requeued_job_restarts_under_the_same_id_with_restart_count_1(tmp_path):
    seen = tmp_path / "seen"
    with SlurmCluster(tmp_path / "slurm") as c:
        job = c.sbatch(job_script(seen), "--requeue", "--nodes=2", "--ntasks-per-node=1", cwd=tmp_path)
        first = wait_for("both tasks of the first run", lambda: seen_by(seen, 0))
        assert [r[0] for r in first] == [str(job)] * 2
        assert [r[1:3] for r in first] == [["0", "0"], ["0", "1"]]
        assert {r[3] for r in first} == {socket.gethostname()}
        assert sorted(r[4] for r in first) == ["n1", "n2"]

        c.scontrol("requeue", str(job))
        again = wait_for("both tasks of the requeued run", lambda: seen_by(seen, 1))
        assert [r[:3] for r in again] == [[str(job), "1", "0"], [str(job), "1", "1"]]
        info = wait_for("the job to run again", lambda: running(c, job) and c.job(job))
        assert info["JobId"] == str(job) and info["Restarts"] == "1"


@pytest.mark.nightly
def test_a_node_set_down_requeues_its_job_which_waits_until_the_node_is_resumed(tmp_path):
    seen = tmp_path / "seen"
    with SlurmCluster(tmp_path / "slurm") as c:
        job = c.sbatch(job_script(seen), "--requeue", "--nodes=2", "--ntasks-per-node=1", cwd=tmp_path)
        wait_for("both tasks of the first run", lambda: seen_by(seen, 0))

        c.scontrol("update", "nodename=n2", "state=down", "reason=test")
        # the scheduler has looked at the requeued job again once it blames the node; with
        # ReturnToService=2, n2 would be back by then and the job running
        info = wait_for("the requeued job to wait for n2", lambda: "DOWN" in (i := c.job(job)).get("Reason", "") and i)
        assert info["JobState"] == "PENDING" and info["Restarts"] == "1", info
        assert c.node_states()["n2"].startswith("down") and c.node_states()["n1"] == "idle"
        assert "n2 test" in c.run("sinfo", "-h", "-R", "-o", "%N %E").stdout
        assert not list(seen.glob("run1-*")), "the job restarted without n2"

        c.scontrol("update", "nodename=n2", "state=resume")
        again = wait_for("both tasks of the restarted run", lambda: seen_by(seen, 1))
        assert [r[:3] for r in again] == [[str(job), "1", "0"], [str(job), "1", "1"]]
        assert sorted(r[4] for r in again) == ["n1", "n2"]


def test_close_leaves_no_process_port_or_state(tmp_path):
    seen = tmp_path / "seen"
    c = SlurmCluster(tmp_path / "slurm")
    try:
        c.start()
        c.sbatch(job_script(seen), "--nodes=2", "--ntasks-per-node=1", cwd=tmp_path)
        wait_for("both tasks", lambda: seen_by(seen, 0))
        procs = c.processes()
        names = sorted(p.name() for p in procs)
        # the daemons, a batch step and a task step per node, and the tasks themselves
        assert {"slurmctld", "slurmd", "slurmstepd", "sleep"} <= set(names), names
        ours = [(p.pid, p.create_time()) for p in procs]
    finally:
        c.close()
    assert alive(ours) == []
    assert listening(c.ports) == []
    assert not c.state.exists()
    assert leftovers(owner=os.getpid()) == []
    assert (tmp_path / "slurm" / "log" / "slurmctld.log").exists(), "the logs are kept for post-mortem"


HARNESS = """
import json, sys, time
from pathlib import Path
from ckpt_chaos.env.slurm import SlurmCluster
from tests.test_slurm_cluster import job_script, seen_by, wait_for
root = Path(sys.argv[1])
c = SlurmCluster(root / "slurm")
c.start()
c.sbatch(job_script(root / "seen"), "--nodes=2", "--ntasks-per-node=1", cwd=root)
wait_for("both tasks", lambda: seen_by(root / "seen", 0))
procs = [(p.pid, p.create_time(), p.name()) for p in c.processes()]
print(json.dumps({"ports": c.ports, "state": str(c.state), "procs": procs}), flush=True)
time.sleep(600)
"""


def test_the_cluster_of_a_killed_harness_is_removed_by_the_leftover_cleaner(tmp_path):
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        line = harness.stdout.readline()
        assert line, harness.communicate(timeout=30)[1]
        ran = json.loads(line)
    finally:
        harness.kill()  # SIGKILL: no chance to clean up
        harness.communicate(timeout=30)
    assert harness.returncode == -signal.SIGKILL
    names = {name for _, _, name in ran["procs"]}
    assert {"slurmctld", "slurmd", "slurmstepd", "sleep"} <= names, names
    ours = [(pid, created) for pid, created, _ in ran["procs"]]

    left = leftovers(owner=harness.pid)
    assert alive(ours), "the daemons and the job outlive their harness: that is what the cleaner is for"
    assert any("slurmctld" in x for x in left) and f"state {ran['state']}" in left, left

    removed = remove_leftovers()
    assert set(left) <= set(removed), (left, removed)
    assert leftovers(owner=harness.pid) == []
    assert alive(ours) == []
    assert listening(ran["ports"]) == []
    assert not Path(ran["state"]).exists()


# Nightly: the default suite's slurm scenarios requeue the reference trainer in every CI run (make chaos),
# and test_slurm_scenarios' planted trainers are requeued in make test.
@pytest.mark.nightly
def test_the_reference_trainer_requeued_by_slurm_resumes_bit_exact(tmp_path):
    from ckpt_chaos.check.history import read_jsonl
    from ckpt_chaos.env.launcher import worker_pythonpath
    from tests.helpers import mismatches, train, trainer_args

    golden = tmp_path / "golden"
    assert train(golden, 2) == 0
    run = tmp_path / "run"
    run.mkdir()
    # slow enough that the requeue lands mid-run, which changes nothing in the numbers
    args = trainer_args(run, step_delay_s=0.4)
    with SlurmCluster(tmp_path / "slurm", SlurmConfig(nodes=2)) as cluster:
        job = cluster.submit_torchrun(run, nodes=2, ranks_per_node=1, module="reference_trainer",
                                      trainer_args=args, env={"PYTHONPATH": worker_pythonpath()})
        wait_for("the step-4 checkpoint", lambda: any(
            e.get("event") == "committed" for e in read_jsonl(run / "events.jsonl")))
        cluster.scontrol("requeue", str(job.job_id))
        rc = job.wait(120)
        restarts = job.restarts()
    log = (run / "slurm-job.log").read_text()
    assert rc == 0, log[-3000:]
    assert restarts == 1, log[-3000:]
    events = read_jsonl(run / "events.jsonl")
    loaded = [e for e in events if e.get("event") == "loaded"]
    assert [e["attempt"] for e in loaded] == [1], events  # the requeued run, SLURM_RESTART_COUNT=1, resumed
    assert mismatches(golden, run) == []


def test_the_clusters_ports_lie_outside_the_range_every_bind_0_draws_from():
    """slurmctld died with "Address already in use" when its port, found free by ``bind(0)`` and
    closed again, was taken by another process's ``bind(0)`` or connection before slurmctld bound it."""
    from toxiproxy_server.harness import _ephemeral_range, free_ports

    ports = free_ports(5)
    assert len(set(ports)) == 5 and not set(ports) & set(_ephemeral_range()), ports
