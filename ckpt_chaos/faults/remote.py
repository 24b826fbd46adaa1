"""Faults of the remote checkpoint tier: Toxiproxy toxics on the upload link or the rendezvous-store
link (through the fault proxy), and the loss of the node's local checkpoint disk, after which only
the remote tier is left to resume from. They run on the local backend with a ``[remote]`` table.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ckpt_chaos.check.expected import relaunched
from ckpt_chaos.faults.kind import Effects, FaultKind, Nemesis, NoParams, Setting
from ckpt_chaos.faults.registry import Invalid
from ckpt_chaos.faults.search_rules import LOSE_DISK, TOXIC
from ckpt_chaos.faults.process import kill_local_node
from ckpt_chaos.faults.storage import corruption_detected

if TYPE_CHECKING:
    from ckpt_chaos.scenario import Fault, Scenario

Link = Literal["remote", "store"]
Stream = Literal["upstream", "downstream"]
# Toxiproxy's toxics and the attributes each takes (https://github.com/Shopify/toxiproxy#toxics).
TOXICS: dict[str, tuple[str, ...]] = {
    "latency": ("latency", "jitter"), "bandwidth": ("rate",), "slow_close": ("delay",), "timeout": ("timeout",),
    "reset_peer": ("timeout",), "slicer": ("average_size", "size_variation", "delay"), "limit_data": ("bytes",),
}
Toxic = Literal[tuple(TOXICS)]
# what the scenario loader calls a value of each set in its messages ("unknown toxic 'netem'")
CHOICES = {Link: "link", Stream: "stream", Toxic: "toxic"}


@dataclass
class CorruptRemoteParams:
    file: str = "*.distcp"  # glob over the checkpoint's objects (one is flipped: the first in name order)
    checkpoint: str = "newest"  # newest | oldest durable checkpoint, or a checkpoint name


@dataclass
class ToxicParams:
    link: Link = "remote"  # remote (trainer <-> S3) | store (agents and ranks <-> rendezvous store)
    toxic: Toxic = "timeout"  # the Toxiproxy toxic type (TOXICS)
    stream: Stream = "upstream"  # upstream (client to server) | downstream
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

    def corrupt_remote(self, fault: Fault, event: dict, record: dict) -> None:
        """Flip 8 bits in the middle of an object of a durable remote checkpoint, as bit rot or a bad
        copy on the object store would; its size and the SHA-256 it was uploaded with stay."""
        import fnmatch

        from ckpt_chaos.env.objectstore import _client
        from ckpt_chaos.probe.layout import MANIFEST, parse_name

        p, tier = fault.params, self.setting.remote
        bucket, _, prefix = tier.url[len("s3://"):].partition("/")
        client = _client(tier.s3.endpoint)
        listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix.strip("/") + "/").get("Contents", [])
        keys: dict[str, list[str]] = {}
        for obj in listed:
            name, _, file = obj["Key"][len(prefix.strip("/")) + 1:].partition("/")
            keys.setdefault(name, []).append(file)
        durable = sorted((n for n, files in keys.items() if MANIFEST in files and parse_name(n)), key=parse_name)
        if not durable:
            raise RuntimeError("corrupt_remote: no durable checkpoint on the remote tier yet; trigger the fault later")
        name = {"newest": durable[-1], "oldest": durable[0]}.get(p.checkpoint, p.checkpoint)
        files = sorted(f for f in keys.get(name, []) if fnmatch.fnmatch(f, p.file) and f != MANIFEST)
        if name not in durable or not files:
            raise RuntimeError(f"corrupt_remote: no object of a durable {name} matches {p.file!r}; "
                               f"durable: {', '.join(durable)}")
        key = f"{prefix.strip('/')}/{name}/{files[0]}"
        head = client.head_object(Bucket=bucket, Key=key)
        body = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        body[len(body) // 2] ^= 0xFF
        client.put_object(Bucket=bucket, Key=key, Body=bytes(body), Metadata=head.get("Metadata", {}))
        record.update(checkpoint=name, files=[f"{files[0]}: 8 bits flipped at byte {len(body) // 2}"], remote=True)

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


def _restore_meets_it(s: Scenario, f: Fault) -> bool:
    """The relaunch has only the remote tier, whose newest durable checkpoint is the damaged one."""
    return f.params.checkpoint == "newest" and relaunched(s) and any(g.spec.loses_disk for g in s.faults)


def _remote_corruption_detected(run, h, report) -> None:
    corruption_detected(run, h, report, rejected_event="remote_rejected", where=" on the remote tier")


def _check_toxic(s: Scenario, f: Fault) -> None:
    _on_remote_tier(s, f)
    p = f.params
    if p.link == "remote" and not s.remote.proxy:
        raise Invalid("link", "the upload link bypasses the fault proxy (remote.proxy = false)",
                      "set [remote] proxy = true")
    if not 0 <= p.toxicity <= 1:
        raise Invalid("toxicity", f"{p.toxicity}", "use a probability in [0, 1]")
    for k, v in p.attributes.items():
        if k not in TOXICS[p.toxic]:
            raise Invalid(f"attributes.{k}", f"not an attribute of {p.toxic}",
                          f"{p.toxic} takes {', '.join(TOXICS[p.toxic])}")
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise Invalid(f"attributes.{k}", f"wrong value {v!r}", "use a whole number >= 0")


# where the family's kinds come in the registry, and its nemesis in a run's (faults/__init__.py)
ORDER = 4
KINDS = (
    FaultKind(name="toxic", family="remote",
              doc="add a Toxiproxy toxic (latency, bandwidth, timeout, reset_peer, slicer, limit_data, slow_close) "
                  "to the upload link (link = remote) or the rendezvous-store link (link = store), until a heal or "
                  "the end of the launch",
              params=ToxicParams, nemesis=RemoteNemesis, action=RemoteNemesis.toxic, colour="#c51b7d",
              effects=Effects(on_link=True, healable=True), validate=_check_toxic,
              needs=lambda p: frozenset({"store_proxy"}) if p.link == "store" else frozenset(), timed=True,
              search=TOXIC),
    FaultKind(name="corrupt_remote", family="remote",
              doc="flip 8 bits in an object of a durable checkpoint on the remote tier (bit rot, a bad copy): a "
                  "restore must validate what it downloads",
              params=CorruptRemoteParams, nemesis=RemoteNemesis, action=RemoteNemesis.corrupt_remote, colour="#de77ae",
              effects=Effects(damages=True), validate=_on_remote_tier, effect_check=_remote_corruption_detected,
              coverage={"fault_detected": _restore_meets_it}),
    FaultKind(name="lose_disk", family="remote",
              doc="SIGKILL the whole node and wipe its local checkpoint disk: the relaunch has only the remote tier "
                  "to resume from",
              params=NoParams, nemesis=RemoteNemesis, action=RemoteNemesis.lose_disk, colour="#762a83",
              effects=Effects(ends_launch=True, loses_disk=True), validate=_check_lose_disk, search=LOSE_DISK),
)
