"""torch DCP's FileSystemWriter fsyncs its files but never a folder: the step folder it makes and the
.metadata it renames into that folder are not durable when save returns.

dcp.save (sync_files=True, the default) on one process, with os.fsync and os.sync recorded: every
shard and .metadata.tmp is fsynced, then .metadata.tmp is renamed to .metadata, and neither the
checkpoint folder (created by mkdir) nor its parent is ever fsynced. After a power cut the file
system may take back the folder's creation and the rename (POSIX makes a directory entry durable
only through an fsync of the directory), and the checkpoint is gone though every byte of it was
synced. Exits 1 when the gap is there, 0 when some fsync covers the folders.

    python docs/analyses/repro/dcp_no_dir_fsync.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

synced: list[str] = []
whole_sync = []
real_fsync, real_sync = os.fsync, os.sync


def fsync(fd):
    synced.append(os.readlink(f"/proc/self/fd/{fd if isinstance(fd, int) else fd.fileno()}"))
    return real_fsync(fd)


def sync():
    whole_sync.append(True)
    return real_sync()


os.fsync, os.sync = fsync, sync

root = Path(tempfile.mkdtemp())
ckpt = root / "step_8"
dcp.save({"w": torch.arange(1000.0), "step": 8}, storage_writer=FileSystemWriter(str(ckpt), sync_files=True),
         no_dist=True)

print(f"torch {torch.__version__}")
print("files in the checkpoint:", sorted(p.name for p in ckpt.iterdir()))
print("fsynced:", [str(Path(p).relative_to(root)) for p in synced])
folders = {str(ckpt), str(root)}
dir_synced = [p for p in synced if p in folders]
if dir_synced or whole_sync:
    print("a folder was made durable:", dir_synced or "os.sync()")
    sys.exit(0)
print(f"never fsynced: {ckpt.name}/ (holds the rename to .metadata) and its parent (holds the mkdir of "
      f"{ckpt.name}): a power cut may leave no checkpoint though every file was fsynced")
sys.exit(1)
