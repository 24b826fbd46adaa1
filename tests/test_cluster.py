"""Nodes and partitions are real, and leave nothing behind.

Network namespaces and nftables need root; the Docker tests need an engine (``make setup``
installs docker.io, the harness starts dockerd). Without them the tests are skipped with the
reason, never passed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ckpt_chaos.env import cluster
from ckpt_chaos.env.cluster import Cluster, leftovers, remove_leftovers
from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.faults.cluster import partition_rules
from ckpt_chaos.run.runner import run_scenario
from ckpt_chaos.scenario import load
from tests.helpers import start_cli

SCENARIOS = builtin_scenarios() / "cluster"
NO_NETNS = cluster.missing("netns")
needs_netns = pytest.mark.skipif(NO_NETNS is not None, reason=f"no network namespaces here: {NO_NETNS}")


@pytest.fixture(scope="module")
def docker_engine():
    why = cluster.missing("docker")  # starts dockerd when it is installed and none runs
    if why:
        pytest.skip(f"no Docker engine here: {why}")


# ---- partitions between namespace nodes, without torch ---------------------------------------------

SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7777)); s.listen(16); print("ready", flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"hi"); c.close()
"""


def _reaches(c: Cluster, src: int, dst: int) -> bool:
    """Whether node ``src`` gets an answer from a server on node ``dst`` within a second."""
    code = (f"import socket; s = socket.create_connection(({c.address(dst)!r}, 7777), timeout=1); "
            "assert s.recv(2) == b'hi'")
    return subprocess.run(["ip", "netns", "exec", c._ns(src), sys.executable, "-c", code],
                          capture_output=True).returncode == 0


@needs_netns
def test_partition_rules_and_unplugged_links_cut_traffic_until_healed(tmp_path):
    with Cluster(tmp_path, "netns", ranks_per_node=1, max_nodes=3, timeout_s=15) as c:
        servers = [subprocess.Popen(["ip", "netns", "exec", c._ns(n), sys.executable, "-c", SERVER, c.address(n)],
                                    stdout=subprocess.PIPE, text=True) for n in range(3)]
        try:
            for s in servers:
                assert s.stdout.readline().strip() == "ready"
            assert _reaches(c, 1, 0) and _reaches(c, 2, 1)
            addresses = {n: c.address(n) for n in range(3)}
            for n, ruleset in partition_rules("isolate", [1], [0, 2], addresses).items():
                c.firewall(n, ruleset)
            assert not _reaches(c, 1, 0) and not _reaches(c, 0, 1) and not _reaches(c, 2, 1)
            assert _reaches(c, 0, 2) and _reaches(c, 2, 0), "the rest of the cluster must still talk"
            assert c.heal() == ["node0 firewall removed", "node1 firewall removed", "node2 firewall removed"]
            assert _reaches(c, 1, 0) and _reaches(c, 0, 1)

            c.unplug(2)
            assert not _reaches(c, 0, 2) and not _reaches(c, 2, 1) and _reaches(c, 0, 1)
            assert c.heal() == ["node2 plugged in"]
            assert _reaches(c, 0, 2)
        finally:
            for s in servers:
                s.kill()
                s.wait()
        name = c.name
    assert not [n for n in os.listdir("/run/netns") if n.startswith(name)], "namespaces left behind"


@needs_netns
@pytest.mark.parametrize("elastic", [True, False])
def test_an_elastic_jobs_outcome_is_the_nodes_left_after_the_nemesis_kills_one(tmp_path, elastic):
    """torchrun --nnodes=1:2 carries on without a lost node: the job's exit status is node 0's, not
    the killed node's 137. Without elasticity the lost node's status is the job's."""
    from ckpt_chaos.env.cluster import NODE_ENV, Agent, ClusterJob
    from ckpt_chaos.env.launcher import JOB_MARKER

    with Cluster(tmp_path, "netns", ranks_per_node=1, max_nodes=2, timeout_s=15) as c:
        marker = f"elastic-{os.getpid()}"
        sleeps = ["0.5", "60"]  # node 0 finishes training; node 1 would run on
        agents = [Agent(n, 0, popen=subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({t})"],
                                                     env={**os.environ, JOB_MARKER: marker, NODE_ENV: str(n)}))
                  for n, t in enumerate(sleeps)]
        for a in agents:
            a.pid = a.popen.pid
        c.job = job = ClusterJob(c, agents, marker, tmp_path / "node0.log", teardown_s=30, elastic=elastic)
        c.kill_nodes([1], job)  # what the kill nemesis does for target = "node:1"
        assert c.killed == {1}
        rc = job.wait(20)
        assert rc == (0 if elastic else -signal.SIGKILL), rc
        job.kill()  # the job's own teardown loses nothing: it does not count as the nemesis's
        assert c.killed == {1}


def test_store_partition_drops_only_the_store_port():
    rules = partition_rules("store", [1], [0], {0: "10.77.0.1", 1: "10.77.0.2"})
    assert list(rules) == [1]
    assert "ip daddr 10.77.0.1 tcp dport 29400 drop" in rules[1]
    assert "ip saddr 10.77.0.1 tcp sport 29400 drop" in rules[1]


# ---- Docker nodes ----------------------------------------------------------------------------------

def ours(pid: int) -> list[str]:
    return leftovers(owner=pid)


@pytest.mark.nightly  # make chaos runs the Docker node-loss scenario
@pytest.mark.slow
def test_docker_node_loss_scenario_passes_and_leaves_nothing(tmp_path, docker_engine, golden_root):
    # the golden run is a local one (no nodes), the leftovers test's below
    result = run_scenario(load(SCENARIOS / "docker-kill-node-mid-shard-write.toml"), tmp_path / "r", golden_root)
    assert result.verdict == "pass", result.checks
    assert result.launches == 2 and result.steps_lost == 4
    logs = sorted(p.name for p in (tmp_path / "r" / "docker-kill-node-mid-shard-write" / "nodes").glob("*.log"))
    assert logs == ["launch0-node0.log", "launch0-node1.log", "launch1-node0.log", "launch1-node1.log"]
    assert ours(os.getpid()) == []


def _wait_for_containers(cli: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not any(x.startswith("container") for x in ours(cli.pid)):
        assert cli.poll() is None, cli.communicate()[0]
        time.sleep(0.5)
    assert any(x.startswith("container") for x in ours(cli.pid)), "the scenario never started its nodes"


# Nightly: make test removes a killed harness's containers, network and volumes (the leftovers test); a
# Ctrl-C is the same clean-up reached from the signal, which test_slurm_fanout's Ctrl-C test holds.
@pytest.mark.nightly
@pytest.mark.slow
def test_interrupted_docker_scenario_leaves_no_container_network_or_volume(tmp_path, docker_engine):
    cli = start_cli(tmp_path, "docker-pause-node-mid-training")
    try:
        _wait_for_containers(cli)
        time.sleep(3)
        cli.send_signal(signal.SIGINT)
        out, _ = cli.communicate(timeout=120)
    finally:
        cli.kill()
    assert cli.returncode == 130, out
    assert ours(cli.pid) == []


@pytest.mark.slow
def test_leftovers_of_a_killed_harness_are_removed(tmp_path, docker_engine, golden_root):
    cli = start_cli(tmp_path, "docker-replace-node-with-empty-disk", golden=golden_root)  # done before any node
    try:
        _wait_for_containers(cli)
    finally:
        cli.kill()  # SIGKILL: no chance to clean up
        cli.wait()
    left = ours(cli.pid)
    assert any(x.startswith("network") for x in left) and any(x.startswith("volume") for x in left), left
    remove_leftovers()
    assert ours(cli.pid) == []
