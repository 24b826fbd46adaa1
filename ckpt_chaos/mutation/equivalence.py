"""Which mutants cannot change behaviour, and are left out of the score with their reason: those marked
by hand in ``benchmarks/mutation-equivalent.toml``, and those that change only an annotation that
the module never evaluates."""

from __future__ import annotations

import ast
import difflib
import tomllib
from functools import cache
from pathlib import Path

from ckpt_chaos.mutation import ROOT, MutationError
from ckpt_chaos.mutation.scope import TARGETS, example_files

EQUIVALENT = ROOT / "benchmarks" / "mutation-equivalent.toml"
EQUIVALENT_KEYS = {"file", "operator", "original", "mutant", "line", "reason"}


def load_equivalent(path: Path = EQUIVALENT) -> list[dict]:
    """The hand-kept list: ``[[equivalent]]`` tables with file, operator, original and mutant (the
    changed line before and after, as in the diff, spaces at the ends ignored), optional line, and
    the reason."""
    if not path.exists():
        return []
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise MutationError(f"{path}: not valid TOML ({e}); fix the file") from None
    entries = data.get("equivalent", [])
    extra = set(data) - {"equivalent"}
    if extra:
        raise MutationError(f"{path}: unknown table {sorted(extra)[0]!r}; each mutant is an [[equivalent]] table")
    mutable = [*TARGETS, *example_files()]
    for i, e in enumerate(entries, 1):
        where = f"{path}: [[equivalent]] #{i}"
        if unknown := set(e) - EQUIVALENT_KEYS:
            raise MutationError(f"{where}: unknown key {sorted(unknown)[0]!r}; keys: {', '.join(sorted(EQUIVALENT_KEYS))}")
        for key in ("file", "operator", "original", "mutant", "reason"):
            if key not in e or not (str(e[key]).strip() or key == "mutant"):  # a removal leaves no line
                raise MutationError(f"{where}: no {key!r}; copy file, operator and the diff's - and + lines from "
                                    "mutation.json, and say why the mutant cannot change behaviour")
        # one list for every run: an entry for an example's trainer must not stop a run of the
        # reference trainer, nor the other way round
        if e["file"] not in mutable:
            raise MutationError(f"{where}: file {e['file']!r} is not mutated; one of {', '.join(mutable)}")
    return entries


def changed_lines(diff: str) -> tuple[str, str]:
    """The removed and the added lines of a one-mutant diff, each joined and stripped."""
    lines = diff.splitlines()
    old = [l[1:].strip() for l in lines if l.startswith("-") and not l.startswith("---") and l[1:].strip()]
    new = [l[1:].strip() for l in lines if l.startswith("+") and not l.startswith("+++") and l[1:].strip()]
    return " ".join(old), " ".join(new)


def text_change(old: str, new: str) -> tuple[str, str]:
    """The removed and the added lines between two texts, read off their diff as a mutant's are."""
    return changed_lines("\n".join(difflib.unified_diff(old.split("\n"), new.split("\n"), lineterm="")))


ANNOTATION_REASON = ("in a function's annotation, which `from __future__ import annotations` keeps as a string "
                     "that nothing evaluates (found by the driver, not kept in the list)")


def annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Where the annotations of a module's functions (arguments, return, local variables) lie, when
    the module never evaluates them: PEP 563 makes them strings. A class's field annotations are
    left out (a dataclass's field types are read, as strings, by whoever parses a config)."""
    tree = ast.parse(source)
    if not any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and any(a.name == "annotations" for a in n.names)
               for n in tree.body):
        return []
    nodes = []
    for f in ast.walk(tree):
        if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = f.args
        nodes += [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
                  if x is not None and x.annotation is not None]
        nodes += [f.returns] if f.returns is not None else []
        nodes += [n.annotation for n in ast.walk(f) if isinstance(n, ast.AnnAssign)]
    return [((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)) for n in nodes]


@cache
def _file_annotation_spans(path: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    return annotation_spans(path.read_text())  # once per file: every mutant of it asks


def in_annotation(m: dict, pristine: Path = ROOT) -> bool:
    """Whether the mutant changes nothing but an annotation that is never evaluated."""
    if "start" not in m:
        return False
    spans = _file_annotation_spans(pristine / m["file"])
    return any(lo <= tuple(m["start"]) and tuple(m["end"]) <= hi for lo, hi in spans)


def _bare(line: str) -> str:
    return "".join(line.split())


def equivalent_reason(entries: list[dict], m: dict) -> str | None:
    if in_annotation(m):
        return ANNOTATION_REASON
    # compared without whitespace: the mutating library's spacing ("( 9 << 20", "8 <<  21") is not
    # what anyone copying a line by hand would write, and an entry that never matches runs its mutant
    old, new = (_bare(x) for x in changed_lines(m["diff"]))
    for e in entries:
        if (e["file"] == m["file"] and e["operator"] == m["operator"] and _bare(e["original"]) == old
                and _bare(e["mutant"]) == new and e.get("line", m["line"]) == m["line"]):
            return e["reason"].strip()
    return None
