"""The scenario model: what to run, what to break and when, how to recover, what must hold.

A scenario is a TOML file in ``scenarios/`` (schema below) or the same dataclasses built in
Python (``Scenario(...)``, ``Scenario.to_toml()``), so scenarios can also be generated.

.. code-block:: toml

    description = "rank 1 is SIGKILLed half-way through writing its shard of the 2nd checkpoint"
    tags = ["mid-write"]            # free-form; each becomes a pytest marker
    suites = ["default"]            # suites this scenario belongs to (default: ["default"])
    world_size = 2                  # ranks of the first launch
    trainer_module = "reference_trainer"   # python -m MODULE under torchrun
    probe = true                    # false: no controller; only external points (fs.created) trigger

    [trainer]                       # TrainConfig fields (reference_trainer/config.py)
    max_steps = 12
    ckpt_every_steps = 4

    [[faults]]
    kind = "kill"                   # see FAULT_KINDS
    target = "rank:1"               # rank:N | ranks:A,B | all | majority | minority | node:N | triggering
    [faults.when]                   # a count of probe events, never a timer
    point = "ckpt.shard.write"      # probe point (ckpt_chaos/probe/__init__.py POINTS)
    rank = 1                        # count only this rank's events (default: any rank)
    save = 2                        # only inside the 2nd save of the launch
    min_fraction = 0.5              # ckpt.shard.write: at least half of the shard's bytes written
    nth = 1                         # the n-th event that matches all of the above

    [cluster]                       # where the job's nodes run (node and network faults)
    backend = "docker"              # local (default: one host, torchrun --standalone) | docker | netns
    ranks_per_node = 1              # docker / netns: the job has world_size / ranks_per_node nodes

    [storage]                       # the file system under the checkpoint directory (storage faults)
    fs = "tmpfs"                    # host (default) | tmpfs | ext4 (a loop-mounted image)
    size_mb = 64                    # tmpfs / ext4 size

    [recovery]
    relaunch = "harness"            # harness | torchrun | none (torchrun: its own --max-restarts; on a
                                    # multi-node cluster, --nnodes=MIN:MAX with MIN from world_size below)
    max_restarts = 1
    world_size = 2                  # world size of relaunches (default: unchanged)

    [expect]
    trajectory = "bit-exact"        # bit-exact | tolerance
    resume_from = "step_00000004"   # the checkpoint the first relaunch must load
    max_lost_steps = 4              # default: one checkpoint interval
    deadline_s = 300                # the harness kills everything after this long

Storage faults take their own keys (``KIND_KEYS`` lists them per kind), for example::

    [[faults]]
    kind = "errno"                  # fail calls with an errno, from faultfs (default) or libfiu
    call = "fsync"                  # open | write | read | fsync | rename | unlink | mkdir | rmdir | truncate | any
    errno = "EIO"
    path = ".tmp-*/__1_0.distcp"    # glob inside the checkpoint directory
    nth_call = 1                    # the n-th matching call after the trigger fails ...
    count = 1                       # ... and this many from there (0: every one)
    target = "rank:1"               # only calls of these ranks (all: any process)
    when = { point = "ckpt.stage", rank = 1, save = 2 }

Node and network faults need a multi-node backend (``[cluster]``)::

    [[faults]]
    kind = "partition"              # drop traffic between nodes until the launch ends
    split = "isolate"               # isolate (target nodes from the rest) | halves | store (target from node 0's store)
    cut = "nftables"                # nftables (drop rules in the node's namespace) | disconnect (unplug its link)
    target = "node:1"
    when = { point = "ckpt.shard.write", rank = 1, save = 2, min_fraction = 0.5 }

A remote checkpoint tier (S3; moto's server here) with faults on its link::

    [remote]                        # the trainer uploads each committed checkpoint in the background
    proxy = true                    # through the fault proxy (Toxiproxy's API), so toxics apply
    timeout_s = 2.0                 # one stalled request fails after this, then retries with backoff

    [[faults]]
    kind = "toxic"                  # toxic: a Toxiproxy toxic on a link, until a heal or the launch ends
    link = "remote"                 # remote (trainer <-> S3) | store (rendezvous store)
    toxic = "bandwidth"             # latency | bandwidth | timeout | reset_peer | slicer | limit_data | slow_close
    attributes = { rate = 256 }     # the toxic's attributes (KB/s here)
    when = { point = "upload.write", nth = 1 }

``kind = "lose_disk"`` kills the node and wipes its checkpoint disk; ``kind = "kill"`` with
``target = "uploader"`` kills only the uploader process.

Every problem in a file is reported with the file, the key, what was found and what is allowed;
nothing runs from a file that does not validate.
"""

from __future__ import annotations

import errno as errno_module
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ckpt_chaos.probe import POINTS

# Points the harness observes from outside, for trainers that do not call the probe.
EXTERNAL_POINTS = (
    "fs.created",  # a file or directory whose path (relative to the run directory) matches when.path appeared
)

# kind -> (family, one-line meaning). Families become pytest markers, like the kinds themselves.
FAULT_KINDS: dict[str, tuple[str, str]] = {
    "kill": ("process", "SIGKILL the target ranks (with node:N, the node's launcher too)"),
    "term": ("process", "SIGTERM (a preemption notice), then SIGKILL whatever is left after grace_s"),
    "stop": ("process", "SIGSTOP the target ranks: a hang that the job must detect by its collective timeout"),
    "raise": ("process", "raise an exception inside the triggering rank at the probe point (error: oom|io|runtime)"),
    "pause": ("node", "freeze every process of the target nodes (docker pause, or SIGSTOP in a namespace node) "
                      "until the launch is torn down"),
    "replace": ("node", "kill the target nodes; the relaunch runs them as fresh nodes whose local disk is empty"),
    "partition": ("network", "drop the traffic between nodes (split: isolate | halves | store) until the launch "
                             "ends, by nftables rules or by unplugging the node's link"),
    "heal": ("network", "lift every partition here (firewall rules deleted, links plugged back in): a transient "
                        "partition"),
    "disk_full": ("storage", "fill the checkpoint file system until headroom_kb is left (ballast kept until the "
                             "next launch, or for good with keep_full)"),
    "errno": ("storage", "fail chosen calls with an errno: the nth_call matching call (count times) or each with "
                         "a seeded probability; via faultfs (any call, path globs) or libfiu (the next call)"),
    "slow": ("storage", "add latency_ms to each matching call and/or cap the write bandwidth (bandwidth_mb_s)"),
    "power_loss": ("storage", "SIGKILL the whole node, then lose every write, create and rename not yet made "
                              "durable by fsync"),
    "corrupt": ("storage", "truncate, flip bits in, or delete files of a committed checkpoint (newest, oldest or "
                           "by name)"),
    "toxic": ("remote", "add a Toxiproxy toxic (latency, bandwidth, timeout, reset_peer, slicer, limit_data, "
                        "slow_close) to the upload link (link = remote) or the rendezvous-store link (link = store), "
                        "until a heal or the end of the launch"),
    "lose_disk": ("remote", "SIGKILL the whole node and wipe its local checkpoint disk: the relaunch has only the "
                            "remote tier to resume from"),
}
# The keys each kind takes beyond kind, when, target and attempt.
KIND_KEYS: dict[str, tuple[str, ...]] = {
    "kill": (), "term": ("grace_s",), "stop": (), "raise": ("error",),
    "pause": (), "replace": (), "partition": ("split", "cut"), "heal": (),
    "toxic": ("link", "toxic", "stream", "toxicity", "attributes", "keep"), "lose_disk": (),
    "disk_full": ("headroom_kb", "keep_full"),
    "errno": ("call", "errno", "path", "nth_call", "count", "probability", "seed", "via"),
    "slow": ("call", "path", "latency_ms", "bandwidth_mb_s"),
    "power_loss": (),
    "corrupt": ("corruption", "file", "checkpoint"),
}
CALLS = ("open", "write", "read", "fsync", "rename", "unlink", "mkdir", "rmdir", "truncate", "any")
LIBFIU_CALLS = ("open", "write", "fsync", "rename", "unlink", "truncate")
CORRUPTIONS = ("truncate", "flip", "delete")
FILE_SYSTEMS = ("host", "tmpfs", "ext4")
FAMILIES = sorted({family for family, _ in FAULT_KINDS.values()})
RELAUNCH = ("harness", "torchrun", "none")
BACKENDS = ("local", "docker", "netns")
SPLITS = ("isolate", "halves", "store")
CUTS = ("nftables", "disconnect")
TRAJECTORY = ("bit-exact", "tolerance")
RAISE_ERRORS = ("oom", "io", "runtime")
LINKS = ("remote", "store")
STREAMS = ("upstream", "downstream")
# Toxiproxy's toxics and the attributes each takes (https://github.com/Shopify/toxiproxy#toxics).
TOXICS: dict[str, tuple[str, ...]] = {
    "latency": ("latency", "jitter"), "bandwidth": ("rate",), "slow_close": ("delay",), "timeout": ("timeout",),
    "reset_peer": ("timeout",), "slicer": ("average_size", "size_variation", "delay"), "limit_data": ("bytes",),
}


class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the file, the key and the fix."""


@dataclass
class Trigger:
    """When a fault fires: the ``nth`` probe event that matches every given filter.

    Events are counted in the order the controller receives them. With ``rank`` set the count is
    over one rank's events, which arrive in program order, so the same scenario fires at the
    same point on every run.
    """

    point: str
    rank: int | None = None
    nth: int = 1
    step: int | None = None  # info["step"] equals this
    save: int | None = None  # inside the save-th save (ckpt.stage count) of this rank in this launch
    min_fraction: float | None = None  # ckpt.shard.write: info["fraction"] >= this
    name: str | None = None  # the checkpoint being saved or loaded has this name
    path: str | None = None  # fs.created: glob over paths relative to the run directory


@dataclass
class Fault:
    kind: str
    when: Trigger
    target: str = "triggering"
    attempt: int = 0  # the launch it belongs to (0 = first); in torchrun mode, torchrun's restart count
    grace_s: float = 10.0  # term: SIGKILL after this long
    error: str = "oom"  # raise: the exception
    headroom_kb: int = 0  # disk_full: free space left
    keep_full: bool = False  # disk_full: the disk stays full across relaunches
    call: str = "any"  # errno, slow: which calls (CALLS)
    errno: str = "EIO"  # errno: the error, by name
    path: str = "*"  # errno, slow: glob over paths inside the checkpoint directory
    nth_call: int = 1  # errno: the first matching call (counted from the trigger) that fails
    count: int = 1  # errno: how many matching calls fail from there (0: all)
    probability: float | None = None  # errno: instead, each matching call fails with this chance ...
    seed: int = 0  # ... drawn from a generator seeded with this
    via: str = "faultfs"  # errno: faultfs | libfiu
    latency_ms: float = 0.0  # slow: added to each matching call
    bandwidth_mb_s: float = 0.0  # slow: cap on write bandwidth (MiB/s), 0: none
    corruption: str = "truncate"  # corrupt: truncate | flip | delete
    file: str = "*.distcp"  # corrupt: glob over the checkpoint's files
    checkpoint: str = "newest"  # corrupt: newest | oldest | a checkpoint name
    split: str = "isolate"  # partition: isolate | halves | store
    cut: str = "nftables"  # partition: nftables | disconnect
    link: str = "remote"  # toxic: remote (trainer <-> S3) | store (agents and ranks <-> rendezvous store)
    toxic: str = "timeout"  # toxic: the Toxiproxy toxic type (TOXICS)
    stream: str = "upstream"  # toxic: upstream (client to server) | downstream
    toxicity: float = 1.0  # toxic: the chance that it applies to a connection
    attributes: dict[str, Any] = field(default_factory=dict)  # toxic: its attributes, e.g. { rate = 256 }
    keep: bool = False  # toxic: stays across relaunches (their rendezvous too), until a heal or the run's end

    @property
    def family(self) -> str:
        return FAULT_KINDS[self.kind][0]


@dataclass
class Storage:
    fs: str = "host"
    size_mb: int = 64


@dataclass
class Cluster:
    backend: str = "local"
    ranks_per_node: int = 1

    @property
    def multi_node(self) -> bool:
        return self.backend != "local"


@dataclass
class Remote:
    """The remote tier: an S3 endpoint (moto here) that the trainer uploads to, through the fault proxy."""

    proxy: bool = True  # route the upload link through the fault proxy (toxic faults need it)
    keep_last: int = 2  # remote_keep_last of the trainer
    timeout_s: float = 2.0  # remote_timeout_s: one stalled request fails after this
    retries: int = 5  # upload_retries
    backoff_s: float = 0.2  # upload_backoff_s
    drain_s: float = 30.0  # upload_drain_s: how long the last upload may take at the end

    def trainer_config(self, url: str, endpoint: str) -> dict[str, Any]:
        return {"remote_url": url, "remote_endpoint": endpoint, "remote_keep_last": self.keep_last,
                "remote_timeout_s": self.timeout_s, "upload_retries": self.retries,
                "upload_backoff_s": self.backoff_s, "upload_drain_s": self.drain_s}


@dataclass
class Recovery:
    relaunch: str = "harness"
    max_restarts: int = 1
    world_size: int | None = None


@dataclass
class Expect:
    trajectory: str = "bit-exact"
    rel_tol: float = 0.03  # tolerance mode: relative loss difference per step
    resume_from: str | None = None
    max_lost_steps: int | None = None  # default: one checkpoint interval
    job_fails: bool | None = None  # the faulted launch exits non-zero (default: not for term)
    detect_within_s: float | None = None  # fault -> faulted launch gone
    deadline_s: float = 300.0
    # The check this scenario is kept to show failing (a documented bug, described in its description):
    # its failure is an expected failure; its passing is reported, since the bug may have been fixed.
    known_failure: str | None = None


@dataclass
class Scenario:
    name: str
    faults: list[Fault] = field(default_factory=list)
    description: str = ""
    tags: list[str] = field(default_factory=list)
    suites: list[str] = field(default_factory=lambda: ["default"])
    world_size: int = 2
    trainer_module: str = "reference_trainer"
    probe: bool = True  # False: run the trainer without a controller (as a third-party trainer)
    trainer: dict[str, Any] = field(default_factory=dict)
    storage: Storage = field(default_factory=Storage)
    cluster: Cluster = field(default_factory=Cluster)
    remote: Remote | None = None  # [remote]: the run has a remote checkpoint tier
    recovery: Recovery = field(default_factory=Recovery)
    expect: Expect = field(default_factory=Expect)
    source: str = "<python>"  # the file it came from, for messages

    @property
    def families(self) -> list[str]:
        return sorted({f.family for f in self.faults})

    @property
    def kinds(self) -> list[str]:
        return sorted({f.kind for f in self.faults})

    @property
    def labels(self) -> list[str]:
        """Families, kinds, the backend (docker, netns), ``topology`` when the world size changes, and
        the tags: each is a pytest marker and a ``ckpt-chaos run -k`` selector."""
        extra = [self.cluster.backend] if self.cluster.multi_node else []
        if self.remote is not None:
            extra.append("remote")
        if self.resumed_world_size() != self.world_size:
            extra.append("topology")
        return list(dict.fromkeys(self.families + self.kinds + extra + self.tags))

    def nodes(self, world_size: int | None = None) -> int:
        return (world_size or self.world_size) // self.cluster.ranks_per_node if self.cluster.multi_node else 1

    def storage_spec(self):
        """The storage stack the faults need (ckpt_chaos/env/storage.py)."""
        from ckpt_chaos.env.storage import StorageSpec

        faultfs = any(f.kind in ("slow", "power_loss") or (f.kind == "errno" and f.via == "faultfs")
                      for f in self.faults)
        return StorageSpec(fs=self.storage.fs, size_mb=self.storage.size_mb, faultfs=faultfs,
                           lazy=any(f.kind == "power_loss" for f in self.faults),
                           libfiu=any(f.kind == "errno" and f.via == "libfiu" for f in self.faults))

    def resumed_world_size(self) -> int:
        return self.recovery.world_size or self.world_size

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("source")
        defaults = asdict(Fault(kind="kill", when=Trigger(point="step.end")))
        for f in d["faults"]:
            f["when"] = {k: v for k, v in f["when"].items() if v is not None}
            for k in [k for k in f if k not in ("kind", "when", "target", "attempt") + KIND_KEYS[f["kind"]]
                      or f[k] is None or (k in KIND_KEYS[f["kind"]] and f[k] == defaults[k])]:
                del f[k]
        if not self.cluster.multi_node:
            d.pop("cluster")
        if self.remote is None:
            d.pop("remote")
        for part in ("recovery", "expect"):
            d[part] = {k: v for k, v in d[part].items() if v is not None}
        return d

    def to_toml(self) -> str:
        import tomli_w

        return tomli_w.dumps(self.to_dict())


# ---- loading and validation --------------------------------------------------------------------

def _error(source: str, key: str, problem: str, fix: str) -> ScenarioError:
    return ScenarioError(f"{source}: {key}: {problem}; {fix}")


def _take(cls, data: Any, source: str, key: str, required: tuple[str, ...] = ()):
    """Build dataclass ``cls`` from a table, rejecting unknown keys and wrong types."""
    if not isinstance(data, dict):
        raise _error(source, key, f"expected a table, found {type(data).__name__}", f"write [{key}] with keys")
    allowed = {f.name: f for f in fields(cls) if f.name != "source"}
    for k in data:
        if k not in allowed:
            raise _error(source, f"{key}.{k}" if key else k, "unknown key",
                         f"allowed keys: {', '.join(sorted(allowed))}")
    for k in required:
        if k not in data:
            raise _error(source, f"{key}.{k}" if key else k, "missing", "this key is required")
    out = {}
    for k, v in data.items():
        expected = allowed[k].type
        if not _type_ok(v, str(expected)):
            raise _error(source, f"{key}.{k}" if key else k, f"wrong type {type(v).__name__} ({v!r})",
                         f"expected {expected}")
        out[k] = v
    return out


def _type_ok(value: Any, annotation: str) -> bool:
    checks = {"int": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "str": lambda v: isinstance(v, str), "bool": lambda v: isinstance(v, bool),
              "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
              "dict[str, Any]": lambda v: isinstance(v, dict)}
    options = [a.strip() for a in annotation.split("|")]
    return any(checks.get(o, lambda v: True)(value) for o in options if o != "None")


def target_ranks(target: str, world_size: int, triggering: int | None = None,
                 ranks_per_node: int | None = None) -> list[int]:
    """The ranks a target names at this world size. ``node:N`` is every rank of node N; with
    ``ranks_per_node`` None (the local backend) there is one node holding every rank."""
    if target == "triggering":
        return [] if triggering is None else [triggering]
    if target == "uploader":  # the remote tier's uploader process, not a rank
        return []
    if target.startswith("node:"):
        if ranks_per_node is None:
            return list(range(world_size)) if target == "node:0" else []
        n = int(target[5:])
        return [r for r in range(n * ranks_per_node, (n + 1) * ranks_per_node) if r < world_size]
    if target == "all":
        return list(range(world_size))
    if target == "majority":
        return list(range(world_size // 2 + 1))
    if target == "minority":
        n = (world_size - 1) // 2
        return list(range(world_size - n, world_size))
    if target.startswith("rank:"):
        return [int(target[5:])]
    if target.startswith("ranks:"):
        return sorted({int(x) for x in target[6:].split(",")})
    raise ValueError(target)


def _check_target(target: str, s: Scenario, source: str, key: str) -> None:
    world_size, nodes = s.world_size, s.nodes()
    fix = "use rank:N, ranks:A,B, all, majority, minority, node:N, triggering or uploader"
    if target == "uploader":
        if s.remote is None:
            raise _error(source, key, "the uploader exists only with a remote tier", "add a [remote] table")
        return
    try:
        ranks = target_ranks(target, world_size, triggering=0,
                             ranks_per_node=s.cluster.ranks_per_node if s.cluster.multi_node else None)
    except ValueError:
        raise _error(source, key, f"unknown target {target!r}", fix) from None
    if target.startswith("node:") and not 0 <= int(target[5:]) < nodes:
        raise _error(source, key, f"{target!r}: the job has {nodes} node(s)" +
                     ("" if s.cluster.multi_node else " on the local backend"),
                     f"use node:0..node:{nodes - 1}" + ("" if s.cluster.multi_node else
                                                       ", or [cluster] backend = \"docker\" for several nodes"))
    if not ranks:
        raise _error(source, key, f"{target!r} is empty at world size {world_size}", fix)
    bad = [r for r in ranks if not 0 <= r < world_size]
    if bad:
        raise _error(source, key, f"rank {bad[0]} does not exist at world size {world_size}",
                     f"use a rank in 0..{world_size - 1}")


def from_dict(data: dict[str, Any], source: str, default_name: str) -> Scenario:
    """Build and validate a scenario from a parsed table."""
    top = _take(Scenario, {k: v for k, v in data.items()
                           if k not in ("faults", "recovery", "expect", "storage", "cluster", "remote")},
                source, "")
    raw_faults = data.get("faults", [])
    if not isinstance(raw_faults, list):
        raise _error(source, "faults", "expected an array of tables", "write each fault as [[faults]]")
    faults = []
    for i, raw in enumerate(raw_faults):
        key = f"faults[{i}]"
        f = _take(Fault, raw, source, key, required=("kind", "when"))
        if f["kind"] not in FAULT_KINDS:
            raise _error(source, f"{key}.kind", f"unknown fault kind {f['kind']!r}",
                         f"allowed kinds: {', '.join(FAULT_KINDS)}")
        when = _take(Trigger, f["when"], source, f"{key}.when", required=("point",))
        if when["point"] not in POINTS + EXTERNAL_POINTS:
            raise _error(source, f"{key}.when.point", f"unknown probe point {when['point']!r}",
                         f"allowed points: {', '.join(POINTS + EXTERNAL_POINTS)}")
        if (when["point"] == "fs.created") != ("path" in when):
            raise _error(source, f"{key}.when.path", "fs.created needs a path glob, and only it takes one",
                         "e.g. when = { point = \"fs.created\", path = \"checkpoints/.tmp-step_00000008/*.distcp\" }")
        if when.get("nth", 1) < 1:
            raise _error(source, f"{key}.when.nth", "must be 1 or more", "count events from 1")
        f["when"] = Trigger(**when)
        if f.get("error", "oom") not in RAISE_ERRORS:
            raise _error(source, f"{key}.error", f"unknown error {f['error']!r}", f"allowed: {', '.join(RAISE_ERRORS)}")
        extra = [k for k in f if k not in ("kind", "when", "target", "attempt") + KIND_KEYS[f["kind"]]]
        if extra:
            takes = ", ".join(KIND_KEYS[f["kind"]]) or "no keys of its own"
            raise _error(source, f"{key}.{extra[0]}", f"does not apply to kind {f['kind']!r}",
                         f"{f['kind']} takes {takes} (besides kind, when, target, attempt)")
        faults.append(Fault(**f))
    storage = Storage(**_take(Storage, data.get("storage", {}), source, "storage"))
    cluster = Cluster(**_take(Cluster, data.get("cluster", {}), source, "cluster"))
    remote = Remote(**_take(Remote, data["remote"], source, "remote")) if "remote" in data else None
    recovery = Recovery(**_take(Recovery, data.get("recovery", {}), source, "recovery"))
    expect = Expect(**_take(Expect, data.get("expect", {}), source, "expect"))
    scenario = Scenario(name=top.pop("name", default_name), faults=faults, storage=storage, cluster=cluster,
                        remote=remote, recovery=recovery,
                        expect=expect,
                        source=source, **top)
    validate(scenario)
    return scenario


def validate(s: Scenario) -> None:
    """Cross-field checks: targets exist, the trainer config is valid at every world size used."""
    src = s.source
    if s.world_size < 1:
        raise _error(src, "world_size", f"{s.world_size} ranks", "use 1 or more")
    if s.storage.fs not in FILE_SYSTEMS:
        raise _error(src, "storage.fs", f"unknown file system {s.storage.fs!r}", f"allowed: {', '.join(FILE_SYSTEMS)}")
    if s.storage.fs != "host" and not 8 <= s.storage.size_mb <= 4096:
        raise _error(src, "storage.size_mb", f"{s.storage.size_mb}", "use 8 to 4096 (MiB)")
    _check_cluster(s)
    if s.recovery.relaunch not in RELAUNCH:
        raise _error(src, "recovery.relaunch", f"unknown mode {s.recovery.relaunch!r}", f"allowed: {', '.join(RELAUNCH)}")
    if s.expect.trajectory not in TRAJECTORY:
        raise _error(src, "expect.trajectory", f"unknown check {s.expect.trajectory!r}", f"allowed: {', '.join(TRAJECTORY)}")
    if s.recovery.relaunch == "torchrun" and s.recovery.world_size not in (None, s.world_size):
        if not s.cluster.multi_node:
            raise _error(src, "recovery.world_size", "torchrun restarts on one node keep the world size",
                         "use relaunch = \"harness\", or a multi-node [cluster] (torchrun --nnodes=MIN:MAX)")
        if s.resumed_world_size() > s.world_size:
            raise _error(src, "recovery.world_size", "an elastic torchrun job only shrinks here (no node joins)",
                         "use relaunch = \"harness\" to grow")
    if s.resumed_world_size() != s.world_size and s.expect.trajectory == "bit-exact":
        raise _error(src, "expect.trajectory", "bit-exact across a world-size change",
                     "use trajectory = \"tolerance\" (the README says why)")
    for i, f in enumerate(s.faults):
        if f.kind == "heal" and not s.cluster.multi_node and s.remote is not None:
            if not any(g.kind == "toxic" and g.attempt == f.attempt for g in s.faults):
                raise _error(src, f"faults[{i}].kind", "heal without a toxic in the same launch", "add a toxic fault")
        elif f.family in ("node", "network"):
            _check_cluster_fault(s, i, f)
        _check_target(f.target, s, src, f"faults[{i}].target")
        if not s.probe and f.when.point not in EXTERNAL_POINTS:
            raise _error(src, f"faults[{i}].when.point", f"{f.when.point!r} needs the probe, and probe = false",
                         f"use an external point ({', '.join(EXTERNAL_POINTS)}) or probe = true")
        if f.when.point in EXTERNAL_POINTS and f.target == "triggering":
            raise _error(src, f"faults[{i}].target", "an external event has no triggering rank",
                         "name the ranks: rank:N, all, ...")
        if f.kind == "raise" and f.when.point in EXTERNAL_POINTS:
            raise _error(src, f"faults[{i}].kind", "raise needs a probe point", "use kill, term or stop")
        if f.when.rank is not None and not 0 <= f.when.rank < s.world_size:
            raise _error(src, f"faults[{i}].when.rank", f"rank {f.when.rank} does not exist at world size "
                         f"{s.world_size}", f"use a rank in 0..{s.world_size - 1}")
        if f.kind == "raise" and f.target not in ("triggering", f"rank:{f.when.rank}"):
            raise _error(src, f"faults[{i}].target", "a raise happens inside the rank whose event fired",
                         "use target = \"triggering\" (and when.rank to choose the rank)")
        if f.kind == "term" and f.grace_s <= 0:
            raise _error(src, f"faults[{i}].grace_s", f"{f.grace_s}", "use a positive grace period")
        if f.family == "storage":
            _check_storage_fault(s, i, f)
        if f.family == "remote":
            _check_remote_fault(s, i, f)
        if f.target == "uploader" and f.kind != "kill":
            raise _error(src, f"faults[{i}].target", f"{f.kind} does not act on the uploader", "use kind = \"kill\"")
        if f.attempt > s.recovery.max_restarts:
            raise _error(src, f"faults[{i}].attempt", f"launch {f.attempt} never happens with max_restarts = "
                         f"{s.recovery.max_restarts}", "raise recovery.max_restarts or lower attempt")
    if s.trainer_module == "reference_trainer" or s.trainer_module.startswith("tests.planted."):
        from reference_trainer.config import ConfigError, TrainConfig

        defaults = TrainConfig().to_dict()
        for k, v in s.trainer.items():
            if k not in defaults:
                raise _error(src, f"trainer.{k}", "not a TrainConfig field",
                             "see reference_trainer/config.py for the fields")
            if k == "run_dir":
                raise _error(src, "trainer.run_dir", "set by the harness", "remove it")
            want = type(defaults[k])
            if not _type_ok(v, {int: "int", float: "float", bool: "bool", str: "str"}.get(want, "any")):
                raise _error(src, f"trainer.{k}", f"wrong type {type(v).__name__} ({v!r})", f"expected {want.__name__}")
        try:
            cfg = TrainConfig(**s.trainer)
            for world in {s.world_size, s.resumed_world_size()}:
                cfg.validate(world)
        except (ConfigError, TypeError) as e:
            raise _error(src, "trainer", str(e), "fix the trainer table or the world sizes") from None


def _check_cluster(s: Scenario) -> None:
    src, c = s.source, s.cluster
    if c.backend not in BACKENDS:
        raise _error(src, "cluster.backend", f"unknown backend {c.backend!r}", f"allowed: {', '.join(BACKENDS)}")
    if c.ranks_per_node < 1:
        raise _error(src, "cluster.ranks_per_node", f"{c.ranks_per_node}", "use 1 or more")
    if not c.multi_node:
        return
    for key, world in (("world_size", s.world_size), ("recovery.world_size", s.resumed_world_size())):
        if world % c.ranks_per_node:
            raise _error(src, key, f"{world} ranks do not fill nodes of {c.ranks_per_node} rank(s)",
                         "use a multiple of cluster.ranks_per_node")
    if s.storage.fs != "host" or any(f.family == "storage" for f in s.faults):
        raise _error(src, "storage", f"storage faults run on the local backend, not {c.backend!r}",
                     "drop [storage] and storage faults, or use backend = \"local\"")
    if not s.probe:
        raise _error(src, "probe", f"the {c.backend} backend drives trainers through the probe",
                     "use probe = true, or backend = \"local\" for an unprobed trainer")


def _check_cluster_fault(s: Scenario, i: int, f: Fault) -> None:
    src, key = s.source, f"faults[{i}]"
    if not s.cluster.multi_node:
        raise _error(src, f"{key}.kind", f"{f.kind} needs several nodes", "add [cluster] backend = \"docker\" "
                     "(or \"netns\")")
    if f.when.point in EXTERNAL_POINTS:
        raise _error(src, f"{key}.when.point", f"{f.kind} acts at a probe point", "use a probe point")
    if f.kind == "partition":
        if f.split not in SPLITS:
            raise _error(src, f"{key}.split", f"unknown split {f.split!r}", f"allowed: {', '.join(SPLITS)}")
        if f.cut not in CUTS:
            raise _error(src, f"{key}.cut", f"unknown cut {f.cut!r}", f"allowed: {', '.join(CUTS)}")
        if s.nodes() < 2:
            raise _error(src, "world_size", "a partition needs 2 nodes or more", "raise world_size")
        if f.split == "store" and f.cut != "nftables":
            raise _error(src, f"{key}.cut", "only the store's port is cut, which takes a firewall rule",
                         "use cut = \"nftables\"")
        if f.split in ("isolate", "store") and not f.target.startswith("node:"):
            raise _error(src, f"{key}.target", f"split = {f.split!r} cuts whole nodes", "use target = \"node:N\"")
        if f.split == "store" and f.target == "node:0":
            raise _error(src, f"{key}.target", "node 0 hosts the rendezvous store", "cut another node")
    elif f.kind == "heal":
        if not any(g.kind in ("partition", "toxic") and g.attempt == f.attempt for g in s.faults):
            raise _error(src, f"{key}.kind", "heal without a partition or toxic in the same launch",
                         "add a partition or toxic fault")
    elif not f.target.startswith("node:"):
        raise _error(src, f"{key}.target", f"{f.kind} acts on whole nodes", "use target = \"node:N\"")


def _check_remote_fault(s: Scenario, i: int, f: Fault) -> None:
    src, key = s.source, f"faults[{i}]"
    if s.remote is None:
        raise _error(src, f"{key}.kind", f"{f.kind} needs a remote tier", "add a [remote] table")
    if s.cluster.multi_node:
        raise _error(src, f"{key}.kind", f"{f.kind} runs on the local backend here, not {s.cluster.backend!r}",
                     "drop [cluster], or the remote fault")
    if f.when.point in EXTERNAL_POINTS:
        raise _error(src, f"{key}.when.point", f"{f.kind} acts at a probe point", "use a probe point")
    if f.kind == "lose_disk" and f.target not in ("node:0", "all"):
        raise _error(src, f"{key}.target", "the local backend has one node, and its disk goes with it",
                     "use target = \"node:0\"")
    if f.kind != "toxic":
        return
    if f.link not in LINKS:
        raise _error(src, f"{key}.link", f"unknown link {f.link!r}", f"allowed: {', '.join(LINKS)}")
    if f.link == "remote" and not s.remote.proxy:
        raise _error(src, f"{key}.link", "the upload link bypasses the fault proxy (remote.proxy = false)",
                     "set [remote] proxy = true")
    if f.toxic not in TOXICS:
        raise _error(src, f"{key}.toxic", f"unknown toxic {f.toxic!r}", f"allowed: {', '.join(TOXICS)}")
    if f.stream not in STREAMS:
        raise _error(src, f"{key}.stream", f"unknown stream {f.stream!r}", f"allowed: {', '.join(STREAMS)}")
    if not 0 <= f.toxicity <= 1:
        raise _error(src, f"{key}.toxicity", f"{f.toxicity}", "use a probability in [0, 1]")
    for k, v in f.attributes.items():
        if k not in TOXICS[f.toxic]:
            raise _error(src, f"{key}.attributes.{k}", f"not an attribute of {f.toxic}",
                         f"{f.toxic} takes {', '.join(TOXICS[f.toxic])}")
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise _error(src, f"{key}.attributes.{k}", f"wrong value {v!r}", "use a whole number >= 0")


def _check_storage_fault(s: Scenario, i: int, f: Fault) -> None:
    src, key = s.source, f"faults[{i}]"
    if f.when.point in EXTERNAL_POINTS:
        raise _error(src, f"{key}.when.point", f"{f.kind} acts at a probe point", "use a probe point")
    if f.kind == "disk_full" and s.storage.fs == "host":
        raise _error(src, f"{key}.kind", "disk_full needs a file system of limited size",
                     "add [storage] with fs = \"tmpfs\" or \"ext4\" and size_mb")
    if f.kind == "disk_full" and f.headroom_kb < 0:
        raise _error(src, f"{key}.headroom_kb", f"{f.headroom_kb}", "use 0 or more")
    if f.kind in ("errno", "slow") and f.call not in CALLS:
        raise _error(src, f"{key}.call", f"unknown call {f.call!r}", f"allowed: {', '.join(CALLS)}")
    if f.kind == "errno":
        if not (f.errno.startswith("E") and isinstance(getattr(errno_module, f.errno, None), int)):
            raise _error(src, f"{key}.errno", f"unknown errno {f.errno!r}", "use a name such as ENOSPC, EIO, "
                         "EDQUOT, EROFS")
        if f.via not in ("faultfs", "libfiu"):
            raise _error(src, f"{key}.via", f"unknown mechanism {f.via!r}", "allowed: faultfs, libfiu")
        if f.nth_call < 1 or f.count < 0:
            raise _error(src, f"{key}.nth_call", f"nth_call={f.nth_call}, count={f.count}",
                         "nth_call counts from 1; count is 0 (every call) or more")
        if f.probability is not None and not 0 < f.probability <= 1:
            raise _error(src, f"{key}.probability", f"{f.probability}", "use a probability in (0, 1]")
        if f.via == "libfiu":
            if f.call not in LIBFIU_CALLS:
                raise _error(src, f"{key}.call", f"libfiu cannot fail {f.call!r} (it does not wrap openat, "
                             "renameat, mkdir...)", f"use via = \"faultfs\", or a call of {', '.join(LIBFIU_CALLS)}")
            if f.path != "*" or f.nth_call != 1 or f.count != 1 or f.seed != 0:
                raise _error(src, f"{key}.via", "libfiu fails the next call of the process (or each with a "
                             "probability), whatever the path", "drop path/nth_call/count/seed, or use via = "
                             "\"faultfs\"")
    if f.kind == "slow" and f.latency_ms <= 0 and f.bandwidth_mb_s <= 0:
        raise _error(src, f"{key}.latency_ms", "neither latency_ms nor bandwidth_mb_s is set",
                     "set latency_ms > 0 and/or bandwidth_mb_s > 0")
    if f.kind == "corrupt" and f.corruption not in CORRUPTIONS:
        raise _error(src, f"{key}.corruption", f"unknown corruption {f.corruption!r}",
                     f"allowed: {', '.join(CORRUPTIONS)}")


def load(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{path}: not valid TOML: {e}; fix the syntax") from None
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read: {e.strerror}") from None
    return from_dict(data, str(path), path.stem)


def catalogue(root: str | Path) -> list[Scenario]:
    """Every scenario file under ``root``, sorted by name; the first invalid file raises."""
    scenarios = [load(p) for p in sorted(Path(root).rglob("*.toml"))]
    seen: dict[str, str] = {}
    for s in scenarios:
        if s.name in seen:
            raise ScenarioError(f"{s.source}: name: {s.name!r} is also used by {seen[s.name]}; names must be unique")
        seen[s.name] = s.source
    return sorted(scenarios, key=lambda s: s.name)
