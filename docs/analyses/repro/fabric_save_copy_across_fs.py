"""Lightning Fabric: ``fabric.save`` leaves a torn checkpoint under its final name when ``TMPDIR`` is on
another file system than the checkpoint, and never fsyncs.

``_atomic_save`` (lightning/fabric/utilities/cloud_io.py) writes through an fsspec transaction: the
file goes to ``tempfile.mkstemp()`` (in TMPDIR) and the commit is ``shutil.move(temp, path)``
(fsspec/implementations/local.py, ``LocalFileOpener._open`` and ``commit``). Across file systems
``shutil.move`` falls back to copying into ``path`` itself, so a process killed during the copy leaves
a partial file under the final name, which ``fabric.load`` then fails on.

A child process saves a 64 MB state; this process kills it (SIGKILL) as soon as the final file holds
some bytes but not all, then loads what is left (the child counts its own os.fsync calls). Done twice: TMPDIR on the checkpoint's
file system (a rename: the final name never holds a partial file), then on another one (/dev/shm,
a tmpfs). Plain Python, no ckpt-chaos; one CPU process at a time; a minute or two (two imports of lightning).

    python docs/analyses/repro/fabric_save_copy_across_fs.py   # exit 1 while the bug is there
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning
import torch

SIZE = 64 * 2**20
CHILD = r"""
import os, sys, warnings, torch
warnings.filterwarnings("ignore")  # Lightning's hint that srun exists here
from lightning.fabric import Fabric
synced = []
for name in ("fsync", "fdatasync"):
    real = getattr(os, name)
    setattr(os, name, lambda fd, real=real, name=name: (synced.append(name), real(fd))[1])
SIZE = int(sys.argv[2])
fabric = Fabric(accelerator="cpu", devices=1)
fabric.save(sys.argv[1], {"weights": torch.ones(SIZE // 4), "step": 8})
print(f"saved; os.fsync/os.fdatasync calls during fabric.save: {len(synced)}", flush=True)
"""


def save_and_kill(tmpdir: Path, final: Path) -> str:
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(final), str(SIZE)], env=env, stdout=subprocess.PIPE,
                             text=True)
    seen = 0
    while child.poll() is None:
        if final.exists():
            seen = final.stat().st_size
            if 0 < seen < SIZE:
                child.send_signal(signal.SIGKILL)
                child.wait()
                return f"killed while {final.name} held {seen} bytes"
        time.sleep(0.0005)
    out = child.stdout.read().strip()
    return f"not killed: {final.name} appeared whole ({final.stat().st_size} bytes); {out}"


def try_load(final: Path) -> str:
    try:
        torch.load(final, weights_only=True)
        return "torch.load: ok"
    except Exception as e:  # what fabric.load (TorchCheckpointIO -> torch.load) would raise
        return f"torch.load: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}"


def main() -> int:
    print(f"lightning {lightning.__version__}, torch {torch.__version__}")
    torn = False
    with tempfile.TemporaryDirectory(dir=".") as ckpt, tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        for tmpdir in (Path(ckpt) / "tmp", Path(shm)):
            tmpdir.mkdir(exist_ok=True)
            final = Path(ckpt) / f"step_8-{tmpdir.name}.ckpt"
            same = os.stat(tmpdir).st_dev == os.stat(ckpt).st_dev
            where = "the checkpoint folder's file system" if same else "another file system"
            print(f"TMPDIR={tmpdir} ({where}):")
            print("  the save:", save_and_kill(tmpdir, final))
            if final.exists():
                loaded = try_load(final)
                print("  the relaunch's load of", final.name, "->", loaded)
                torn |= loaded != "torch.load: ok"
    print("a kill left a torn file under the final name" if torn else "no torn file under the final name")
    return 1 if torn else 0


if __name__ == "__main__":
    sys.exit(main())
