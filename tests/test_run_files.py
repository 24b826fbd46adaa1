"""The run folder's file names are declared once (ckpt_chaos/probe/run_files.py), each with who writes
it and who reads it; no other module of the harness spells one out as a literal (reads the source
with ``ast``: nothing runs)."""

from __future__ import annotations

import ast
from pathlib import Path

from ckpt_chaos.probe import run_files

ROOT = Path(__file__).resolve().parent.parent
NAMES = {name: value for name, value in vars(run_files).items() if name.isupper() and isinstance(value, str)}
# the automatic probe layer writes a [command] trainer's trajectory and exit event itself; it is
# imported into a trainer nobody here wrote, and names its files where it writes them
OWN_WRITERS = {"ckpt_chaos/probe/auto_recorder.py"}


def _string_literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def test_each_name_says_who_writes_it_and_who_reads_it():
    source = (ROOT / "ckpt_chaos/probe/run_files.py").read_text()
    tree = ast.parse(source)
    body = tree.body
    documented = {a.targets[0].id for a, d in zip(body, body[1:]) if isinstance(a, ast.Assign)
                  and isinstance(d, ast.Expr) and isinstance(d.value, ast.Constant)}
    assert set(NAMES) == documented
    assert len(set(NAMES.values())) == len(NAMES)


def test_no_module_spells_out_a_run_folder_file_name():
    files = set(NAMES.values())
    found = [f"{path.relative_to(ROOT)}:{line}: {value!r}"
             for path in sorted((ROOT / "ckpt_chaos").rglob("*.py"))
             if path.relative_to(ROOT).as_posix() not in OWN_WRITERS | {"ckpt_chaos/probe/run_files.py"}
             for line, value in _string_literals(path) if value in files]
    assert found == []
