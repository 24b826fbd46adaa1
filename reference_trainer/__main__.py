"""Command line of the reference trainer: ``python -m reference_trainer`` (under torchrun or alone).

Every field of :class:`TrainConfig` is an option (``--max-steps 40``); ``--config FILE.toml``
reads a file first, options override it.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
from dataclasses import fields

from .config import ConfigError, TrainConfig, load_config


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m reference_trainer",
        description="FSDP2 reference trainer with complete checkpoint/resume. "
                    "Run under torchrun: torchrun --nproc_per_node 4 -m reference_trainer --run-dir runs/x")
    ap.add_argument("--config", help="TOML file with TrainConfig fields (flat, or under [trainer])")
    defaults = TrainConfig()
    for f in fields(TrainConfig):
        ap.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None, metavar=f.type.upper(),
                        help=f"default: {getattr(defaults, f.name)!r}")
    return ap


def config_from_args(argv: list[str] | None = None) -> TrainConfig:
    args = parser().parse_args(argv)
    overrides = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if getattr(args, f.name) is not None}
    return load_config(args.config, overrides)


def main(argv: list[str] | None = None) -> int:
    # A native crash (SIGSEGV, SIGABRT in torch or gloo) then leaves every thread's Python stack in
    # the log, so the post-mortem knows where the process was.
    faulthandler.enable()
    try:
        cfg = config_from_args(argv)
        from .train import train  # imported late: config errors should not wait for torch

        return train(cfg)
    except ConfigError as e:
        print(f"reference_trainer: config error: {e}", file=sys.stderr)
        return 2


def run_and_exit(argv: list[str] | None = None) -> None:
    """``main``, then leave without the interpreter's finalization (also for trainers built on this one).

    Gloo's C++ threads can abort a process that tears its process group down or finalizes after a
    successful run ("terminate called without an active exception", pytorch/pytorch#190489).
    Everything is written and flushed by now, and every rank is past the final barrier."""
    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run_and_exit()
