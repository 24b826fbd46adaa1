"""The scenario model: what to run, what to break and when, how to recover, what must hold.

A scenario is a TOML file in ``scenarios/`` (schema below) or the same dataclasses built in
Python (``Scenario(...)``, ``Scenario.to_toml()``), so scenarios can also be generated.

.. code-block:: toml

    description = "rank 1 is SIGKILLed half-way through writing its shard of the 2nd checkpoint"
    tags = ["mid-write"]            # free-form; each becomes a pytest marker
    suites = ["default"]            # suites besides "full", which holds every scenario (default: ["default"]
                                    # in the built-in catalogue, [] in a project's folder)
    world_size = 2                  # ranks of the first launch
    trainer_module = "reference_trainer"   # python -m MODULE under torchrun
    probe = true                    # false: no controller; only external points (fs.created) trigger

    [trainer]                       # TrainConfig fields (reference_trainer/config.py)
    max_steps = 12
    ckpt_every_steps = 4

    [[faults]]
    kind = "kill"                   # see FAULT_KINDS (each kind: ckpt_chaos/faults/FAMILY.py)
    target = "rank:1"               # rank:N | ranks:A,B | all | majority | minority | node:N | triggering
    [faults.when]                   # a count of probe events, never a timer
    point = "ckpt.shard.write"      # probe point (ckpt_chaos/probe/__init__.py POINTS)
    rank = 1                        # count only this rank's events (default: any rank)
    save = 2                        # only inside the 2nd save of the launch
    min_fraction = 0.5              # ckpt.shard.write: at least half of the shard's bytes written
    nth = 1                         # the n-th event that matches all of the above

    [cluster]                       # where the job's nodes run (node and network faults)
    backend = "docker"              # local (default: one host, torchrun --standalone) | docker | netns | slurm
    ranks_per_node = 1              # docker / netns / slurm: the job has world_size / ranks_per_node nodes

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

Most kinds take keys of their own (each kind's parameter dataclass in ``ckpt_chaos/faults/``), for example::

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

import string
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ckpt_chaos.faults.registry import KINDS, Invalid, families, lookup
from ckpt_chaos.faults.targets import target_ranks
from ckpt_chaos.env.storage import FAULTFS_POINTS
from ckpt_chaos.probe import POINTS, auto

# Points the harness observes from outside, for trainers that do not call the probe.
EXTERNAL_POINTS = (
    "fs.created",  # a file or directory whose path (relative to the run directory) matches when.path appeared
)
# Points only the automatic probe layer fires (file operations of any writer), for [command] trainers,
# and those faultfs fires for them under [storage] faultfs = true (writers Python cannot see).
AUTO_POINTS = tuple(p for p in dict.fromkeys(p for ps in auto.PATCH_POINTS.values() for p in ps)
                    if p not in POINTS) + FAULTFS_POINTS
# Points whose events carry a path (relative to the run directory), which when.path filters with a glob.
PATH_POINTS = ("fs.created", *AUTO_POINTS, "ckpt.shard.write", "ckpt.shard.done", "ckpt.stage", "load.begin",
               "load.end", "upload.write")

# kind -> (family, one-line meaning), from the fault registry (ckpt_chaos/faults/). Families become
# pytest markers, like the kinds themselves.
FAULT_KINDS: dict[str, tuple[str, str]] = {k.name: (k.family, k.doc) for k in KINDS.values()}
FAMILIES = families()
FILE_SYSTEMS = ("host", "tmpfs", "ext4")
RELAUNCH = ("harness", "torchrun", "none")
BACKENDS = ("local", "docker", "netns", "slurm")
TRAJECTORY = ("bit-exact", "tolerance")
GENERIC_KEYS = ("kind", "when", "target", "attempt")  # every fault's keys; the rest are its kind's (faults/)
# Every scenario is in this suite, whatever its ``suites`` key says, so that none can drop out of
# every suite: the nightly run takes it, CI the smaller "default".
FULL_SUITE = "full"


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

    @property
    def external(self) -> bool:
        """An event the harness observes from outside (no rank waits at it)."""
        return self.point in EXTERNAL_POINTS


@dataclass(init=False)
class Fault:
    kind: str
    when: Trigger
    target: str = "triggering"
    attempt: int = 0  # the launch it belongs to (0 = first); in torchrun mode, torchrun's restart count
    params: Any = None  # the kind's parameters (its dataclass in ckpt_chaos/faults/), defaults if not given

    def __init__(self, kind: str, when: Trigger, target: str = "triggering", attempt: int = 0,
                 params: Any = None, **keys: Any):
        """``Fault(kind="errno", when=..., call="fsync", errno="EIO")``: the kind's keys as keyword
        arguments, as in the TOML table, or its parameters built already (``params``)."""
        spec = lookup(kind)
        if params is None:
            params = spec.make_params(**keys)
        elif keys or not isinstance(params, spec.params):
            raise TypeError(f"fault kind {kind!r}: give params as a {spec.params.__name__} or the keys "
                            f"({', '.join(spec.keys) or 'none'}), not both")
        self.kind, self.when, self.target, self.attempt, self.params = kind, when, target, attempt, params

    @property
    def spec(self) -> Any:
        """The kind's definition in the fault registry: its ``FaultKind`` (ckpt_chaos/faults/kind.py,
        which reads scenarios, so is not imported here)."""
        return lookup(self.kind)

    @property
    def family(self) -> str:
        return self.spec.family

    @property
    def ends_launch(self) -> bool:
        """The faulted launch cannot go on (the uploader dies alone: training goes on without it)."""
        return self.spec.ends_launch and self.target != "uploader"

    @property
    def needs(self) -> frozenset[str]:
        """What the run must set up for it (storage layers, proxies), as its kind says."""
        return self.spec.needs(self.params) if self.spec.needs else frozenset()

    def keys(self) -> dict[str, Any]:
        """The kind's keys that differ from their defaults, as the TOML table writes them."""
        defaults = self.spec.params()
        return {f.name: getattr(self.params, f.name) for f in fields(self.params)
                if getattr(self.params, f.name) is not None
                and getattr(self.params, f.name) != getattr(defaults, f.name)}


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

    @property
    def one_host(self) -> bool:
        """Every node is a process tree on this host, in its mount namespace: local, and Slurm's
        nodes here (slurmd -N), so storage faults reach every rank."""
        return self.backend in ("local", "slurm")


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
class Command:
    """A trainer nobody here wrote, run unmodified as its own command line (``[command]``). The
    automatic probe layer (``ckpt_chaos/probe/auto.py``) gives it the probe's points and records its
    trajectory. Placeholders in ``argv`` and ``relaunch_argv``: {python} {run_dir} {ckpt_dir}
    {world_size} {attempt}."""

    argv: list[str] = field(default_factory=list)  # torchrun: its script and arguments; self: the whole command
    launcher: str = "torchrun"  # torchrun (the harness starts world_size ranks) | self (argv starts its own ranks)
    relaunch_argv: list[str] = field(default_factory=list)  # added to argv on every relaunch (--ckpt-path last)
    ckpt_dir: str = "checkpoints"  # where it writes checkpoints, relative to the run directory
    watch: list[str] = field(default_factory=list)  # more folders its checkpoints pass through (a staging /tmp)
    key: list[str] = field(default_factory=list)  # globs (from the working directory) of files that key the golden run
    # What the trainer itself counts as complete: a glob in ckpt_dir ("step_*"), or the one checkpoint a
    # pointer file names: { pointer = "latest" } (its content, a path in ckpt_dir: DeepSpeed), with
    # format = "iter_{:07d}" when the content is a number formatted into the folder's name (Megatron).
    complete: str | dict[str, Any] = "*"
    env: dict[str, Any] = field(default_factory=dict)  # variables set for it (placeholders too): TMPDIR = "{run_dir}/tmp"
    save_every: int | None = None  # steps between its checkpoints: the bound on lost work
    digest_every: int = 0  # steps between digests of the model and optimizer state (0: around saves and at exit)
    requires: list[str] = field(default_factory=list)  # Python modules it imports (lightning): skipped, loudly, without


COMMAND_LAUNCHERS = ("torchrun", "self")
PLACEHOLDERS = ("python", "run_dir", "ckpt_dir", "world_size", "attempt")


@dataclass
class Recovery:
    relaunch: str = "harness"
    max_restarts: int = 1
    world_size: int | None = None
    # Trainer keys an operator changes before each relaunch (the first table: the first relaunch);
    # a relaunch past the list runs the scenario's own [trainer] again. Reference trainer only.
    changes: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Expect:
    trajectory: str = "bit-exact"
    rel_tol: float = 0.03  # tolerance mode: relative loss difference per step
    resume_from: str | None = None
    max_lost_steps: int | None = None  # default: one checkpoint interval (two less a step for async saves)
    job_fails: bool | None = None  # the faulted launch exits non-zero (default: not for term)
    detect_within_s: float | None = None  # fault -> faulted launch gone
    deadline_s: float = 300.0
    # Trainer keys a resume must refuse to change: a relaunch whose recovery.changes touch one exits
    # non-zero before loading anything, names the key, and leaves the checkpoints as they were.
    refused: list[str] = field(default_factory=list)
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
    command: Command | None = None  # [command]: an unmodified trainer of its own, instead of trainer_module
    recovery: Recovery = field(default_factory=Recovery)
    expect: Expect = field(default_factory=Expect)
    source: str = "<python>"  # the file it came from, for messages

    def __post_init__(self) -> None:
        self.suites = list(dict.fromkeys([*self.suites, FULL_SUITE]))

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

        needs = frozenset().union(*(f.needs for f in self.faults))
        # a trigger on a point faultfs reports needs it mounted, whatever the fault does
        watched = any(f.when.point in FAULTFS_POINTS for f in self.faults)
        return StorageSpec(fs=self.storage.fs, size_mb=self.storage.size_mb, faultfs="faultfs" in needs or watched,
                           lazy="lazy" in needs, libfiu="libfiu" in needs)

    def resumed_world_size(self) -> int:
        return self.recovery.world_size or self.world_size

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("source")
        d["faults"] = [{"kind": f.kind, "when": {k: v for k, v in asdict(f.when).items() if v is not None},
                        "target": f.target, "attempt": f.attempt, **f.keys()} for f in self.faults]
        if not self.cluster.multi_node:
            d.pop("cluster")
        if self.remote is None:
            d.pop("remote")
        if self.command is None:
            d.pop("command")
        else:
            d["command"] = {k: v for k, v in d["command"].items() if v is not None}
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
              "dict[str, Any]": lambda v: isinstance(v, dict),
              "list[dict[str, Any]]": lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v)}
    options = [a.strip() for a in annotation.split("|")]
    return any(checks.get(o, lambda v: True)(value) for o in options if o != "None")


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
                           if k not in ("faults", "recovery", "expect", "storage", "cluster", "remote", "command")},
                source, "")
    raw_faults = data.get("faults", [])
    if not isinstance(raw_faults, list):
        raise _error(source, "faults", "expected an array of tables", "write each fault as [[faults]]")
    faults = []
    for i, raw in enumerate(raw_faults):
        key = f"faults[{i}]"
        if not isinstance(raw, dict):
            raise _error(source, key, f"expected a table, found {type(raw).__name__}", "write each fault as [[faults]]")
        f = _take(Fault, {k: v for k, v in raw.items() if k in GENERIC_KEYS}, source, key, required=("kind", "when"))
        if f["kind"] not in KINDS:
            raise _error(source, f"{key}.kind", f"unknown fault kind {f['kind']!r}",
                         f"allowed kinds: {', '.join(KINDS)}")
        spec = KINDS[f["kind"]]
        when = _take(Trigger, f["when"], source, f"{key}.when", required=("point",))
        if when["point"] not in POINTS + EXTERNAL_POINTS + AUTO_POINTS:
            raise _error(source, f"{key}.when.point", f"unknown probe point {when['point']!r}",
                         f"allowed points: {', '.join(POINTS + EXTERNAL_POINTS + AUTO_POINTS)}")
        if when["point"] == "fs.created" and "path" not in when:
            raise _error(source, f"{key}.when.path", "fs.created needs a path glob",
                         "e.g. when = { point = \"fs.created\", path = \"checkpoints/.tmp-step_00000008/*.distcp\" }")
        if "path" in when and when["point"] not in PATH_POINTS:
            raise _error(source, f"{key}.when.path", f"{when['point']} carries no path",
                         f"path filters only {', '.join(PATH_POINTS)}")
        if when.get("nth", 1) < 1:
            raise _error(source, f"{key}.when.nth", "must be 1 or more", "count events from 1")
        f["when"] = Trigger(**when)
        own = {k: v for k, v in raw.items() if k not in GENERIC_KEYS}
        extra = [k for k in own if k not in spec.keys]
        if extra:
            raise _error(source, f"{key}.{extra[0]}", f"does not apply to kind {spec.name!r}",
                         f"{spec.name} takes {', '.join(spec.keys) or 'no keys of its own'} "
                         f"(besides {', '.join(GENERIC_KEYS)})")
        faults.append(Fault(**f, params=spec.params(**_take(spec.params, own, source, key))))
    storage = Storage(**_take(Storage, data.get("storage", {}), source, "storage"))
    cluster = Cluster(**_take(Cluster, data.get("cluster", {}), source, "cluster"))
    remote = Remote(**_take(Remote, data["remote"], source, "remote")) if "remote" in data else None
    command = Command(**_take(Command, data["command"], source, "command")) if "command" in data else None
    recovery = Recovery(**_take(Recovery, data.get("recovery", {}), source, "recovery"))
    expect = Expect(**_take(Expect, data.get("expect", {}), source, "expect"))
    scenario = Scenario(name=top.pop("name", default_name), faults=faults, storage=storage, cluster=cluster,
                        remote=remote, command=command, recovery=recovery,
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
    _check_command(s)
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
        if f.spec.validate is not None:  # the kind's own checks first: they explain a target best
            try:
                f.spec.validate(s, f)
            except Invalid as e:
                raise _error(src, e.key if e.top else f"faults[{i}].{e.key}", e.problem, e.fix) from None
        _check_target(f.target, s, src, f"faults[{i}].target")
        if not s.probe and not f.when.external:
            raise _error(src, f"faults[{i}].when.point", f"{f.when.point!r} needs the probe, and probe = false",
                         f"use an external point ({', '.join(EXTERNAL_POINTS)}) or probe = true")
        if f.when.external and f.target == "triggering":
            raise _error(src, f"faults[{i}].target", "an external event has no triggering rank",
                         "name the ranks: rank:N, all, ...")
        if f.when.rank is not None and not 0 <= f.when.rank < s.world_size:
            raise _error(src, f"faults[{i}].when.rank", f"rank {f.when.rank} does not exist at world size "
                         f"{s.world_size}", f"use a rank in 0..{s.world_size - 1}")
        if f.target == "uploader" and not f.spec.uploader:
            takes = [k.name for k in KINDS.values() if k.uploader]
            raise _error(src, f"faults[{i}].target", f"{f.kind} does not act on the uploader",
                         "use kind = " + " or ".join(f'"{k}"' for k in takes))
        if f.attempt > s.recovery.max_restarts:
            raise _error(src, f"faults[{i}].attempt", f"launch {f.attempt} never happens with max_restarts = "
                         f"{s.recovery.max_restarts}", "raise recovery.max_restarts or lower attempt")
    _check_changes(s)
    if s.trainer_module == "reference_trainer" or s.trainer_module.startswith("tests.planted."):
        _check_trainer_table(src, "trainer", s.trainer, s)
        for i, change in enumerate(s.recovery.changes):
            _check_trainer_table(src, f"recovery.changes[{i}]", {**s.trainer, **change}, s, change)


def _check_trainer_table(src: str, key: str, table: dict[str, Any], s: Scenario,
                         shown: dict[str, Any] | None = None) -> None:
    """``table`` is a valid reference-trainer configuration at every world size the scenario uses;
    errors name ``key`` and the keys of ``shown`` (the table as written)."""
    from reference_trainer.config import ConfigError, TrainConfig

    defaults = TrainConfig().to_dict()
    for k, v in (table if shown is None else shown).items():
        if k not in defaults:
            raise _error(src, f"{key}.{k}", "not a TrainConfig field", "see reference_trainer/config.py for the fields")
        if k == "run_dir":
            raise _error(src, f"{key}.run_dir", "set by the harness", "remove it")
        want = type(defaults[k])
        if not _type_ok(v, {int: "int", float: "float", bool: "bool", str: "str"}.get(want, "any")):
            raise _error(src, f"{key}.{k}", f"wrong type {type(v).__name__} ({v!r})", f"expected {want.__name__}")
    try:
        cfg = TrainConfig(**table)
        for world in {s.world_size, s.resumed_world_size()}:
            cfg.validate(world)
    except (ConfigError, TypeError) as e:
        raise _error(src, key, str(e), "fix the trainer table or the world sizes") from None


def _check_changes(s: Scenario) -> None:
    src, changes = s.source, s.recovery.changes
    if changes and s.command is not None:
        raise _error(src, "recovery.changes", "a [command] trainer's relaunch is changed by its own argv",
                     "use command.relaunch_argv")
    if changes and (s.recovery.relaunch != "harness" or s.cluster.backend == "slurm"):
        raise _error(src, "recovery.changes", "only a relaunch by the harness can change the configuration",
                     "use relaunch = \"harness\" on a backend other than slurm")
    if len(changes) > s.recovery.max_restarts:
        raise _error(src, "recovery.changes", f"{len(changes)} tables for {s.recovery.max_restarts} relaunch(es)",
                     "raise recovery.max_restarts or drop tables")
    for i, change in enumerate(changes):
        if not change and i == len(changes) - 1:
            raise _error(src, f"recovery.changes[{i}]", "an empty last table changes nothing",
                         "drop it: relaunches past the list run the scenario's own [trainer]")
    changed = {k for change in changes for k in change}
    for k in s.expect.refused:
        if k not in changed:
            raise _error(src, "expect.refused", f"{k!r} is changed by no relaunch",
                         "name keys that a recovery.changes table sets")


def _check_command(s: Scenario) -> None:
    src, c = s.source, s.command
    if c is None:
        for i, f in enumerate(s.faults):
            if f.when.point in AUTO_POINTS:
                source = "faultfs" if f.when.point in FAULTFS_POINTS else "the automatic probe layer"
                raise _error(src, f"faults[{i}].when.point", f"{f.when.point} comes from {source}, "
                             f"which reports for a [command] trainer only", "use a point the trainer reports "
                             "(ckpt_chaos/probe/__init__.py POINTS), or describe the trainer in a [command] table")
        return
    if s.trainer or s.trainer_module != "reference_trainer":
        raise _error(src, "trainer" if s.trainer else "trainer_module", "a [command] trainer is configured on its "
                     "command line", "drop it and put the settings in command.argv")
    if not c.argv:
        raise _error(src, "command.argv", "empty", "name the script and its arguments, "
                     "e.g. argv = [\"train.py\", \"--ckpt-dir\", \"{ckpt_dir}\"]")
    if c.launcher not in COMMAND_LAUNCHERS:
        raise _error(src, "command.launcher", f"unknown launcher {c.launcher!r}",
                     f"allowed: {', '.join(COMMAND_LAUNCHERS)}")
    bad_env = [k for k, v in c.env.items() if not isinstance(v, str)]
    if bad_env:
        raise _error(src, f"command.env.{bad_env[0]}", f"not a string: {c.env[bad_env[0]]!r}", "quote the value")
    for key, args in (("command.argv", c.argv), ("command.relaunch_argv", c.relaunch_argv),
                      ("command.env", list(c.env.values()))):
        for arg in args:
            try:
                names = [name for _, name, _, _ in string.Formatter().parse(arg) if name is not None]
            except ValueError as e:
                raise _error(src, key, f"{arg!r}: {e}", "write a literal brace as {{ or }}") from None
            bad = [n for n in names if n not in PLACEHOLDERS]
            if bad:
                raise _error(src, key, f"unknown placeholder {{{bad[0]}}} in {arg!r}",
                             f"allowed: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
    if not s.probe:
        raise _error(src, "probe", "a [command] trainer is driven by the automatic probe layer", "use probe = true")
    if s.cluster.multi_node or s.remote is not None:
        raise _error(src, "cluster" if s.cluster.multi_node else "remote", "a [command] trainer runs on the local "
                     "backend without a remote tier", "drop the table")
    if c.launcher == "self" and s.recovery.relaunch == "torchrun":
        raise _error(src, "recovery.relaunch", "torchrun restarts need torchrun as the launcher",
                     "use relaunch = \"harness\", or command.launcher = \"torchrun\"")
    if Path(c.ckpt_dir).is_absolute() or ".." in Path(c.ckpt_dir).parts or not c.ckpt_dir.strip("./"):
        raise _error(src, "command.ckpt_dir", f"{c.ckpt_dir!r}", "name a folder inside the run directory, "
                     "e.g. \"checkpoints\"")
    spec = s.storage_spec()
    if (spec.fs != "host" or spec.faultfs) and Path(c.ckpt_dir) != Path("checkpoints"):
        raise _error(src, "command.ckpt_dir", f"storage faults act on the run directory's checkpoints folder, "
                     f"not {c.ckpt_dir!r}", "use ckpt_dir = \"checkpoints\"")
    if c.save_every is not None and c.save_every < 1:
        raise _error(src, "command.save_every", f"{c.save_every}", "use the trainer's checkpoint interval in steps")
    _check_complete(src, c.complete)
    armed = auto.armed_points(auto.PATCH_POINTS)
    for i, f in enumerate(s.faults):
        if not f.when.external and f.when.point not in armed and f.when.point not in FAULTFS_POINTS:
            raise _error(src, f"faults[{i}].when.point", f"the automatic probe layer never fires {f.when.point!r}",
                         f"use one of {', '.join(sorted(armed))} (or an external point: "
                         f"{', '.join(EXTERNAL_POINTS)})")


COMPLETE_KEYS = ("pointer", "format")  # command.complete as a table: the checkpoint a pointer file names


def _in_folder(path: str) -> bool:
    """A relative path that stays inside the folder it is relative to."""
    p = Path(path)
    return bool(path.strip("./ ")) and not p.is_absolute() and ".." not in p.parts


def _check_complete(src: str, complete: str | dict[str, Any]) -> None:
    """``command.complete``: a glob in ckpt_dir, or ``{ pointer = FILE }`` with an optional ``format``
    (a str.format template with one field, for the number the file holds)."""
    key = "command.complete"
    pointer_example = 'complete = { pointer = "latest" }'
    if isinstance(complete, str):
        if not _in_folder(complete):
            raise _error(src, key, f"{complete!r} is not a glob inside ckpt_dir", "give one, e.g. complete = "
                         f"\"step_*\", or the file that names the newest checkpoint: {pointer_example}")
        return
    unknown = [k for k in complete if k not in COMPLETE_KEYS]
    if unknown:
        raise _error(src, f"{key}.{unknown[0]}", "unknown key", f"allowed keys: {', '.join(COMPLETE_KEYS)}, e.g. "
                     "complete = { pointer = \"latest_checkpointed_iteration.txt\", format = \"iter_{:07d}\" }")
    pointer = complete.get("pointer")
    if pointer is None:
        raise _error(src, f"{key}.pointer", "missing", f"name the file in ckpt_dir whose content names the "
                     f"checkpoint the trainer resumes from, e.g. {pointer_example}")
    if not isinstance(pointer, str) or not _in_folder(pointer) or any(ch in pointer for ch in "*?["):
        raise _error(src, f"{key}.pointer", f"{pointer!r} is not one file inside ckpt_dir",
                     f"name a file, relative to ckpt_dir and without wildcards, e.g. {pointer_example}")
    if "format" not in complete:
        return
    fmt = complete["format"]
    fix = ("write a template with one {} field for the number the pointer holds, e.g. format = \"iter_{:07d}\" "
           "(8 -> iter_0000008); leave format out when the pointer holds the checkpoint's name itself")
    if not isinstance(fmt, str):
        raise _error(src, f"{key}.format", f"wrong type {type(fmt).__name__} ({fmt!r})", fix)
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(fmt) if name is not None]
        example = fmt.format(8) if names == [""] or names == ["0"] else None
    except (ValueError, IndexError, KeyError) as e:
        raise _error(src, f"{key}.format", f"{fmt!r}: {e}", fix) from None
    if example is None:
        raise _error(src, f"{key}.format", f"{fmt!r} has {len(names)} replacement field(s), "
                     f"{', '.join('{' + n + '}' for n in names) or 'none'}", fix)
    if not _in_folder(example):
        raise _error(src, f"{key}.format", f"{fmt!r} makes {example!r}, which is not inside ckpt_dir", fix)


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
    if s.storage.fs != "host" and not c.one_host:
        raise _error(src, "storage", f"storage faults run on the local or slurm backend, not {c.backend!r}",
                     "drop [storage] and storage faults, or use backend = \"local\"")
    if c.backend == "slurm" and s.recovery.relaunch == "torchrun":
        raise _error(src, "recovery.relaunch", "on the slurm backend Slurm relaunches the job (its requeue)",
                     "use relaunch = \"harness\" (a failed job is requeued with scontrol requeue) or \"none\"")
    if not s.probe:
        raise _error(src, "probe", f"the {c.backend} backend drives trainers through the probe",
                     "use probe = true, or backend = \"local\" for an unprobed trainer")


def builtin(path: str | Path) -> bool:
    """The file is part of the built-in catalogue (``ckpt_chaos/scenarios/``)."""
    from ckpt_chaos.config import builtin_scenarios

    return Path(path).resolve().is_relative_to(builtin_scenarios())


def load(path: str | Path) -> Scenario:
    """The scenario in a file. A built-in file without ``suites`` is in ``default`` (CI's suite); any
    other file without it (a project's) is in ``full`` only, never in the built-in ``default``."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{path}: not valid TOML: {e}; fix the syntax") from None
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read: {e.strerror}") from None
    if "suites" not in data and not builtin(path):
        data = {**data, "suites": []}
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
