"""The ``ckpt-chaos`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def cmd_ckpts(args: argparse.Namespace) -> int:
    """List the checkpoints of a run directory (or a checkpoint directory) and whether each validates."""
    from reference_trainer.checkpoint import LATEST, describe

    root = Path(args.dir)
    if (root / "checkpoints").is_dir():
        root = root / "checkpoints"
    if not root.is_dir():
        print(f"ckpt-chaos: {root} is not a directory", file=sys.stderr)
        return 2
    rows = describe(root, verify_checksums=not args.fast)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    latest = (root / LATEST).read_text().strip() if (root / LATEST).exists() else None
    if not rows:
        print(f"{root}: no checkpoints")
    for r in rows:
        mark = "*" if r["name"] == latest else " "
        if r["valid"]:
            print(f"{mark} {r['name']:<20} valid   world {r['world_size']}  tokens {r['tokens_seen']:>9}  "
                  f"{r['bytes'] / 1e6:8.2f} MB  loss {r['loss']}")
        else:
            print(f"{mark} {r['name']:<20} INVALID {r['reason']}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ckpt-chaos",
        description="Fault-injection and resilience tests for distributed-training checkpoint/resume.")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("ckpts", help="list a run's checkpoints and validate each (manifest, sizes, checksums)")
    c.add_argument("dir", help="a run directory or its checkpoints/ directory")
    c.add_argument("--fast", action="store_true", help="skip SHA-256 verification")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(func=cmd_ckpts)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
