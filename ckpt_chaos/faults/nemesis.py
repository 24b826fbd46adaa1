"""What breaks: the actions that inject a fault, and the heal step that undoes what can be undone.

A nemesis acts while the rank whose event triggered it is blocked at its probe point, so a
SIGKILL "mid-shard-write" lands exactly there. Each action returns the answer for that rank
(``None``: continue) and a record of what it did, which goes into the history.

Process faults need nothing beyond signals to the job's own processes. Storage faults act on
the run's storage stack (``ckpt_chaos/env/storage.py``): a ballast file, faultfs rules, libfiu, a
simulated power cut, or bytes of committed files. ``requirements`` says what a fault needs so
the runner can skip, loudly, a fault this machine cannot inject.
"""

from __future__ import annotations

import errno as errno_module
import fnmatch
import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from ckpt_chaos.env import cluster as cluster_module, objectstore
from ckpt_chaos.env.cluster import FW_TABLE, STORE_PORT, Cluster
from ckpt_chaos.env.launcher import Job
from ckpt_chaos.scenario import Fault, Scenario, target_ranks
from ckpt_chaos.env.storage import Storage, missing

if TYPE_CHECKING:
    from ckpt_chaos.env.objectstore import RemoteTier


def requirements(s: Scenario) -> str | None:
    """Why this machine cannot run the scenario's faults (None: it can). Process faults are
    signals to our own children and always work; storage faults need the stack they run on;
    node and network faults need their backend (an engine, or root for namespaces)."""
    why = cluster_module.missing(s.cluster.backend)
    if why:
        kinds = sorted({f.kind for f in s.faults}) or ["the cluster"]
        return f"{', '.join(kinds)} on backend={s.cluster.backend}: {why}"
    spec = s.storage_spec()
    why = missing(spec.fs, spec.faultfs, spec.libfiu)
    if why:
        kinds = sorted({f.kind for f in s.faults if f.family == "storage"}) or ["the storage stack"]
        return f"{', '.join(kinds)} on fs={spec.fs}{' + faultfs' if spec.faultfs else ''}: {why}"
    if s.remote is not None and (why := objectstore.missing()):
        return f"the remote tier: {why}"
    return None


def _signal(pid: int, sig: signal.Signals) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _wait_gone(pids: list[int], timeout: float = 10.0) -> None:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=timeout)


def kill_local_node(job: Job, pids: list[int]) -> int:
    """SIGKILL the local node: its launcher first, so nobody is left to react, then the ranks; returns
    the launcher's pid once the ranks are gone."""
    launcher = job.launcher_pids()[0]
    _signal(launcher, signal.SIGKILL)
    for pid in pids:
        _signal(pid, signal.SIGKILL)
    _wait_gone(pids)
    return launcher


@dataclass
class ProcessNemesis:
    """SIGKILL, SIGTERM-then-SIGKILL, SIGSTOP and in-process exceptions for the current launch."""

    job: Job
    world_size: int
    pids: dict[int, int]  # rank -> pid of the current launch, filled from probe events
    cluster: Cluster | None = None  # multi-node backends: node:N is a whole host
    roles: dict[str, int] = field(default_factory=dict)  # other processes of the job: "uploader" -> pid
    stopped: list[int] = field(default_factory=list)
    grace_expired: list[float] = field(default_factory=list)  # when a term's grace ran out with the job alive
    _timers: list[threading.Timer] = field(default_factory=list)

    def fire(self, fault: Fault, event: dict) -> tuple[dict | None, dict]:
        ranks = target_ranks(fault.target, self.world_size, triggering=event["rank"],
                             ranks_per_node=self.cluster.ranks_per_node if self.cluster else None)
        pids = {r: self.pids[r] for r in ranks if r in self.pids}
        missing = sorted(set(ranks) - set(pids))
        record = {"ranks": ranks, "pids": sorted(pids.values()), "missing_ranks": missing}
        if fault.kind == "kill" and fault.target == "uploader":
            pid = self.roles.get("uploader")
            record.update(uploader_pid=pid)
            if pid is not None:
                _signal(pid, signal.SIGKILL)
                _wait_gone([pid])
            return None, record
        if fault.kind == "kill":
            if fault.target.startswith("node:") and self.cluster is not None:
                record["node"] = int(fault.target[5:])
                self.cluster.kill_nodes([record["node"]])  # docker kill: the host is gone
                _wait_gone(list(pids.values()))
                return None, record
            if fault.target.startswith("node:"):
                # Node loss: the launcher dies with its workers, nobody is left to report it.
                record["launcher_pid"] = kill_local_node(self.job, list(pids.values()))
                return None, record
            for pid in pids.values():
                _signal(pid, signal.SIGKILL)
            _wait_gone(list(pids.values()))
            return None, record
        if fault.kind == "term":
            if fault.target in ("all", "node:0"):
                record["to"] = "launcher"  # as a scheduler's preemption notice reaches the job
                self.job.signal(signal.SIGTERM)
            else:
                for pid in pids.values():
                    _signal(pid, signal.SIGTERM)
            timer = threading.Timer(fault.grace_s, self._grace_expired)
            timer.daemon = True
            timer.start()
            self._timers.append(timer)
            record["grace_s"] = fault.grace_s
            return None, record
        if fault.kind == "stop":
            for pid in pids.values():
                if _signal(pid, signal.SIGSTOP):
                    self.stopped.append(pid)
            return None, record
        if fault.kind == "raise":
            return {"do": "raise", "error": fault.error, "message": f"at {event['point']}"}, record
        raise ValueError(f"not a process fault: {fault.kind}")

    def reap_stopped(self, closing: set[int]) -> list[int]:
        """SIGKILL the stopped processes among ``closing``, those torchrun has begun to close.

        torchrun closes a worker group with SIGTERM, waits 30 s for the workers to exit, then
        SIGKILLs them (``PContext.close(timeout=30)``, no knob). A stopped process cannot act on
        SIGTERM, so that wait ends in the same SIGKILL with nothing run in between: sending it now
        changes nothing but the clock (30 s of every run with a hang)."""
        reaped = [pid for pid in self.stopped if pid in closing]
        for pid in reaped:
            _signal(pid, signal.SIGKILL)
            _signal(pid, signal.SIGCONT)
        self.stopped = [pid for pid in self.stopped if pid not in reaped]
        return reaped

    def _grace_expired(self) -> None:
        if self.job.poll() is None:
            self.grace_expired.append(time.time())
            self.job.kill()

    def heal(self) -> None:
        """Cancel pending grace timers and resume stopped processes (if any are left)."""
        for t in self._timers:
            t.cancel()
        for pid in self.stopped:
            _signal(pid, signal.SIGCONT)
        self.stopped.clear()


@dataclass
class ClusterNemesis:
    """Node faults (pause, replace) and network partitions, on a multi-node backend.

    A partition lasts until the launch ends; ``Cluster.heal`` lifts it before the relaunch, as an
    operator would repair the network before restarting the job."""

    cluster: Cluster
    pids: dict[int, int]  # rank -> host pid of the current launch

    def fire(self, fault: Fault, event: dict) -> tuple[dict | None, dict]:
        c = self.cluster
        nodes = len(c.job.agents)
        targets = [int(fault.target[5:])] if fault.target.startswith("node:") else list(range(nodes))
        ranks = [r for r in self.pids if c.job.node_of(r) in targets]
        record: dict = {"nodes": targets, "ranks": ranks, "pids": sorted(self.pids[r] for r in ranks)}
        if fault.kind == "pause":
            for n in targets:
                c.pause(n)
        elif fault.kind == "replace":
            for n in targets:
                c.replace(n)
            record["fresh_disks"] = [c.local_disk(n) for n in targets]
        elif fault.kind == "partition":
            record.update(self._partition(fault, nodes, targets))
        elif fault.kind == "heal":
            record = {"healed": c.heal()}
        else:
            raise ValueError(f"not a node or network fault: {fault.kind}")
        return None, record

    def _partition(self, fault: Fault, nodes: int, targets: list[int]) -> dict:
        c = self.cluster
        if fault.split == "halves":
            side_a = list(range(nodes // 2))
        else:
            side_a = targets
        side_b = [n for n in range(nodes) if n not in side_a]
        addresses = {n: c.address(n) for n in range(nodes)}
        record = {"split": fault.split, "cut": fault.cut, "side_a": side_a, "side_b": side_b,
                  "addresses": addresses}
        if fault.cut == "disconnect":
            # unplugging the smaller side's links separates the halves as well as any firewall would
            for n in side_a:
                c.unplug(n)
            return record
        rules = partition_rules(fault.split, side_a, side_b, addresses)
        for n, ruleset in rules.items():
            c.firewall(n, ruleset)
        record["rules"] = rules
        return record


def partition_rules(split: str, side_a: list[int], side_b: list[int], addresses: dict[int, str]) -> dict[int, str]:
    """nftables rulesets (node -> ruleset) that drop the traffic a partition cuts, loaded inside each
    node's network namespace. Dropped, not rejected: a real partition answers nothing, so the job
    can only notice by its timeouts."""
    if split == "store":
        store = addresses[0]
        rules = {n: (f"ip daddr {store} tcp dport {STORE_PORT} drop", f"ip saddr {store} tcp sport {STORE_PORT} drop")
                 for n in side_a}
    else:
        rules = {}
        for mine, other in ((side_a, side_b), (side_b, side_a)):
            peers = ", ".join(addresses[n] for n in other)
            for n in mine:
                rules[n] = (f"ip daddr {{ {peers} }} drop", f"ip saddr {{ {peers} }} drop")
    return {n: (f"table inet {FW_TABLE} {{\n"
                f"  chain output {{ type filter hook output priority 0; policy accept; {out_rule}; }}\n"
                f"  chain input {{ type filter hook input priority 0; policy accept; {in_rule}; }}\n"
                "}\n") for n, (out_rule, in_rule) in rules.items()}


@dataclass
class StorageNemesis:
    """Disk full, errno injection, slow storage, power loss and corruption, for the whole run.

    faultfs rules and the ballast outlive a launch only if the scenario says so: ``heal`` at the
    end of each launch disarms every rule and, unless a disk_full asked to keep the disk full,
    gives the space back (as an operator who frees space before restarting the job would)."""

    storage: Storage
    job: Job | None = None
    world_size: int = 0
    pids: dict[int, int] = field(default_factory=dict)
    keep_full: bool = False

    def new_launch(self, job: Job, world_size: int, pids: dict[int, int]) -> None:
        self.job, self.world_size, self.pids = job, world_size, pids

    def fire(self, fault: Fault, event: dict) -> tuple[dict | None, dict]:
        ranks = target_ranks(fault.target, self.world_size, triggering=event["rank"])
        pids = {r: self.pids[r] for r in ranks if r in self.pids}
        record: dict = {}
        if fault.kind in ("errno", "slow"):
            record = {"ranks": ranks, "pids": sorted(pids.values()),
                      "missing_ranks": sorted(set(ranks) - set(pids))}
        if fault.kind == "disk_full":
            self.keep_full |= fault.keep_full
            record = self.storage.fill(fault.headroom_kb * 1024)
        elif fault.kind == "errno" and fault.via == "libfiu":
            code = getattr(errno_module, fault.errno)
            for pid in pids.values():
                self.storage.fiu_fail(pid, fault.call, code, fault.probability)
            record["via"] = "libfiu"
        elif fault.kind in ("errno", "slow"):
            rule = {"call": fault.call, "path": fault.path,
                    "pids": None if fault.target == "all" else sorted(pids.values())}
            if fault.kind == "errno":
                rule.update(errno=getattr(errno_module, fault.errno), nth=fault.nth_call, count=fault.count,
                            probability=fault.probability, seed=fault.seed)
            else:
                rule.update(errno=0, delay_s=fault.latency_ms / 1000, bytes_per_s=fault.bandwidth_mb_s * (1 << 20))
            record["rule"] = self.storage.client.call("arm", rule=rule)["id"]
            record["via"] = "faultfs"
        elif fault.kind == "power_loss":
            record = {"pids": sorted(self.pids.values()), "launcher_pid": self.job.launcher_pids()[0]}
            self.job.kill()  # the whole node goes down at once
            record["lost"] = self.storage.client.call("crash")
        elif fault.kind == "corrupt":
            record = corrupt(self.storage.view, fault)
        else:
            raise ValueError(f"not a storage fault: {fault.kind}")
        return None, record

    def heal(self) -> dict:
        """End of a launch: disarm faultfs rules (returning what they did), drain the ballast."""
        out: dict = {}
        if self.storage.client is not None:
            out["faultfs"] = self.storage.client.call("status")
            self.storage.client.call("disarm")
        if not self.keep_full and self.storage.drain():
            out["ballast_removed"] = True
        return out


def corrupt(root: Path, fault: Fault) -> dict:
    """Damage files of a committed checkpoint under ``root`` (read beneath any fault layer)."""
    from reference_trainer.checkpoint import list_checkpoints

    ckpts = list_checkpoints(root)
    if not ckpts:
        raise RuntimeError(f"corrupt: no checkpoint in {root} to corrupt yet; trigger the fault later")
    if fault.checkpoint == "newest":
        target = ckpts[0]
    elif fault.checkpoint == "oldest":
        target = ckpts[-1]
    else:
        target = root / fault.checkpoint
        if not target.is_dir():
            raise RuntimeError(f"corrupt: {fault.checkpoint} does not exist; have {[c.name for c in ckpts]}")
    files = sorted(p for p in target.iterdir() if p.is_file() and fnmatch.fnmatch(p.name, fault.file))
    if not files:
        raise RuntimeError(f"corrupt: no file of {target.name} matches {fault.file!r}")
    done = []
    for f in files:
        size = f.stat().st_size
        if fault.corruption == "truncate":
            os.truncate(f, size // 2)
            done.append(f"{f.name}: {size} -> {size // 2} bytes")
        elif fault.corruption == "flip":
            with open(f, "r+b") as fh:
                fh.seek(size // 2)
                byte = fh.read(1)
                fh.seek(size // 2)
                fh.write(bytes([byte[0] ^ 0xFF]))
            done.append(f"{f.name}: 8 bits flipped at byte {size // 2}")
        else:
            f.unlink()
            done.append(f"{f.name}: deleted")
    return {"checkpoint": target.name, "files": done}


@dataclass
class RemoteNemesis:
    """Faults of the remote tier: toxics on the upload link (through the fault proxy), and the loss of
    the node's local checkpoint disk. Toxics last until a ``heal`` or the end of the launch."""

    tier: "RemoteTier"
    ckpt_dir: Path  # the node's local checkpoint disk, as the harness sees it
    job: Job | None = None
    pids: dict[int, int] = field(default_factory=dict)
    toxics: list[tuple[str, str]] = field(default_factory=list)  # (link, toxic name), until the launch ends
    kept: list[tuple[str, str]] = field(default_factory=list)  # ... until a heal fault or the end of the run

    def new_launch(self, job: Job, pids: dict[int, int]) -> None:
        self.job, self.pids = job, pids

    def fire(self, fault: Fault, event: dict) -> tuple[dict | None, dict]:
        if fault.kind == "toxic":
            name = f"{fault.toxic}_{fault.stream}_{len(self.toxics)}"
            self.tier.add_toxic(fault.link, name, fault.toxic, fault.stream, fault.toxicity, fault.attributes)
            (self.kept if fault.keep else self.toxics).append((fault.link, name))
            return None, {"link": fault.link, "toxic": fault.toxic, "stream": fault.stream,
                          "toxicity": fault.toxicity, "attributes": fault.attributes, "proxy": self.tier.proxy_for(fault.link)}
        if fault.kind == "heal":
            return None, {"removed_toxics": self.heal(everything=True)}
        if fault.kind == "lose_disk":
            # The node dies first (its launcher and every rank, the uploader with rank 0), then its disk.
            pids = list(self.pids.values())
            kill_local_node(self.job, pids)
            self.job.kill()
            wiped = sorted(p.name for p in self.ckpt_dir.iterdir()) if self.ckpt_dir.is_dir() else []
            for p in self.ckpt_dir.iterdir() if self.ckpt_dir.is_dir() else []:
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            return None, {"pids": pids, "wiped": wiped}
        raise ValueError(f"not a remote fault: {fault.kind}")

    def heal(self, everything: bool = False) -> list[str]:
        """Remove the toxics of this launch (and, with ``everything``, the kept ones too)."""
        removed, self.toxics = self.toxics, []
        if everything:
            removed, self.kept = removed + self.kept, []
        for link, name in removed:
            self.tier.remove_toxic(link, name)
        return [f"{link}:{name}" for link, name in removed]
