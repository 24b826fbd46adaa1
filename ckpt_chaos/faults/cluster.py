"""Node and network faults, on a multi-node backend (docker, netns): whole nodes frozen or replaced,
traffic between nodes dropped, and the heal that lifts partitions and toxics mid-run.

A partition lasts until the launch ends; the end-of-launch heal lifts it before the relaunch, as
an operator would repair the network before restarting the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ckpt_chaos.env import cluster as cluster_module
from ckpt_chaos.env.cluster import FW_TABLE, STORE_PORT
from ckpt_chaos.faults.kind import Effects, FaultKind, Nemesis, NoParams
from ckpt_chaos.faults.registry import Invalid

if TYPE_CHECKING:
    from ckpt_chaos.scenario import Fault, Scenario

Split = Literal["isolate", "halves", "store"]
Cut = Literal["nftables", "disconnect"]
# what the scenario loader calls a value of each set in its messages ("unknown split 'quarters'")
CHOICES = {Split: "split", Cut: "cut"}


@dataclass
class PartitionParams:
    split: Split = "isolate"  # isolate (target nodes from the rest) | halves | store (target from node 0's store)
    cut: Cut = "nftables"  # nftables (drop rules in the node's namespace) | disconnect (unplug its link)


class ClusterNemesis(Nemesis):
    """Node faults (pause, replace) and network partitions on the run's nodes."""

    @staticmethod
    def missing(s: Scenario) -> str | None:
        if s.cluster.backend not in ("docker", "netns"):
            return None
        why = cluster_module.missing(s.cluster.backend)
        if why:
            kinds = sorted({f.kind for f in s.faults}) or ["the cluster"]
            return f"{', '.join(kinds)} on backend={s.cluster.backend}: {why}"
        return None

    def _nodes(self, fault: Fault, record: dict) -> list[int]:
        c = self.setting.cluster
        nodes = len(c.job.agents)
        targets = [int(fault.target[5:])] if fault.target.startswith("node:") else list(range(nodes))
        pids = self.launch.pids
        ranks = [r for r in pids if c.job.node_of(r) in targets]
        record.update(nodes=targets, ranks=ranks, pids=sorted(pids[r] for r in ranks))
        return targets

    def pause(self, fault: Fault, event: dict, record: dict) -> None:
        for n in self._nodes(fault, record):
            self.setting.cluster.pause(n)

    def replace(self, fault: Fault, event: dict, record: dict) -> None:
        targets = self._nodes(fault, record)
        for n in targets:
            self.setting.cluster.replace(n)
        record["fresh_disks"] = [self.setting.cluster.local_disk(n) for n in targets]

    def partition(self, fault: Fault, event: dict, record: dict) -> None:
        c, p = self.setting.cluster, fault.params
        targets = self._nodes(fault, record)
        nodes = len(c.job.agents)
        side_a = list(range(nodes // 2)) if p.split == "halves" else targets
        side_b = [n for n in range(nodes) if n not in side_a]
        addresses = {n: c.address(n) for n in range(nodes)}
        record.update(split=p.split, cut=p.cut, side_a=side_a, side_b=side_b, addresses=addresses)
        if p.cut == "disconnect":
            # unplugging the smaller side's links separates the halves as well as any firewall would
            for n in side_a:
                c.unplug(n)
            return
        rules = partition_rules(p.split, side_a, side_b, addresses)
        for n, ruleset in rules.items():
            c.firewall(n, ruleset)
        record["rules"] = rules

    @property
    def _own_nodes(self) -> bool:
        """Containers or namespaces of the harness's own (Slurm's nodes are the slurm family's)."""
        return self.setting.cluster is not None and self.setting.cluster.backend in ("docker", "netns")

    def lift(self) -> dict:
        return {"healed": self.setting.cluster.heal()} if self._own_nodes else {}

    def heal(self) -> dict:
        if self._own_nodes:
            self.setting.cluster.heal()
        return {}


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


# ---- validation -----------------------------------------------------------------------------------

def _on_nodes(s: Scenario, f: Fault) -> None:
    if s.cluster.backend not in ("docker", "netns"):
        raise Invalid("kind", f"{f.kind} needs nodes of their own (containers or namespaces)",
                      "add [cluster] backend = \"docker\" (or \"netns\")"
                      + ("; on Slurm, node_down loses a node" if s.cluster.backend == "slurm" else ""))
    if f.when.external:
        raise Invalid("when.point", f"{f.kind} acts at a probe point", "use a probe point")


def _check_node_fault(s: Scenario, f: Fault) -> None:
    _on_nodes(s, f)
    if not f.target.startswith("node:"):
        raise Invalid("target", f"{f.kind} acts on whole nodes", "use target = \"node:N\"")


def _check_partition(s: Scenario, f: Fault) -> None:
    _on_nodes(s, f)
    p = f.params
    if s.nodes() < 2:
        raise Invalid("world_size", "a partition needs 2 nodes or more", "raise world_size", top=True)
    if p.split == "store" and p.cut != "nftables":
        raise Invalid("cut", "only the store's port is cut, which takes a firewall rule", "use cut = \"nftables\"")
    if p.split in ("isolate", "store") and not f.target.startswith("node:"):
        raise Invalid("target", f"split = {p.split!r} cuts whole nodes", "use target = \"node:N\"")
    if p.split == "store" and f.target == "node:0":
        raise Invalid("target", "node 0 hosts the rendezvous store", "cut another node")


def _check_heal(s: Scenario, f: Fault) -> None:
    # a toxic kept across relaunches (``keep``) is still there to heal in a later launch
    lifted = any(g.spec.healable and (g.attempt == f.attempt
                                      or (g.attempt < f.attempt and getattr(g.params, "keep", False)))
                 for g in s.faults)
    if not s.cluster.multi_node and s.remote is not None:  # the remote tier's toxics, on the local backend
        if not lifted:
            raise Invalid("kind", "heal without a toxic in the same launch", "add a toxic fault")
        return
    _on_nodes(s, f)
    if not lifted:
        raise Invalid("kind", "heal without a partition or toxic in the same launch", "add a partition or toxic fault")


# where the family's kinds come in the registry, and its nemesis in a run's (faults/__init__.py)
ORDER = 2
KINDS = (
    FaultKind(name="pause", family="node",
              doc="freeze every process of the target nodes (docker pause, or SIGSTOP in a namespace node) until the"
                  " launch is torn down",
              params=NoParams, nemesis=ClusterNemesis, action=ClusterNemesis.pause, colour="#e7298a",
              effects=Effects(ends_launch=True), validate=_check_node_fault, timed=True),
    FaultKind(name="replace", family="node",
              doc="kill the target nodes; the relaunch runs them as fresh nodes whose local disk is empty",
              params=NoParams, nemesis=ClusterNemesis, action=ClusterNemesis.replace, colour="#ce1256",
              effects=Effects(ends_launch=True, kills_target=True), validate=_check_node_fault),
    FaultKind(name="partition", family="network",
              doc="drop the traffic between nodes (split: isolate | halves | store) until the launch ends, by "
                  "nftables rules or by unplugging the node's link",
              params=PartitionParams, nemesis=ClusterNemesis, action=ClusterNemesis.partition, colour="#980043",
              effects=Effects(ends_launch=True, healable=True), validate=_check_partition, timed=True),
    FaultKind(name="heal", family="network",
              doc="lift every partition here (firewall rules deleted, links plugged back in) and remove every toxic:"
                  " a transient fault",
              params=NoParams, nemesis=None, action=None, colour="#4daf4a", effects=Effects(heals=True),
              validate=_check_heal),
)
