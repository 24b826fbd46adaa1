"""The file system under a run's checkpoint directory, and the mechanisms storage faults use.

For a scenario with storage faults the harness builds, under ``RUN_DIR/.storage``::

    fs/                 the file system: a size-limited tmpfs, a loop-mounted ext4 image, or a
                        plain directory on the host's file system
    fs/data/            what the trainer sees as RUN_DIR/checkpoints (bind mount, or faultfs)
    fs/ballast          what ``disk_full`` writes to take the free space away (not visible to the trainer)
    fs/.faultfs/        faultfs's durable copies (lost-data model)

and tears all of it down on the way out (``Storage.close``), whatever happened: the checkpoint
files are first copied to RUN_DIR/checkpoints for post-mortem. Every mount's source (and the
loop image's name) carries ``ckpt-chaos-<pid of the harness>``, so ``remove_leftovers`` can find
and remove what a harness killed with SIGKILL left behind, without touching a live run's mounts.

Errno injection has two mechanisms: faultfs (a FUSE layer: every call, path globs, per-process
rules, seeded probabilities) and libfiu (``LD_PRELOAD``; wraps ``open``, ``write``, ``fsync``,
``rename``, ``unlink``, ``ftruncate`` of the C library, but not ``openat``, ``renameat`` or
``mkdir``, and fails the next call of the process whatever the file: arm it right before the call).
"""

from __future__ import annotations

import ctypes.util
import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

from ckpt_chaos.env.launcher import worker_pythonpath
from ckpt_chaos.extras import missing_extra

MARK = "ckpt-chaos"
# Probe points faultfs reports for the processes of a job (``report``), where Python cannot see the
# writer (a C++ or Rust library writing by itself): each holds the call until the controller answers.
FAULTFS_POINTS = ("faultfs.open", "faultfs.truncate", "faultfs.write", "faultfs.done", "faultfs.fsync",
                  "faultfs.rename", "faultfs.remove")
# What faultfs's crash does with directory entries no directory fsync made durable (un-fsynced data is
# dropped either way): undo them all (the worst POSIX allows), or keep them all (ext4's journal has
# committed them, delayed allocation has not written the data: a file renamed into place unsynced is
# there under its new name, empty or short).
POWER_LOSS_MODES = ("undo", "entries-kept")
FIU_LIBS = ("/usr/lib/fiu/fiu_run_preload.so", "/usr/lib/fiu/fiu_posix_preload.so")
FIU_POINTS = {  # libfiu failure point for each call it can fail
    "open": "posix/io/oc/open",
    "write": "posix/io/rw/write",
    "fsync": "posix/io/sync/fsync",
    "rename": "posix/io/dir/rename",
    "unlink": "posix/io/dir/unlink",
    "truncate": "posix/io/rw/ftruncate",
}


class StorageError(RuntimeError):
    """The storage stack could not be built or removed; the message says what to do."""


def _run(*cmd: str) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise StorageError(f"{' '.join(cmd)} failed: {(p.stderr or p.stdout).strip()}")


# ---- what this machine can do -------------------------------------------------------------------

def missing(fs: str = "host", faultfs: bool = False, libfiu: bool = False) -> str | None:
    """Why this machine cannot build the requested stack (None: it can). Used to skip loudly."""
    needs_mount = fs != "host" or faultfs
    if faultfs and (why := missing_extra("storage")):  # what to install first, before how to run
        return why
    if needs_mount and os.geteuid() != 0:
        return "mounting a file system needs root; run the harness as root (CI does)"
    if fs == "ext4" and not (shutil.which("mkfs.ext4") and shutil.which("losetup")):
        return "mkfs.ext4/losetup not found; install e2fsprogs and mount (make setup does)"
    if faultfs:
        if not os.path.exists("/dev/fuse"):
            return "/dev/fuse is missing; load the fuse module or give the container the device"
        if not (ctypes.util.find_library("fuse3") or ctypes.util.find_library("fuse")):
            return "libfuse is not installed; install the Debian package fuse3 (make setup does)"
        try:
            import mfusepy  # noqa: F401
        except (ImportError, OSError) as e:
            return f"the FUSE binding does not load ({e}); run make setup"
    if libfiu and not (all(os.path.exists(p) for p in FIU_LIBS) and shutil.which("fiu-ctrl")):
        return "libfiu is not installed; install the Debian packages libfiu0 and fiu-utils (make setup does)"
    return None


# ---- faultfs control ------------------------------------------------------------------------------

def socket_address(address: str) -> str:
    """``@name`` is a Linux abstract socket: no path length limit, no file to clean up."""
    return "\0" + address[1:] if address.startswith("@") else address


class FaultFSClient:
    def __init__(self, address: str):
        self.address = address

    def call(self, cmd: str, **args) -> dict:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(60)
            s.connect(socket_address(self.address))
            f = s.makefile("rw")
            f.write(json.dumps({"cmd": cmd, **args}) + "\n")
            f.flush()
            reply = json.loads(f.readline())
        if not reply.pop("ok"):
            raise StorageError(f"faultfs {cmd}: {reply['error']}")
        return reply


# ---- the stack --------------------------------------------------------------------------------

@dataclass
class StorageSpec:
    fs: str = "host"
    size_mb: int = 64
    faultfs: bool = False
    lazy: bool = False  # faultfs tracks durability (power-loss faults)
    libfiu: bool = False  # ranks run with libfiu preloaded


class Storage:
    """A run's checkpoint directory on the requested stack; ``close`` always removes the stack."""

    def __init__(self, run_dir: Path, spec: StorageSpec):
        self.run_dir = Path(run_dir).absolute()  # mount points are matched and unmounted by absolute path
        self.spec = spec
        self.tag = f"{MARK}-{os.getpid()}"
        self.root = self.run_dir / ".storage"
        self.fs = self.root / "fs"
        self.data = self.fs / "data"
        self.ckpt = self.run_dir / "checkpoints"
        self.ballast = self.fs / "ballast"
        self.fiu_prefix = self.root / "fiu" / "ctl"
        self.client: FaultFSClient | None = None
        self._daemon: subprocess.Popen | None = None
        self._mounted: list[Path] = []  # innermost last

    @property
    def active(self) -> bool:
        return self.spec.fs != "host" or self.spec.faultfs

    @property
    def view(self) -> Path:
        """Where the harness itself reads the checkpoints: beneath faultfs, so that its reads are
        neither counted by nor failed by the rules armed for the trainer."""
        return self.data if self.active else self.ckpt

    def __enter__(self) -> "Storage":
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        self.ckpt.mkdir(parents=True, exist_ok=True)
        if self.spec.libfiu:
            self.fiu_prefix.parent.mkdir(parents=True, exist_ok=True)
        if not self.active:
            return
        self.fs.mkdir(parents=True, exist_ok=True)
        if self.spec.fs == "tmpfs":
            _run("mount", "-t", "tmpfs", "-o", f"size={self.spec.size_mb}m,mode=0755", self.tag, str(self.fs))
            self._mounted.append(self.fs)
        elif self.spec.fs == "ext4":
            image = self.root / f"{self.tag}.img"
            with open(image, "wb") as f:
                f.truncate(self.spec.size_mb << 20)
            # -m 0: no blocks reserved for root, so "full" means full for the (root) trainer too.
            _run("mkfs.ext4", "-q", "-F", "-m", "0", "-L", "ckpt-chaos", str(image))
            _run("mount", "-o", "loop", str(image), str(self.fs))  # the loop device goes with the umount
            self._mounted.append(self.fs)
        self.data.mkdir(exist_ok=True)
        if self.spec.faultfs:
            control = f"@{self.tag}-{uuid.uuid4().hex[:12]}"  # abstract: run paths can be too long
            log = open(self.root / "faultfs.log", "ab")
            self._daemon = subprocess.Popen(
                [sys.executable, "-m", "ckpt_chaos.env.faultfs", str(self.fs), str(self.ckpt), control, self.tag],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "PYTHONPATH": worker_pythonpath("ckpt_chaos")})
            log.close()
            self._mounted.append(self.ckpt)
            self.client = FaultFSClient(control)
            self._wait_for_faultfs()
            if self.spec.lazy:
                self.client.call("lazy", on=True)
        else:
            _run("mount", "--bind", str(self.data), str(self.ckpt))
            self._mounted.append(self.ckpt)

    def _wait_for_faultfs(self, timeout: float = 20) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self._daemon.poll() is not None:
                break
            if os.path.ismount(self.ckpt):
                try:
                    self.client.call("ping")
                    return
                except OSError:
                    pass
            time.sleep(0.05)
        log = (self.root / "faultfs.log").read_text()[-2000:]
        raise StorageError(f"faultfs did not come up on {self.ckpt} within {timeout:.0f}s:\n{log}")

    # -- faults --------------------------------------------------------------------------------

    def free_bytes(self) -> int:
        sv = os.statvfs(self.fs)
        return sv.f_bavail * sv.f_frsize

    def fill(self, headroom: int) -> dict:
        """Take free space away until ``headroom`` bytes are left (a ballast file beside the data)."""
        before = self.free_bytes()
        want = max(0, before - headroom)
        if want:
            fd = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                # The job may be writing meanwhile, and allocation is in whole blocks: an allocation
                # that does not fit is halved until one does, and what is still free is taken again.
                while want >= 4096:
                    try:
                        os.posix_fallocate(fd, os.fstat(fd).st_size, want)
                    except OSError:
                        want //= 2
                        continue
                    want = self.free_bytes() - headroom
            finally:
                os.close(fd)
        return {"free_before": before, "free_after": self.free_bytes(), "headroom": headroom}

    def drain(self) -> bool:
        """Give the ballast's space back; True if there was one."""
        if self.ballast.exists():
            self.ballast.unlink()
            return True
        return False

    def fiu_env(self) -> dict[str, str]:
        return {"LD_PRELOAD": " ".join(FIU_LIBS), "FIU_CTRL_FIFO": str(self.fiu_prefix)}

    def fiu_fail(self, pid: int, call: str, errno_value: int, probability: float | None = None) -> None:
        """Make process ``pid`` fail its next ``call`` (or each with ``probability``) with errno."""
        name = FIU_POINTS[call]
        cmd = (f"enable_random name={name},probability={probability},failinfo={errno_value}" if probability
               else f"enable name={name},failinfo={errno_value},onetime")
        _run("fiu-ctrl", "-f", str(self.fiu_prefix), "-c", cmd, str(pid))

    # -- teardown ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Unmount everything, keep a copy of the checkpoints, remove .storage. Never raises for a
        step that fails: it tries every step and raises at the end with all that went wrong."""
        problems: list[str] = []
        copy = None
        if self.active and self.data.is_dir():
            copy = self.root / "copy"
            try:
                shutil.copytree(self.data, copy, symlinks=True, dirs_exist_ok=True)
            except (OSError, shutil.Error) as e:
                problems.append(f"copying the checkpoints out: {e}")
        for mountpoint in reversed(self._mounted):
            try:
                _unmount(mountpoint)
            except StorageError as e:
                problems.append(str(e))
        self._mounted.clear()
        if self._daemon is not None:
            try:
                self._daemon.wait(5)
            except subprocess.TimeoutExpired:
                self._daemon.kill()
                self._daemon.wait()
            self._daemon = None
            # a daemon stopped as it started may have mounted after the unmount above looked
            try:
                _unmount(self.ckpt)
            except StorageError as e:
                problems.append(str(e))
        if copy is not None and copy.is_dir():
            shutil.copytree(copy, self.ckpt, symlinks=True, dirs_exist_ok=True)
        if self.root.exists() and not any(str(m).startswith(str(self.root)) for m in _our_mounts()):
            shutil.rmtree(self.root, ignore_errors=True)
        if problems:
            raise StorageError("; ".join(problems))


def _mounted(path: Path) -> bool:
    try:
        os.lstat(path)
    except OSError as e:
        # A FUSE mount whose daemon died answers ENOTCONN, and os.path.ismount calls that "not a mount".
        return e.errno == errno.ENOTCONN
    return os.path.ismount(path)


def _unmount(path: Path) -> None:
    for attempt in range(50):
        if not _mounted(path):
            return
        p = subprocess.run(["umount", str(path)], capture_output=True, text=True)
        if p.returncode == 0:
            return
        if "busy" not in p.stderr and "not mounted" not in p.stderr:
            break
        time.sleep(0.1)  # a process killed a moment ago may still hold a file open
    p = subprocess.run(["umount", "-l", str(path)], capture_output=True, text=True)  # detach it anyway
    if p.returncode != 0 and _mounted(path):
        raise StorageError(f"cannot unmount {path}: {p.stderr.strip()}; unmount it by hand (umount -l)")


# ---- leftovers of harnesses that were killed ----------------------------------------------------

_TAG = re.compile(rf"{MARK}-(\d+)")


def _owner_alive(pid: int) -> bool:
    return pid == os.getpid() or psutil.pid_exists(pid)


def _loop_backing(source: str) -> str:
    if source.startswith("/dev/loop"):
        try:
            return Path(f"/sys/block/{Path(source).name}/loop/backing_file").read_text().strip()
        except OSError:
            return ""
    return ""


def _our_mounts() -> dict[str, int]:
    """Mount point -> pid of the harness that made it, for every mount of ours on this machine."""
    found = {}
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        left, _, right = line.partition(" - ")
        mountpoint = left.split()[4].replace("\\040", " ")
        source = right.split()[1] if len(right.split()) > 1 else ""
        m = _TAG.search(source) or _TAG.search(_loop_backing(source))
        if m:
            found[mountpoint] = int(m.group(1))
    return found


def _faultfs_daemons() -> dict[int, int]:
    """pid of each faultfs daemon of ours -> pid of the harness that started it (its fsname tag)."""
    found = {}
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        m = _TAG.search(cmd[-1]) if "ckpt_chaos.env.faultfs" in cmd else None
        if m:
            found[p.info["pid"]] = int(m.group(1))
    return found


def leftovers(owner: int | None = None) -> list[str]:
    """Mounts (``mount PATH``) and faultfs daemons (``faultfs process PID``) that harnesses no longer
    running left on this machine, or all of those of harness ``owner``."""
    def wanted(o: int) -> bool:
        return o == owner if owner is not None else not _owner_alive(o)

    return ([f"mount {m}" for m, o in sorted(_our_mounts().items()) if wanted(o)]
            + [f"faultfs process {p}" for p, o in sorted(_faultfs_daemons().items()) if wanted(o)])


def remove_leftovers() -> list[str]:
    """Unmount what harnesses that no longer run left behind, kill their faultfs daemons."""
    removed = []
    for mountpoint, owner in sorted(_our_mounts().items(), key=lambda kv: -len(kv[0])):
        if _owner_alive(owner):
            continue
        try:
            _unmount(Path(mountpoint))
            removed.append(f"mount {mountpoint}")
        except StorageError:
            continue
        # the stack's own folder beside the checkpoints (Storage.root), which its close never reached
        root = Path(mountpoint).parent / ".storage" if Path(mountpoint).name == "checkpoints" else \
            next((q for q in Path(mountpoint).parents if q.name == ".storage"), None)
        if root is not None and not any(m.startswith(f"{root}/") for m in _our_mounts()):
            shutil.rmtree(root, ignore_errors=True)
    for pid, owner in _faultfs_daemons().items():
        if not _owner_alive(owner):
            try:
                os.kill(pid, signal.SIGKILL)
                removed.append(f"faultfs process {pid}")
            except ProcessLookupError:
                pass
    return removed
