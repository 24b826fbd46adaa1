"""The modules of each package (``ckpt_chaos``, ``toxiproxy_server``, ``reference_trainer``) import one
another without a cycle, counting every import: at the
top of a module, inside a function, and under ``if TYPE_CHECKING:``. A cycle hidden in a function
or behind TYPE_CHECKING is still two modules that cannot be read, tested or moved one without the
other. The graph is read from the source with ``ast``: nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "ckpt_chaos"


def modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> its file, for every module of the package (a package by its __init__)."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imported(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> set[str]:
    """The modules of the package that one import statement of module ``name`` names."""
    def owner(dotted: str) -> str | None:
        # the innermost module of the package that ``dotted`` is or lies in
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    if isinstance(node, ast.Import):
        return {owner(a.name) for a in node.names} - {None}
    base = node.module or ""
    if node.level:
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for _ in range(node.level - 1):
            here = here.rpartition(".")[0]
        base = f"{here}.{base}" if base else here
    # ``from a.b import c`` imports module a.b.c where there is one, else the name c of module a.b
    return {f"{base}.{a.name}" if f"{base}.{a.name}" in known else owner(base) for a in node.names} - {None}


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports anywhere in its source."""
    known = modules(root, package)
    graph = {}
    for name, path in known.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _imported(name, path, node, known)
        graph[name] = edges - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph, as the modules along it with the first repeated at the end, or None."""
    done: set[str] = set()  # modules from which no cycle can be reached
    for start in sorted(graph):
        path, stack = [start], [iter(sorted(graph[start]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                done.add(path.pop())
                stack.pop()
            elif nxt in path:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in done and nxt in graph:
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


@pytest.mark.parametrize("package", ["ckpt_chaos", "toxiproxy_server", "reference_trainer"])
def test_the_import_graph_of_a_package_has_no_cycle(package):
    cycle = find_cycle(import_graph(ROOT, package))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_graph_sees_imports_in_functions_and_under_type_checking(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from . import c\n")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import X\n")
    (package / "b.py").write_text("def f():\n    from pkg.sub.c import Y\n")
    (package / "sub" / "c.py").write_text("import pkg.a\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.sub.c"}, "pkg.sub": {"pkg.sub.c"},
                     "pkg.sub.c": {"pkg.a"}}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]
    assert find_cycle({**graph, "pkg.sub.c": set()}) is None
