"""The scenario model: what to run, what to break and when, how to recover, what must hold.

One dataclass per section of a scenario file, one field per key; the format is in docs/scenarios.md.
Files are read and validated by ``ckpt_chaos/scenario.py``, which also exports these names; scenarios
built here in Python (``Scenario(...)``, ``Scenario.to_toml()``) meet the same checks there
(``validate``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, get_args

from ckpt_chaos.env.storage import FAULTFS_POINTS
from ckpt_chaos.faults.registry import CHOICE_NAMES as FAULT_CHOICE_NAMES, KINDS, families, lookup
from ckpt_chaos.probe import POINTS, auto_state

# Points the harness observes from outside, for trainers that do not call the probe.
EXTERNAL_POINTS = (
    "fs.created",  # a file or directory whose path (relative to the run directory) matches when.path appeared
)
# Points only the automatic probe layer fires (file operations of any writer), for [command] trainers,
# and those faultfs fires for them under [storage] faultfs = true (writers Python cannot see).
AUTO_POINTS = tuple(p for p in dict.fromkeys(p for ps in auto_state.PATCH_POINTS.values() for p in ps)
                    if p not in POINTS) + FAULTFS_POINTS
# Points whose events carry a path (relative to the run directory), which when.path filters with a glob.
PATH_POINTS = ("fs.created", *AUTO_POINTS, "ckpt.shard.write", "ckpt.shard.done", "ckpt.metadata", "ckpt.stage",
               "load.begin", "load.end", "upload.write")

# The keys that take one of a fixed set of values, each set declared once; the loader checks every
# such field against its set. The kinds and points come from their registries (faults/, probe/).
KindName = Literal[tuple(KINDS)]
Point = Literal[POINTS + EXTERNAL_POINTS + AUTO_POINTS]
FileSystem = Literal["host", "tmpfs", "ext4"]
Backend = Literal["local", "docker", "netns", "slurm"]
Launcher = Literal["torchrun", "self"]
Relaunch = Literal["harness", "torchrun", "self", "none"]
Trajectory = Literal["bit-exact", "tolerance"]
# What a value of each set is called in messages ("unknown backend 'k8s'").
CHOICE_NAMES: dict[Any, str] = {KindName: "fault kind", Point: "probe point", FileSystem: "file system",
                                Backend: "backend", Launcher: "launcher", Relaunch: "relaunch mode",
                                Trajectory: "trajectory check", **FAULT_CHOICE_NAMES}
BACKENDS: tuple[str, ...] = get_args(Backend)

# kind -> (family, one-line meaning), from the fault registry (ckpt_chaos/faults/). Families become
# pytest markers, like the kinds themselves.
FAULT_KINDS: dict[str, tuple[str, str]] = {k.name: (k.family, k.doc) for k in KINDS.values()}
FAMILIES = families()
GENERIC_KEYS = ("kind", "when", "target", "attempt")  # every fault's keys; the rest are its kind's (faults/)
# Every scenario is in this suite, whatever its ``suites`` key says, so that none can drop out of
# every suite: the nightly run takes it, CI the smaller "default".
FULL_SUITE = "full"
PLACEHOLDERS = ("python", "run_dir", "ckpt_dir", "world_size", "attempt")  # of Command.argv, relaunch_argv, env
CHANGE_PLACEHOLDERS = ("key", "value")  # of Command.change_argv, besides PLACEHOLDERS


@dataclass
class Trigger:
    """When a fault fires (``[faults.when]``): the ``nth`` probe event that matches every given filter.

    Events are counted in the order the controller receives them. With ``rank`` set the count is
    over one rank's events, which arrive in program order, so the same scenario fires at the
    same point on every run.
    """

    point: Point
    """The probe point, a point of the automatic probe layer or faultfs ([command] trainers), or an
    external point (fs.created)."""
    rank: int | None = None
    """Count only this rank's events (None: any rank's)."""
    nth: int = 1
    """The n-th event that matches all the filters, from 1."""
    step: int | None = None
    """The event's step (info["step"]) equals this."""
    save: int | None = None
    """Inside the save-th save (counted by ckpt.stage) of this rank in this launch."""
    min_fraction: float | None = None
    """ckpt.shard.write, file.write, faultfs.write: at least this fraction of the file's bytes written."""
    name: str | None = None
    """The checkpoint being saved or loaded has this name."""
    path: str | None = None
    """Points that carry a path (PATH_POINTS): a glob over paths relative to the run directory."""
    after: int | None = None
    """The index of a fault this one waits for: its trigger, once matched, holds the process at its point
    until that fault has fired (``ckpt_chaos/order.py``)."""

    @property
    def external(self) -> bool:
        """An event the harness observes from outside (no rank waits at it)."""
        return self.point in EXTERNAL_POINTS


@dataclass(init=False)
class Fault:
    """One ``[[faults]]`` table: a kind, its trigger and target, and the kind's own keys."""

    kind: KindName
    """The fault kind (its definition: ckpt_chaos/faults/FAMILY.py)."""
    when: Trigger
    """Its trigger."""
    target: str = "triggering"
    """rank:N | ranks:A,B | all | majority | minority | node:N | triggering | uploader."""
    attempt: int = 0
    """The launch it belongs to (0: the first); in torchrun mode, torchrun's restart count."""
    params: Any = None
    """The kind's parameters (its dataclass in ckpt_chaos/faults/), defaults if not given."""

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
    """``[storage]``: the file system under the checkpoint directory (storage faults)."""

    fs: FileSystem = "host"
    """host, tmpfs, or ext4 (an image on a loop device)."""
    size_mb: int = 64
    """Size of tmpfs / ext4, 8 to 4096 MiB."""


@dataclass
class Cluster:
    """``[cluster]``: where the job's nodes run (node and network faults)."""

    backend: Backend = "local"
    """local (one host), docker, netns, or slurm (a throwaway Slurm cluster on this host)."""
    ranks_per_node: int = 1
    """Multi-node backends: the job has world_size / ranks_per_node nodes."""

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
    """``[remote]``: the remote tier, an S3 endpoint that the trainer uploads to, through the fault proxy."""

    proxy: bool = True
    """Route the upload link through the fault proxy (toxic faults need it)."""
    keep_last: int = 2
    """remote_keep_last of the trainer: durable remote checkpoints kept."""
    timeout_s: float = 2.0
    """remote_timeout_s: one stalled request fails after this, then retries with backoff."""
    retries: int = 5
    """upload_retries."""
    backoff_s: float = 0.2
    """upload_backoff_s."""
    drain_s: float = 30.0
    """upload_drain_s: how long the last upload may take at the end."""

    def trainer_config(self, url: str, endpoint: str) -> dict[str, Any]:
        return {"remote_url": url, "remote_endpoint": endpoint, "remote_keep_last": self.keep_last,
                "remote_timeout_s": self.timeout_s, "upload_retries": self.retries,
                "upload_backoff_s": self.backoff_s, "upload_drain_s": self.drain_s}


@dataclass
class Command:
    """``[command]``: a trainer nobody here wrote, run unmodified as its own command line. The
    automatic probe layer (``ckpt_chaos/probe/auto.py``) gives it the probe's points and records its
    trajectory. Placeholders in ``argv``, ``relaunch_argv`` and ``env``: ``PLACEHOLDERS``."""

    argv: list[str] = field(default_factory=list)
    """torchrun: its script and arguments; self: the whole command."""
    launcher: Launcher = "torchrun"
    """torchrun (the harness starts world_size ranks) | self (argv starts its own ranks)."""
    relaunch_argv: list[str] = field(default_factory=list)
    """Added to argv on every relaunch (--ckpt-path last)."""
    change_argv: list[str] = field(default_factory=lambda: ["--{key}={value}"])
    """How a relaunch passes each key of its recovery.changes table, after argv and relaunch_argv:
    these arguments with {key} and {value} filled in (["--{key}", "{value}"] for two words)."""
    ckpt_dir: str = "checkpoints"
    """Where it writes checkpoints, relative to the run directory."""
    watch: list[str] = field(default_factory=list)
    """More folders its checkpoints pass through (a staging /tmp)."""
    key: list[str] = field(default_factory=list)
    """Globs (from the working directory) of the files that key the golden run."""
    complete: str | dict[str, Any] = "*"
    """What the trainer itself counts as complete: a glob in ckpt_dir ("step_*"), or the one checkpoint
    a pointer file names: { pointer = "latest" } (its content, a path in ckpt_dir: DeepSpeed), with
    format = "iter_{:07d}" when the content is a number formatted into the folder's name (Megatron)."""
    env: dict[str, Any] = field(default_factory=dict)
    """Variables set for it (placeholders too): TMPDIR = "{run_dir}/tmp"."""
    save_every: int | None = None
    """Steps between its checkpoints: the bound on lost work."""
    saves_in_flight: int = 0
    """Saves that may still be writing while training goes on (0: each save is whole before the next
    step; 1: an asynchronous checkpointer, such as DCP's async_save waited on at the next save): up to
    save_every × (1 + saves_in_flight) steps may be trained again after a fault."""
    keep_last: int | None = None
    """Its retention: how many of its newest complete checkpoints it keeps (None: it declares none, and
    retention is not checked)."""
    digest_every: int = 0
    """Steps between digests of the model and optimizer state (0: around saves and at exit)."""
    requires: list[str] = field(default_factory=list)
    """Python modules it imports (lightning): without them the scenario is skipped, loudly."""
    resize_rng: str | None = None
    """Whose random stream each rank goes on with after a resume at another world size, as the trainer
    declares it (keep | reseed | shared: ``check/trajectory.py`` RULES); None: none declared."""


@dataclass
class Recovery:
    """``[recovery]``: how the job is relaunched after the fault."""

    relaunch: Relaunch = "harness"
    """harness | torchrun (its own --max-restarts; on a multi-node cluster, --nnodes=MIN:MAX) | self (a
    [command] trainer that restarts its own workers, Ray Train's FailureConfig: the launch does not end,
    and the probe layer counts each rank's restarts) | none."""
    max_restarts: int = 1
    """Relaunches allowed; a fault's attempt must not exceed it."""
    world_size: int | None = None
    """The world size of relaunches (None: unchanged). With "world_size" in expect.refused, of the first
    relaunch only: it must refuse, and the relaunches after it run at the scenario's world_size again."""
    changes: list[dict[str, Any]] = field(default_factory=list)
    """Trainer keys an operator changes before each relaunch (the first table: the first relaunch);
    a relaunch past the list runs the scenario's own [trainer] again. A [command] trainer gets them
    on its command line (command.change_argv), its keys spelled as its options are."""


    @property
    def in_launch(self) -> bool:
        """Restarts happen inside the harness's one launch (torchrun's, or the trainer's own), with no
        snapshot of the disk between them and no exit status of their own."""
        return self.relaunch in ("torchrun", "self")


@dataclass
class Expect:
    """``[expect]``: what must hold after recovery (the checks: docs/checks.md)."""

    trajectory: Trajectory = "bit-exact"
    """bit-exact, or tolerance (required across a world-size change)."""
    rel_tol: float = 0.03
    """Tolerance mode: relative loss difference allowed per step."""
    resume_from: str | None = None
    """The checkpoint the first relaunch must load."""
    max_lost_steps: int | None = None
    """Steps of work a relaunch may train again. Default: one checkpoint interval (two less a step for
    the reference trainer's async saves; for a [command] trainer, command.save_every × (1 +
    command.saves_in_flight)); given, it is the bound for either."""
    job_fails: bool | None = None
    """The faulted launch exits non-zero (default: not for term)."""
    detect_within_s: float | None = None
    """Fault to faulted launch gone."""
    deadline_s: float = 300.0
    """The harness kills everything after this long."""
    refused: list[str] = field(default_factory=list)
    """Trainer keys a resume must refuse to change: a relaunch whose recovery.changes touch one exits
    non-zero before loading anything, names the key, and leaves the checkpoints as they were."""
    known_failure: str | None = None
    """The check this scenario is kept to show failing (a documented bug, described in its description):
    its failure is an expected failure; its passing is reported, since the bug may have been fixed."""
    may_be_unknown: str | None = None
    """Why a run of this scenario may not exercise what it states (a trigger on a point the machine's
    timing can skip): its ``unknown`` verdict is then reported as such but fails no suite. Without it,
    ``unknown`` fails the suite as ``fail`` does (exit status 4 where nothing failed outright)."""


@dataclass
class Scenario:
    """A whole scenario file: its top-level keys, and one field per section."""

    name: str
    """The file name without .toml, unique in the catalogue."""
    faults: list[Fault] = field(default_factory=list)
    """``[[faults]]``."""
    description: str = ""
    """One line, shown by list and in the report."""
    tags: list[str] = field(default_factory=list)
    """Free-form labels; each becomes a pytest marker and a -k selector."""
    suites: list[str] = field(default_factory=lambda: ["default"])
    """The suites it belongs to besides FULL_SUITE, which holds every scenario (a file outside the
    built-in catalogue without the key: none)."""
    world_size: int = 2
    """Ranks of the first launch."""
    trainer_module: str = "reference_trainer"
    """The trainer, run as python -m MODULE on each rank."""
    probe: bool = True
    """False: run the trainer without a controller (as a third-party trainer); only external points trigger."""
    trainer: dict[str, Any] = field(default_factory=dict)
    """``[trainer]``: the trainer's configuration (TrainConfig fields, reference_trainer/config.py)."""
    storage: Storage = field(default_factory=Storage)
    cluster: Cluster = field(default_factory=Cluster)
    remote: Remote | None = None
    """The run has a remote checkpoint tier when given."""
    command: Command | None = None
    """An unmodified trainer of its own, instead of trainer_module."""
    recovery: Recovery = field(default_factory=Recovery)
    expect: Expect = field(default_factory=Expect)
    source: str = "<python>"
    """The file it came from, for messages."""

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

    def launch_world_size(self, launch: int) -> int:
        """The ranks launch ``launch`` starts: the scenario's, recovery.world_size's on a relaunch, and the
        scenario's again after a first relaunch that had to refuse it (expect.refused names world_size)."""
        if launch == 0 or (launch > 1 and "world_size" in self.expect.refused):
            return self.world_size
        return self.resumed_world_size()

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

