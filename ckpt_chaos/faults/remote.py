"""Faults of the remote checkpoint tier: Toxiproxy toxics on the upload link or the rendezvous-store
link (through the fault proxy), and the loss of the node's local checkpoint disk, after which only
the remote tier is left to resume from. They run on the local backend with a ``[remote]`` table.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ckpt_chaos.faults import FaultKind, Invalid, Nemesis, NoParams, Setting
from ckpt_chaos.faults.process import kill_local_node

if TYPE_CHECKING:
    from ckpt_chaos.scenario import Fault, Scenario

LINKS = ("remote", "store")
STREAMS = ("upstream", "downstream")
# Toxiproxy's toxics and the attributes each takes (https://github.com/Shopify/toxiproxy#toxics).
TOXICS: dict[str, tuple[str, ...]] = {
    "latency": ("latency", "jitter"), "bandwidth": ("rate",), "slow_close": ("delay",), "timeout": ("timeout",),
    "reset_peer": ("timeout",), "slicer": ("average_size", "size_variation", "delay"), "limit_data": ("bytes",),
}


@dataclass
class ToxicParams:
    link: str = "remote"  # remote (trainer <-> S3) | store (agents and ranks <-> rendezvous store)
    toxic: str = "timeout"  # the Toxiproxy toxic type (TOXICS)
    stream: str = "upstream"  # upstream (client to server) | downstream
    toxicity: float = 1.0  # the chance that it applies to a connection
    attributes: dict[str, Any] = field(default_factory=dict)  # the toxic's attributes, e.g. { rate = 256 }
    keep: bool = False  # stays across relaunches (their rendezvous too), until a heal or the run's end


class RemoteNemesis(Nemesis):
    """Toxics on the remote tier's links, and the loss of the node's local checkpoint disk. A toxic
    lasts until a heal fault or the end of its launch (with ``keep``, of the run)."""

    def __init__(self, setting: Setting):
        super().__init__(setting)
        self.ckpt_dir = setting.run_dir / "checkpoints"  # the node's local checkpoint disk, as the harness sees it
        self.toxics: list[tuple[str, str]] = []  # (link, toxic name), until the launch ends
        self.kept: list[tuple[str, str]] = []  # ... until a heal fault or the end of the run

    @staticmethod
    def missing(s: Scenario) -> str | None:
        from ckpt_chaos.env import objectstore

        why = objectstore.missing() if s.remote is not None else None
        return f"the remote tier: {why}" if why else None

    def toxic(self, fault: Fault, event: dict, record: dict) -> None:
        p, tier = fault.params, self.setting.remote
        name = f"{p.toxic}_{p.stream}_{len(self.toxics)}"
        tier.add_toxic(p.link, name, p.toxic, p.stream, p.toxicity, p.attributes)
        (self.kept if p.keep else self.toxics).append((p.link, name))
        record.update(link=p.link, toxic=p.toxic, stream=p.stream, toxicity=p.toxicity, attributes=p.attributes,
                      proxy=tier.proxy_for(p.link))

    def lose_disk(self, fault: Fault, event: dict, record: dict) -> None:
        # The node dies first (its launcher and every rank, the uploader with rank 0), then its disk.
        pids = list(self.launch.pids.values())
        kill_local_node(self.launch.job, pids)
        self.launch.job.kill()
        wiped = sorted(p.name for p in self.ckpt_dir.iterdir()) if self.ckpt_dir.is_dir() else []
        for p in self.ckpt_dir.iterdir() if self.ckpt_dir.is_dir() else []:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        record.update(pids=pids, wiped=wiped)

    def _remove(self, everything: bool) -> list[str]:
        """Remove the toxics of this launch (and, with ``everything``, the kept ones too)."""
        removed, self.toxics = self.toxics, []
        if everything:
            removed, self.kept = removed + self.kept, []
        for link, name in removed:
            self.setting.remote.remove_toxic(link, name)
        return [f"{link}:{name}" for link, name in removed]

    def lift(self) -> dict:
        return {"removed_toxics": self._remove(everything=True)} if self.setting.remote else {}

    def heal(self) -> dict:
        removed = self._remove(everything=False) if self.setting.remote else []
        return {"toxics": removed} if removed else {}


def _on_remote_tier(s: Scenario, f: Fault) -> None:
    if s.remote is None:
        raise Invalid("kind", f"{f.kind} needs a remote tier", "add a [remote] table")
    if s.cluster.multi_node:
        raise Invalid("kind", f"{f.kind} runs on the local backend here, not {s.cluster.backend!r}",
                      "drop [cluster], or the remote fault")
    if f.when.external:
        raise Invalid("when.point", f"{f.kind} acts at a probe point", "use a probe point")


def _check_lose_disk(s: Scenario, f: Fault) -> None:
    _on_remote_tier(s, f)
    if f.target not in ("node:0", "all"):
        raise Invalid("target", "the local backend has one node, and its disk goes with it", "use target = \"node:0\"")


def _check_toxic(s: Scenario, f: Fault) -> None:
    _on_remote_tier(s, f)
    p = f.params
    if p.link not in LINKS:
        raise Invalid("link", f"unknown link {p.link!r}", f"allowed: {', '.join(LINKS)}")
    if p.link == "remote" and not s.remote.proxy:
        raise Invalid("link", "the upload link bypasses the fault proxy (remote.proxy = false)",
                      "set [remote] proxy = true")
    if p.toxic not in TOXICS:
        raise Invalid("toxic", f"unknown toxic {p.toxic!r}", f"allowed: {', '.join(TOXICS)}")
    if p.stream not in STREAMS:
        raise Invalid("stream", f"unknown stream {p.stream!r}", f"allowed: {', '.join(STREAMS)}")
    if not 0 <= p.toxicity <= 1:
        raise Invalid("toxicity", f"{p.toxicity}", "use a probability in [0, 1]")
    for k, v in p.attributes.items():
        if k not in TOXICS[p.toxic]:
            raise Invalid(f"attributes.{k}", f"not an attribute of {p.toxic}",
                          f"{p.toxic} takes {', '.join(TOXICS[p.toxic])}")
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise Invalid(f"attributes.{k}", f"wrong value {v!r}", "use a whole number >= 0")


KINDS = (
    FaultKind("toxic", "remote", "add a Toxiproxy toxic (latency, bandwidth, timeout, reset_peer, slicer, "
              "limit_data, slow_close) to the upload link (link = remote) or the rendezvous-store link "
              "(link = store), until a heal or the end of the launch", ToxicParams, RemoteNemesis,
              RemoteNemesis.toxic, "#c51b7d", validate=_check_toxic,
              needs=lambda p: frozenset({"store_proxy"}) if p.link == "store" else frozenset(), healable=True,
              timed=True),
    FaultKind("lose_disk", "remote", "SIGKILL the whole node and wipe its local checkpoint disk: the relaunch has "
              "only the remote tier to resume from", NoParams, RemoteNemesis, RemoteNemesis.lose_disk, "#762a83",
              validate=_check_lose_disk, ends_launch=True, loses_disk=True),
)
