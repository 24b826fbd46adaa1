"""Background load for a run (``ckpt-chaos run --load cpu|io|both``): Debian's ``stress-ng`` keeps
every core busy, or the disk under the reports folder, or both, for as long as the run lasts.

A verdict that changes when the machine is busy rests on which process is quicker, a race the
scenario did not declare (docs/scenarios.md, ordered faults). Running a suite under load, and
``--repeat``, is how such a race shows up before a user's quiet or crowded machine shows it.

The load stops with the run: on its end, on Ctrl-C or SIGTERM (the context manager), and when the
harness itself dies (the kernel's parent-death signal, ``env/lifetime.py``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from ckpt_chaos.env.lifetime import die_with_parent

KINDS = ("cpu", "io", "both")
PACKAGE = "stress-ng"  # Debian's, in the Makefile's SYSTEM_PACKAGES


def missing() -> str | None:
    """Why no load can be made here, or None."""
    if shutil.which("stress-ng") is None:
        return (f"stress-ng is not installed (Debian package {PACKAGE}: `make setup` as root installs it, or "
                f"`apt-get install {PACKAGE}`)")
    return None


def argv(kind: str, workdir: Path, cores: int | None = None) -> list[str]:
    """stress-ng's command line for ``kind``: a CPU hog per core, a writer (write, fsync, unlink) of
    64 MiB files in ``workdir`` per two cores, or both."""
    if kind not in KINDS:
        raise ValueError(f"load {kind!r}: use one of {', '.join(KINDS)}")
    cores = cores or len(os.sched_getaffinity(0))
    out = ["stress-ng", "--quiet", "--temp-path", str(workdir)]
    if kind in ("cpu", "both"):
        out += ["--cpu", str(cores)]
    if kind in ("io", "both"):
        out += ["--hdd", str(max(1, cores // 2)), "--hdd-bytes", "64M", "--hdd-opts", "fsync"]
    return out


class Load:
    """``with Load("both", where):`` stress-ng runs in the background, its files in a folder under
    ``where`` (the disk the run writes to), all of it gone when the block ends; ``cores``: as many
    CPU hogs (default: one per core this process may use)."""

    def __init__(self, kind: str, where: Path, cores: int | None = None):
        self.kind = kind
        self.where = Path(where)
        self.cores = cores
        self.proc: subprocess.Popen | None = None
        self._dir: Path | None = None

    def __enter__(self) -> "Load":
        if why := missing():
            raise RuntimeError(why)
        self.where.mkdir(parents=True, exist_ok=True)
        self._dir = Path(tempfile.mkdtemp(prefix="load-", dir=self.where))
        self.proc = subprocess.Popen(argv(self.kind, self._dir, self.cores), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True, preexec_fn=die_with_parent)
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            # stress-ng ends its workers on SIGTERM; its session holds them all should it not
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # a worker left behind
        except ProcessLookupError:
            pass
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __exit__(self, *exc) -> None:
        self.stop()
