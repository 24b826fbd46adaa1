"""The scenario model and the generator: validation messages, targets, event counting (no processes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_chaos.run.triggers import Generator
from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.faults.targets import target_ranks
from ckpt_chaos.scenario import Fault, Scenario, ScenarioError, Trigger, catalogue, load
from tests.helpers import REPO

GOOD = """
description = "ok"
world_size = 2
[trainer]
max_steps = 12
[[faults]]
kind = "kill"
target = "rank:1"
when = { point = "ckpt.shard.write", rank = 1, save = 2, min_fraction = 0.5 }
"""


def write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_valid_file_loads_and_round_trips_through_toml(tmp_path):
    s = load(write(tmp_path, GOOD))
    assert s.name == "s" and s.kinds == ["kill"] and s.families == ["process"]
    assert s.faults[0].when == Trigger(point="ckpt.shard.write", rank=1, save=2, min_fraction=0.5)
    again = load(write(tmp_path, s.to_toml(), "again.toml"))
    assert again.to_dict() == {**s.to_dict(), "name": "s"}


@pytest.mark.parametrize("edit,key,hint", [
    (("world_size = 2", "world_size = 2\ncolour = 1"), "colour", "unknown key"),
    (('kind = "kill"', 'kind = "explode"'), "faults[0].kind", "unknown fault kind 'explode'; allowed: kill, term, stop, raise"),
    (('target = "rank:1"', 'target = "rank:7"'), "faults[0].target", "rank 7 does not exist at world size 2"),
    (('target = "rank:1"', 'target = "minority"'), "faults[0].target", "'minority' is empty at world size 2"),
    (('target = "rank:1"', 'target = "somebody"'), "faults[0].target", "unknown target"),
    (("world_size = 2", 'world_size = "two"'), "world_size", "wrong type str"),
    (('point = "ckpt.shard.write"', 'point = "ckpt.shard.wrte"'), "faults[0].when.point", "unknown probe point"),
    (("max_steps = 12", "max_step = 12"), "trainer.max_step", "not a field of reference_trainer's configuration"),
    (("world_size = 2", "world_size = 3"), "trainer", "not divisible by world_size=3"),
    (("max_steps = 12", "max_steps = 12\n[expect]\ntrajectory = \"close\""), "expect.trajectory", "allowed: bit-exact, tolerance"),
])
def test_invalid_files_name_the_file_the_key_and_the_fix(tmp_path, edit, key, hint):
    assert_refused(write(tmp_path, GOOD.replace(*edit)), key, hint)


RELAUNCH = "max_steps = 12\n[recovery]\nmax_restarts = 2\n"


@pytest.mark.parametrize("edit,key,hint", [
    (RELAUNCH + "changes = [{ lr = 0.1 }, { lr = 0.2 }, { lr = 0.3 }]", "recovery.changes", "3 tables for 2 relaunch"),
    (RELAUNCH + "changes = [{ learning_rate = 0.1 }]", "recovery.changes[0].learning_rate", "not a field of reference_trainer's configuration"),
    (RELAUNCH + "changes = [{ lr = \"high\" }]", "recovery.changes[0].lr", "wrong type str"),
    (RELAUNCH + "changes = [{ run_dir = \"x\" }]", "recovery.changes[0].run_dir", "set by the harness"),
    (RELAUNCH + "changes = [{ global_batch = 15 }]", "recovery.changes[0]", "global_batch=15"),
    (RELAUNCH + "changes = [{ lr = 0.1 }, {}]", "recovery.changes[1]", "an empty last table changes nothing"),
    (RELAUNCH + "changes = [{ lr = 0.1 }]\n[expect]\nrefused = [\"seed\"]", "expect.refused",
     "'seed' is changed by no relaunch"),
    (RELAUNCH + "relaunch = \"torchrun\"\nchanges = [{ lr = 0.1 }]", "recovery.changes",
     "only a relaunch by the harness"),
    (RELAUNCH + "changes = { lr = 0.1 }", "recovery.changes", "wrong type dict"),
])
def test_invalid_config_changes_on_relaunch_name_the_key_and_the_fix(tmp_path, edit, key, hint):
    assert_refused(write(tmp_path, GOOD.replace("max_steps = 12", edit)), key, hint)


def test_config_changes_on_relaunch_round_trip(tmp_path):
    s = load(write(tmp_path, GOOD.replace("max_steps = 12", RELAUNCH + "changes = [{ lr = 0.1 }]\n"
                                                                      "[expect]\nrefused = [\"lr\"]")))
    assert s.recovery.changes == [{"lr": 0.1}] and s.expect.refused == ["lr"]
    assert load(write(tmp_path, s.to_toml(), "again.toml")).recovery == s.recovery


def assert_refused(path: Path, key: str, hint: str) -> None:
    """Loading ``path`` fails with "<file>: <key>: ..." and the message contains ``hint``."""
    with pytest.raises(ScenarioError) as e:
        load(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: {key}: "), msg
    assert hint in msg


STORAGE = """
world_size = 2
[trainer]
max_steps = 12
[storage]
fs = "tmpfs"
size_mb = 16
[[faults]]
kind = "errno"
call = "fsync"
errno = "EIO"
path = ".tmp-*/__1_0.distcp"
target = "rank:1"
when = { point = "ckpt.stage", rank = 1, save = 2 }
"""


@pytest.mark.parametrize("edit,key,hint", [
    (('errno = "EIO"', 'errno = "EOOPS"'), "faults[0].errno", "unknown errno 'EOOPS'"),
    (('call = "fsync"', 'call = "sync"'), "faults[0].call", "allowed: open, write, read, fsync"),
    (('call = "fsync"', 'call = "fsync"\ngrace_s = 3'), "faults[0].grace_s", "does not apply to kind 'errno'"),
    (('kind = "errno"', 'kind = "disk_full"'), "faults[0].call", "disk_full takes headroom_kb, keep_full"),
    (('fs = "tmpfs"', 'fs = "zfs"'), "storage.fs", "allowed: host, tmpfs, ext4"),
    (("size_mb = 16", "size_mb = 1"), "storage.size_mb", "use 8 to 4096"),
    (('call = "fsync"', 'call = "fsync"\nvia = "libfiu"'), "faults[0].via", "whatever the path"),
    (('call = "fsync"', 'call = "mkdir"\nvia = "libfiu"'), "faults[0].call", "libfiu cannot fail 'mkdir'"),
    (('call = "fsync"', 'call = "fsync"\nprobability = 1.5'), "faults[0].probability", "(0, 1]"),
])
def test_invalid_storage_faults_name_the_key_and_the_fix(tmp_path, edit, key, hint):
    assert_refused(write(tmp_path, STORAGE.replace(*edit)), key, hint)


def test_disk_full_on_the_host_file_system_is_refused(tmp_path):
    text = STORAGE.replace('fs = "tmpfs"', 'fs = "host"').replace('kind = "errno"', 'kind = "disk_full"')
    text = "\n".join(line for line in text.splitlines() if not line.startswith(("call", "errno", "path")))
    with pytest.raises(ScenarioError) as e:
        load(write(tmp_path, text))
    assert "disk_full needs a file system of limited size" in str(e.value)
    assert 'fs = "tmpfs"' in str(e.value)


def test_storage_faults_round_trip_and_choose_their_stack(tmp_path):
    s = load(write(tmp_path, STORAGE))
    assert s.families == ["storage"] and s.storage.fs == "tmpfs"
    spec = s.storage_spec()
    assert (spec.fs, spec.faultfs, spec.lazy, spec.libfiu) == ("tmpfs", True, False, False)
    again = load(write(tmp_path, s.to_toml(), "again.toml"))
    assert again.to_dict() == {**s.to_dict(), "name": "s"}
    assert "grace_s" not in s.to_toml()  # keys of other kinds are not written


CLUSTER = """
world_size = 4
[cluster]
backend = "docker"
[trainer]
max_steps = 12
global_batch = 16
[[faults]]
kind = "partition"
split = "isolate"
target = "node:1"
when = { point = "step.end", rank = 1, step = 6 }
"""


@pytest.mark.parametrize("edit,key,hint", [
    (('backend = "docker"', 'backend = "k8s"'), "cluster.backend", "allowed: local, docker, netns"),
    (('backend = "docker"', 'backend = "docker"\nranks_per_node = 3'), "world_size",
     "4 ranks do not fill nodes of 3 rank(s)"),
    (('target = "node:1"', 'target = "node:4"'), "faults[0].target", "'node:4': the job has 4 node(s)"),
    (('target = "node:1"', 'target = "rank:1"'), "faults[0].target", "split = 'isolate' cuts whole nodes"),
    (('split = "isolate"', 'split = "store"\ncut = "disconnect"'), "faults[0].cut", "use cut = \"nftables\""),
    (('split = "isolate"\ntarget = "node:1"', 'split = "store"\ntarget = "node:0"'), "faults[0].target",
     "node 0 hosts the rendezvous store"),
    (('split = "isolate"', 'split = "quarters"'), "faults[0].split", "allowed: isolate, halves, store"),
    (('backend = "docker"', 'backend = "local"'), "faults[0].kind", "partition needs nodes of their own"),
    (('[trainer]', '[storage]\nfs = "tmpfs"\n[trainer]'), "storage", "storage faults run on the local or slurm backend"),
    (('kind = "partition"\nsplit = "isolate"\ntarget = "node:1"', 'kind = "heal"'), "faults[0].kind",
     "heal without a partition"),
    (('step = 6 }', 'step = 6 }\n[recovery]\nworld_size = 3\n[expect]\ntrajectory = "tolerance"'), "trainer",
     "global_batch"),
])
def test_invalid_cluster_scenarios_name_the_key_and_the_fix(tmp_path, edit, key, hint):
    assert_refused(write(tmp_path, CLUSTER.replace(*edit)), key, hint)


def test_cluster_scenarios_round_trip_and_carry_their_markers(tmp_path):
    s = load(write(tmp_path, CLUSTER + "[recovery]\nworld_size = 2\n[expect]\ntrajectory = \"tolerance\"\n"))
    assert s.nodes() == 4 and s.nodes(2) == 2
    assert {"network", "partition", "docker", "topology"} <= set(s.labels)
    again = load(write(tmp_path, s.to_toml(), "again.toml"))
    assert again.to_dict() == {**s.to_dict(), "name": "s"}
    assert "cluster" not in load(write(tmp_path, GOOD, "local.toml")).to_toml()


def test_world_size_change_must_not_claim_bit_exact(tmp_path):
    with pytest.raises(ScenarioError, match="expect.trajectory: bit-exact across a world-size change"):
        load(write(tmp_path, GOOD + "[recovery]\nworld_size = 4\n"))


def test_broken_toml_is_reported_with_the_file(tmp_path):
    path = write(tmp_path, "world_size = = 2")
    with pytest.raises(ScenarioError, match=f"{path}: not valid TOML"):
        load(path)


def test_the_catalogue_is_valid_and_has_at_least_12_process_and_8_cluster_scenarios():
    scenarios = catalogue(builtin_scenarios())
    assert len([s for s in scenarios if "process" in s.families]) >= 12
    cluster = [s for s in scenarios if s.cluster.multi_node]
    assert len(cluster) >= 8
    assert {"docker", "network", "topology", "netns"} <= {label for s in cluster for label in s.labels}
    assert all(s.description for s in scenarios)


@pytest.mark.parametrize("target,ranks", [("all", [0, 1, 2, 3]), ("majority", [0, 1, 2]), ("minority", [3]),
                                          ("ranks:2,0", [0, 2]), ("rank:1", [1]), ("node:0", [0, 1, 2, 3]),
                                          ("triggering", [2])])
def test_targets_resolve_to_ranks(target, ranks):
    assert target_ranks(target, 4, triggering=2) == ranks


def ev(point, rank=0, launch=0, **info):
    return {"point": point, "rank": rank, "attempt": launch, "restart": 0, "info": info}


def test_generator_counts_events_and_fires_once_at_the_nth_match():
    g = Generator([Fault(kind="kill", when=Trigger(point="ckpt.shard.write", rank=1, save=2, min_fraction=0.5,
                                                   nth=2))])
    stream = [ev("ckpt.stage", 1), ev("ckpt.shard.write", 1, fraction=0.6),  # save 1: not counted
              ev("ckpt.stage", 0), ev("ckpt.stage", 1),  # save 2 begins on both ranks
              ev("ckpt.shard.write", 0, fraction=0.9),  # other rank
              ev("ckpt.shard.write", 1, fraction=0.4),  # below the fraction
              ev("ckpt.shard.write", 1, fraction=0.5),  # 1st match
              ev("ckpt.shard.write", 1, fraction=0.6),  # 2nd match: fires
              ev("ckpt.shard.write", 1, fraction=0.7)]
    fired = [i for i, e in enumerate(stream) if g.observe(e)]
    assert fired == [7]
    assert g.unfired() == []


def test_generator_arms_a_fault_only_in_its_launch():
    g = Generator([Fault(kind="kill", attempt=1, when=Trigger(point="load.begin"))])
    assert g.observe(ev("load.begin", launch=0)) == []
    assert len(g.observe(ev("load.begin", launch=1))) == 1


def test_cli_refuses_an_invalid_scenario_file_before_running_anything(tmp_path):
    bad = write(tmp_path, GOOD.replace("max_steps = 12", "max_steps = 'many'"))
    out = subprocess.run([sys.executable, "-m", "ckpt_chaos.cli", "run", str(bad), "--reports", str(tmp_path / "r")],
                         cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 2
    assert str(bad) in out.stderr and "trainer" in out.stderr
    assert not (tmp_path / "r").exists(), "nothing may be written for an invalid scenario"
