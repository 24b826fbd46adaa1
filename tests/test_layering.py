"""The boundaries the layout promises: a trainer shares only the probe with the harness, and the
harness reads checkpoints through the layout contract, never through the trainer's internals."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imports(package: str) -> dict[str, set[str]]:
    """Module file -> every absolute module name it imports (top level and inside functions)."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.update(f"{node.module}.{a.name}" for a in node.names)
        out[str(path.relative_to(ROOT))] = names
    return out


def test_the_reference_trainer_imports_only_the_probe_from_the_harness():
    bad = {f: sorted(n for n in names if n.startswith("ckpt_chaos") and not n.startswith("ckpt_chaos.probe"))
           for f, names in imports("reference_trainer").items()}
    assert not {f: n for f, n in bad.items() if n}


def test_the_harness_reads_checkpoints_through_the_layout_contract():
    # reference_trainer.config stays: a scenario's [trainer] table is validated against it
    bad = {f: sorted(n for n in names if n.startswith("reference_trainer") and not n.startswith("reference_trainer.config"))
           for f, names in imports("ckpt_chaos").items()}
    assert not {f: n for f, n in bad.items() if n}
