"""A checkpoint's name, for any trainer: the entry in the checkpoint folder a file belongs to
(``checkpoints/step_8`` for every file in that folder, ``checkpoints/step_8.pt`` for a file), and
the step the name records."""

from __future__ import annotations

import re

# a step in a checkpoint's name: step_8, global_step8, epoch=0-step=8, iter_0000008, HF's checkpoint-8
# (not Accelerate's checkpoint_N, which counts saves)
STEP_IN_NAME = re.compile(r"(?:step|iter)[_=-]?(\d+)|checkpoint-(\d+)", re.IGNORECASE)


def within(path: str, entry: str) -> bool:
    """``path`` is the checkpoint entry ``entry`` or a file in it."""
    return path == entry or path.startswith(entry.rstrip("/") + "/")


def step_in_name(checkpoint: str) -> int | None:
    """The step a checkpoint's name records (the last one it names), or None."""
    found = list(STEP_IN_NAME.finditer(checkpoint.rsplit("/", 1)[-1]))
    return int(found[-1].group(1) or found[-1].group(2)) if found else None
