"""The automatic probe layer's settings and state, shared by all its parts (``auto.py``): what it
watches, the standard library's functions it replaced (``_orig``), this process's state (``_s``),
and how a part reports a point. One ``_s`` and one ``_orig`` per process: every part imports these
objects from here, so a setting ``configure`` reads is seen by all of them."""

from __future__ import annotations

import builtins
import io
import os
import shutil
import sys
import threading

from ckpt_chaos import probe
from ckpt_chaos.probe import follow

ENV_DIRS = "CKPT_CHAOS_AUTO_DIRS"  # os.pathsep-separated directories whose files are watched
ENV_RUN_DIR = "CKPT_CHAOS_RUN_DIR"  # where the recorder writes (the harness's run directory)
ENV_PLANNED = "CKPT_CHAOS_PLANNED"  # JSON file: the golden run's files, sizes and keys (follow.plan)
ENV_DIGEST_EVERY = "CKPT_CHAOS_DIGEST_EVERY"  # state digests every N steps (0: at exit only)
# Which of the per-step points go to the controller: "all" (unset), or those a fault's trigger names
# (comma-separated, may be empty). Each is a round trip on every step, which a short step feels; the
# checks read the steps from the trajectory.
ENV_STEP_POINTS = "CKPT_CHAOS_STEP_POINTS"
STEP_POINTS = ("step.begin", "step.end", "microstep.end")
# Set by the harness where the trainer restarts its own workers within one launch (recovery.relaunch =
# "self": Ray Train). Such a framework tells a worker its rank at run time (os.environ, which
# /proc/PID/environ does not show) and starts a new process for the same rank after a failure, with
# nothing in its environment that counts the restarts as torchrun's TORCHELASTIC_RESTART_COUNT does.
ENV_COUNT_RESTARTS = "CKPT_CHAOS_COUNT_RESTARTS"
INCARNATIONS = ".ckpt-chaos-incarnations"  # in the run directory: one file per (launch, rank, restart) claimed

CHUNK = 1 << 20  # bytes between file.write points when the file's size is not known
TENTHS = 10
WHOLE = 4096  # a first write at least this long, to a file with no planned size, is taken as the whole file

# The points this layer can fire, by the patch that fires them.
PATCH_POINTS = {
    "files": ("file.write", "file.done", "file.read", "file.fsync", "file.rename", "file.remove", "file.rmtree",
              "file.copy", "ckpt.shard.write", "ckpt.shard.done", "ckpt.metadata"),
    "os.write": ("file.write", "file.done", "file.read"),
    "torch.optim": ("step.begin", "step.end"),
    "torch.autograd": ("microstep.end",),
    "torch.save": ("ckpt.stage", "file.write", "file.done"),
    "torch.load": ("load.begin", "load.end"),
    "torch.utils.data": (),
    "torch.distributed.checkpoint": ("ckpt.stage", "load.begin", "load.end"),
    "lightning": ("ckpt.stage",),
    "accelerate": ("ckpt.stage", "load.begin", "load.end"),
}

_orig = {"open": builtins.open, "io.open": io.open, "fsync": os.fsync, "fdatasync": getattr(os, "fdatasync", None),
         "rename": os.rename, "replace": os.replace, "remove": os.remove, "unlink": os.unlink,
         "rmtree": shutil.rmtree, "copyfile": shutil.copyfile,
         "os.open": os.open, "os.write": os.write, "os.close": os.close, "excepthook": sys.excepthook}


class _State:
    def __init__(self):
        self.installed = False
        self.dirs: tuple[str, ...] = ()
        self.run_dir = ""
        self.follow = follow.Follower()  # the golden run's file of each file written (probe/follow.py)
        self.digest_every = 0
        self.rank: int | None = None
        self.rank_pid = 0
        self.logs: dict[tuple[str, int], int] = {}  # (file in the run directory, pid) -> descriptor
        self.armed: list[str] = []
        self.reported: set[str] = set()  # patches this process has told the controller about
        self.versions: dict[str, str | None] = {}  # framework -> the release found when it was patched
        self.unsupported: list[str] = []  # a line for each release outside versions.SUPPORTED
        self.pid = 0
        self.local = threading.local()  # re-entrancy: a patched call inside another is not reported twice
        self.fds: dict[int, str] = {}  # open file descriptors of watched files -> path, for fsync
        # descriptors of watched files being written -> the stream that counts their bytes: a Python
        # file's, for os.write on its fileno(), or one made for a descriptor os.open opened
        self.streams: dict = {}
        # the recorder
        self.step_of: dict[int, int] = {}  # id(optimizer) -> steps counted
        self.warming: set[int] = set()  # id(optimizer) of a step that only creates its state
        self.bias: dict[int, int] = {}  # id(optimizer) -> warm-up steps its count holds since its last load
        self.count_after: dict[int, int | None] = {}  # id(optimizer) -> its own count after its last step
        self.backwards = 0  # backwards since the last optimizer step
        self.losses: list[str] = []
        self.samples: list = []  # ids of the batches this step's backwards trained on
        self.batch = None  # ids of the batch a data loader delivered last
        self.last_iter = None  # the data loader iterator that fetched last
        self.extra: dict = {}
        self.last: dict | None = None
        self.optimizers: list = []
        self.step_points: frozenset[str] = frozenset(STEP_POINTS)
        self.attempt = 0  # the launch, as the probe counts it (a harness relaunch or a torchrun restart)
        self.incarnation: int | None = None  # this rank's restart within the launch, where the layer counts them
        self.pre_digest = True  # digest the state before the next step: the first of a process, or after a save
        self.pre: dict = {}
        self.folders: tuple | None = None  # the watched folders' entries at the last step


_s = _State()


# ---- reporting ---------------------------------------------------------------------------------------

def _point(name: str, /, **info) -> None:
    """Report a point, first telling the controller what is armed if that changed. Where the layer
    counts restarts, a process that does not know its rank (the framework's driver, its controller,
    a worker not yet told) is no rank: it reports nothing, so no fault takes its pid for a rank's."""
    if os.getpid() != _s.pid:  # a forked child (a data-loader worker) reports as itself, from scratch
        _s.pid, _s.reported = os.getpid(), set()
    if os.environ.get(ENV_COUNT_RESTARTS):
        if incarnation() is None:
            return
        controller = probe._this_process()
        if controller is not None:
            controller._restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) + _s.incarnation
    new = [a for a in [*_s.armed, *(f"version:{n}" for n in _s.versions)] if a not in _s.reported]
    if new:
        _s.reported.update(new)
        probe.point("probe.armed", armed=list(_s.armed), points=sorted(armed_points(_s.armed)),
                    versions=dict(_s.versions), **({"unsupported": list(_s.unsupported)} if _s.unsupported else {}))
    probe.point(name, **info)


def incarnation() -> int | None:
    """Under ``ENV_COUNT_RESTARTS``: which start of its rank in this launch this process is (0 the
    first, 1 after the framework's first restart), claimed once the process knows its rank, by creating
    ``RUN_DIR/INCARNATIONS/LAUNCH-RANK-N`` for the first N not taken; it counts in the launch the
    trajectory and the events carry (``_s.attempt``, the probe's ``restart``). None: the rank is not
    known yet. A process forked from a rank (a data-loader worker) inherits its parent's."""
    if _s.incarnation is not None or not os.environ.get(ENV_COUNT_RESTARTS) or not _s.run_dir:
        return _s.incarnation
    rank = probe._rank()
    if rank is None:
        return None
    folder = os.path.join(_s.run_dir, INCARNATIONS)
    os.makedirs(folder, exist_ok=True)
    launch = int(os.environ.get(probe.ENV_ATTEMPT, "0"))
    n = 0
    while True:
        try:
            fd = _orig["os.open"](os.path.join(folder, f"{launch}-{rank}-{n}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            n += 1
            continue
        _orig["os.write"](fd, str(os.getpid()).encode())
        _orig["os.close"](fd)
        break
    _s.incarnation = n
    _s.attempt += n
    return n


def armed_points(patches) -> set[str]:
    return {p for name in patches for p in PATCH_POINTS.get(name, ())}


def _arm(name: str) -> None:
    if name not in _s.armed:
        _s.armed.append(name)


class _Quiet:
    """Inside a reported operation: the calls it makes itself (``shutil.move`` renaming, a copy
    opening files) are not reported again."""

    def __enter__(self):
        _s.local.depth = getattr(_s.local, "depth", 0) + 1

    def __exit__(self, *exc):
        _s.local.depth -= 1


def _quiet() -> bool:
    return getattr(_s.local, "depth", 0) > 0


def _watched(path) -> str | None:
    """The path as reported (relative to the run directory where it lies in it), or None when it is
    not in a watched directory."""
    if not _s.dirs or isinstance(path, int):
        return None
    try:
        full = os.path.abspath(os.fsdecode(path))
    except (TypeError, ValueError):
        return None
    if not any(full == d or full.startswith(d + os.sep) for d in _s.dirs):
        return None
    if _s.run_dir and full.startswith(_s.run_dir + os.sep):
        return os.path.relpath(full, _s.run_dir)
    return full
