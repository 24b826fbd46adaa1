"""Mutation score of the reference trainer's checkpoint path under the scenario suite (`make mutation`),
or of an example trainer's own code under that example's scenarios (``--example NAME``).

cosmic-ray makes the mutants (``cosmic-ray init``) and applies each to a file on disk, then runs a
test command (``cosmic-ray exec``); this script is the layer around it:

1. The oracle stays pristine. The mutants are applied to a copy of the repository's tracked files
   (``WORK/tree``), and the scenarios run with that copy as their current directory under
   ``PYTHONSAFEPATH=1``: the harness (its checks, ``ckpt_chaos.probe.layout``'s validation) imports
   the installed, unmutated ckpt-chaos, while the trainer's ranks import the copy, which
   ``worker_pythonpath`` puts first on their path. A mutant's scenarios may run side by side
   (``--jobs``) or as Slurm jobs (``--executor slurm``): the harness's workers import the harness
   their parent runs (``harness_pythonpath``), the ranks under them the copy.
2. Golden runs come from the unmutated trainer: ``$CKPT_CHAOS_GOLDEN_TREE`` keys them by this
   repository's code (``config.golden_tree``), and a mutant never makes one.
3. A mutant runs only the baseline's scenarios whose coverage reaches its line, cheapest first,
   and stops at the first that fails (``ckpt-chaos run -x``); a scenario that killed the same change
   of the same file in the last results of these operators runs first (``killers``), so a kill is
   confirmed in one scenario instead of found again down the list. The coverage comes from one
   ``ckpt-chaos run --coverage`` of the pristine tree (``--coverage-from``, or made here), which
   is also the baseline: a scenario that does not pass there is never used against a mutant. A
   mutant on a line no scenario reaches survives without a run ("not reached").
4. A mutant is killed only by the harness's verdict: a scenario that fails, a hang included (each
   scenario's ``expect.deadline_s`` fails it). The per-mutant timeout below (the selected
   scenarios' deadlines, plus slack) only catches a harness that stops answering; such a mutant is
   "timed out" and counts as not killed. cosmic-ray's own ``timeout`` lies beyond it.
5. Which operators: cosmic-ray's own (``--operators core``, the default), the checkpoint operators
   of ``ckpt_chaos/mutation_operators.py`` (``--operators checkpoint``: a dropped fsync, a rename
   published before its write, a state entry dropped, ...), or both. cosmic-ray makes every
   registered operator's mutants; those of the other operators are left out like mutants out of
   scope. A run of other operators keeps its own results (``mutation-<operators>.json``) and work
   folder.
6. A mutant's verdict (killed or survived) is cached under the hash of its mutated file, its
   operator and everything else that could change the verdict (the other trainer and harness
   sources, the scenarios, the coverage baseline): a later run takes it from the cache instead of
   running it again, until one of those changes (``--no-cache`` runs every mutant).
7. Mutants marked equivalent by hand in ``benchmarks/mutation-equivalent.toml``, and those that change
   only a function's annotation in a module that never evaluates it (``from __future__ import
   annotations``), are left out of the score and listed with their reason.
8. ``--example NAME`` scores ``examples/NAME/train.py`` instead, the whole file (an example writes its
   checkpoint code inline in its training loop, so no list of functions could say honestly which
   lines are its checkpoint path), against every scenario of ``examples/NAME/scenarios`` whatever
   its suites: the baseline is ``ckpt-chaos run --coverage --suite full --scenarios`` of that folder
   and each mutant runs its scenarios from there. Their ``[command]`` argv names the script relative
   to the current directory, so the mutant in the copy is what runs, and ``$CKPT_CHAOS_GOLDEN_TREE``
   keys their golden runs by the pristine script. Its results and work folder are
   ``mutation-<operators>-<NAME>``, and the cache's fingerprint covers the example's folder.

Writes ``benchmarks/results/mutation.json`` and (``report.py --tables``) ``mutation.md``: the score
(killed / (total - equivalent)) per file, each killed mutant's scenario and failing checks, each
surviving mutant's diff. docs/mutation.md says how to run and read it.

    python benchmarks/mutation.py --files reference_trainer/checkpoint.py --limit 40
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import json
import os
import platform
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
import tomllib
from functools import cache
from typing import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# This script judges with the harness of its own checkout ...
sys.path.insert(0, str(ROOT))
# ... and so does every ckpt-chaos it starts: in a worktree of another commit (a run resumed where
# it began) the installed entry point would import the editable install's harness instead.
os.environ["PYTHONPATH"] = os.pathsep.join(
    dict.fromkeys([str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))

from ckpt_chaos.report.trainer_coverage import CHECKPOINT_PATH  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
EQUIVALENT = ROOT / "benchmarks" / "mutation-equivalent.toml"
WORK = ROOT / "build" / "mutation"
OUTCOME = "MUTATION-OUTCOME "  # the test command's last stdout line, kept by cosmic-ray as its output

# What is mutated: the checkpoint path whose coverage `run --coverage` reports; in the loop, of
# Trainer.run only the statements that name the checkpoint, its cadence or a stop (``_run_statement``).
TARGETS = CHECKPOINT_PATH
CADENCE_NAMES = {"resume", "save", "save_and_exit", "ckpt", "ckpt_every_steps", "ckpt_every_seconds",
                 "last_time_save", "time_due", "cadence", "stop_here", "stop_after_microbatches"}
CTL_FLAGS = {1, 2, 3}  # the loop's all-reduced flags: SIGTERM, stop here, time cadence due

# Why a work item is not counted, written as its (skipped) result's output.
OUT_OF_SCOPE, NOT_SAMPLED, EQUIVALENT_MARK, NOT_REACHED = ("out of scope", "not sampled", "equivalent: ",
                                                          "not reached")
SLACK_S = 60  # per scenario, over its deadline: start-up, golden look-up, report
EQUIVALENT_KEYS = {"file", "operator", "original", "mutant", "line", "reason"}
# --operators: which providers' mutants a run makes (cosmic-ray's own are ``core``)
OPERATOR_SETS = {"core": ("core",), "checkpoint": ("checkpoint",), "all": ("core", "checkpoint")}
CACHE = ROOT / "build" / "mutation-cache"
# What a cached verdict depends on besides the mutated file: the trainer's and the harness's code
# and the scenarios (a new check can kill a survivor).
FINGERPRINTED = ("reference_trainer", "ckpt_chaos")
EXAMPLES = "examples"  # --example NAME: examples/NAME/train.py under examples/NAME/scenarios


class MutationError(Exception):
    """Bad input or a missing tool; the message names the file, key or extra and the fix."""


def _needs() -> None:
    from ckpt_chaos.extras import missing_extra

    for extra in ("mutation", "coverage"):
        if why := missing_extra(extra):
            raise MutationError(f"make mutation {why}")


# ---- what a run mutates, and under which scenarios ---------------------------------------------------

def example_files(root: Path = ROOT) -> list[str]:
    """Every example trainer that ``--example`` can mutate: an ``examples/NAME/train.py`` with a
    ``scenarios`` folder beside it."""
    return sorted(p.relative_to(root).as_posix() for p in (root / EXAMPLES).glob("*/train.py")
                  if (p.parent / "scenarios").is_dir())


def target(example: str | None, root: Path = ROOT) -> dict:
    """What a run mutates (``targets``: file -> the functions in scope, None for the whole file), the
    scenario folder its baseline and mutants take (None: the built-in default suite) and the sources
    its cached verdicts depend on. The reference trainer's checkpoint path without ``example``;
    else the whole of that example's ``train.py``, under every scenario of its own folder."""
    if example is None:
        return {"targets": TARGETS, "scenarios": None, "fingerprinted": FINGERPRINTED}
    folder = f"{EXAMPLES}/{example}"
    if f"{folder}/train.py" not in example_files(root):
        known = ", ".join(Path(f).parent.name for f in example_files(root))
        raise MutationError(f"--example {example}: no {folder}/train.py with a scenarios folder beside it; "
                            f"one of {known}")
    return {"targets": {f"{folder}/train.py": None}, "scenarios": f"{folder}/scenarios",
            "fingerprinted": (*FINGERPRINTED, folder)}


# ---- which mutants count ---------------------------------------------------------------------------

def _functions(tree: ast.Module) -> dict[str, ast.AST]:
    """``Class.method`` and ``function`` -> node, one level of classes deep."""
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{node.name}.{sub.name}"] = sub
    return out


def _header(stmt: ast.stmt) -> tuple[list[ast.AST], int]:
    """What a statement computes itself (a compound one's test, iterable or context managers, not its
    body), and its last line."""
    body = getattr(stmt, "body", None)
    if not isinstance(body, list) or not body:
        return [stmt], stmt.end_lineno
    parts = []
    for f in ("test", "iter", "target", "items", "subject"):
        v = getattr(stmt, f, None)
        parts += v if isinstance(v, list) else [v] if v is not None else []
    return parts, body[0].lineno - 1


def _run_statement(stmt: ast.stmt) -> bool:
    """A statement of Trainer.run on the checkpoint path: it names the checkpoint, its cadence or a stop."""
    for n in (x for part in _header(stmt)[0] for x in ast.walk(part)):
        if isinstance(n, ast.Name) and n.id in CADENCE_NAMES or isinstance(n, ast.Attribute) and n.attr in CADENCE_NAMES:
            return True
        if (isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == "ctl"
                and isinstance(n.slice, ast.Constant) and n.slice.value in CTL_FLAGS):
            return True
    return False


def scope_lines(file: str, source: str, targets: dict = TARGETS) -> set[int] | None:
    """The lines of ``file`` whose mutants count; None: all of them."""
    wanted = targets[file]
    if wanted is None:
        return None
    funcs = _functions(ast.parse(source))
    lines: set[int] = set()
    for name in wanted:
        node = funcs.get(name)
        if node is None:
            raise MutationError(f"{file}: no function {name}; update CHECKPOINT_PATH in ckpt_chaos/report/trainer_coverage.py")
        if name != "Trainer.run":
            lines.update(range(node.lineno, node.end_lineno + 1))
            continue
        for stmt in ast.walk(node):
            if isinstance(stmt, ast.stmt) and stmt is not node and _run_statement(stmt):
                lines.update(range(stmt.lineno, _header(stmt)[1] + 1))
    return lines


def statement_line(source: str, line: int) -> int:
    """The first line of the innermost statement that holds ``line``: where coverage.py records it."""
    best = line
    start = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt) and node.lineno <= line <= node.end_lineno and node.lineno >= start:
            best, start = node.lineno, node.lineno
    return best


# ---- the baseline: coverage and walls of the pristine tree ------------------------------------------

def baseline(suite_dir: Path, targets: dict = TARGETS) -> dict:
    """From a ``ckpt-chaos run --coverage`` of the default suite (an example's folder with
    ``--example``): per target file, line -> the passing scenarios that reach it (lines as strings, as
    JSON keeps them); each scenario's wall; the golden folder its runs used. Only ``pass`` counts:
    an ``xfail`` (a known failure that showed, e.g. an example's expected refusal) fails some check
    on the pristine tree already, so it would kill every mutant it met."""
    results = suite_dir / "results.json"
    cov = suite_dir / "coverage" / "coverage.json"
    for need in (results, cov):
        if not need.is_file():
            raise MutationError(f"--coverage-from {suite_dir}: no {need.relative_to(suite_dir)}; give the folder of "
                                "a `ckpt-chaos run --coverage` of the default suite (reports/default/latest), "
                                "or leave --coverage-from out to make one")
    rows = json.loads(results.read_text())["results"]
    passing = {r["scenario"]: r["wall_s"] for r in rows if r["verdict"] == "pass"}
    golden = {(Path(r["run_dir"]) / "golden").resolve().parent for r in rows
              if r["verdict"] == "pass" and (Path(r["run_dir"]) / "golden").exists()}
    reached: dict[str, dict[str, list[str]]] = {}
    for path, f in json.loads(cov.read_text())["files"].items():
        file = next((t for t in targets if path.endswith(t)), None)
        if file is None:
            continue
        if "contexts" not in f:
            raise MutationError(f"{cov}: no per-line contexts; make it with `ckpt-chaos run --coverage` "
                                "(it writes show_contexts)")
        reached[file] = {line: sorted(c for c in ctx if c in passing) for line, ctx in f["contexts"].items()}
    return {"walls": passing, "reached": reached, "golden": sorted(map(str, golden)),
            "not_passing": sorted(r["scenario"] for r in rows if r["verdict"] != "pass")}


def select(base: dict, file: str, lines: list[int]) -> list[str]:
    """The scenarios that reach any of ``lines`` (statement lines) of ``file``, cheapest first."""
    names = {n for line in lines for n in base["reached"].get(file, {}).get(str(line), [])}
    return sorted(names, key=lambda n: (base["walls"][n], n))


def _deadlines(scenarios: str | None = None) -> dict[str, float]:
    from ckpt_chaos import config
    from ckpt_chaos.scenario import load

    out = {}
    dirs = [*([ROOT / scenarios] if scenarios else []), *config.project_config().scenario_dirs(),
            config.builtin_scenarios()]
    for d in dirs:
        for path in sorted(Path(d).rglob("*.toml")):
            s = load(path)
            out.setdefault(s.name, s.expect.deadline_s)
    return out


def baseline_scenarios() -> list[str]:
    """The reference trainer's baseline: the built-in ``default`` suite and the ``mutation`` one,
    whose scenarios aim a fault at one durability step of the checkpoint path (a failed fsync, a
    power cut after the commit's rename): a dropped fsync shows only there."""
    from ckpt_chaos import config
    from ckpt_chaos.scenario import load

    names = {s.name for path in sorted(config.builtin_scenarios().rglob("*.toml"))
             if {"default", "mutation"} & set((s := load(path)).suites)}
    return sorted(names)


def make_baseline(work: Path, golden: Path, scenarios: str | None = None) -> Path:
    """One ``ckpt-chaos run --coverage`` of ``baseline_scenarios()`` (of every scenario in the folder
    ``scenarios``, whatever its suites: ``full`` holds them all) from this (pristine) repository; it
    also makes the golden runs the mutants will use."""
    cmd = [_tool("ckpt-chaos"), "run", "--coverage", "--plots", "none", "--golden-dir", str(golden),
           "--reports", str(work / "baseline")]
    cmd += baseline_scenarios() if scenarios is None else ["--suite", "full", "--scenarios", str(ROOT / scenarios)]
    print(f"baseline: {shlex.join(cmd)}", flush=True)
    subprocess.run(cmd, cwd=ROOT, env={k: v for k, v in os.environ.items() if k != "CKPT_CHAOS_GOLDEN_TREE"})
    return work / "baseline" / ("custom" if scenarios is None else "full") / "latest"


def _tool(name: str) -> str:
    """A console script of this interpreter's environment (``ckpt-chaos``, ``cosmic-ray``)."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name) or name


# ---- equivalent mutants -------------------------------------------------------------------------------

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


def _change(old: str, new: str) -> tuple[str, str]:
    """The removed and the added lines between two texts, read off their diff as a mutant's are."""
    return changed_lines("\n".join(difflib.unified_diff(old.split("\n"), new.split("\n"), lineterm="")))


def killers(results: Path) -> list[list[str]]:
    """[file, removed, added, scenario] of each mutant the last results at ``results`` say was killed:
    the scenario to try first on the same change (line numbers move; the change's text does not).
    Only an order: the kill is run again and must fail again to count."""
    if not results.is_file():
        return []
    try:
        mutants = json.loads(results.read_text()).get("mutants", [])
    except (OSError, ValueError):
        return []
    return [[m["file"], *changed_lines(m["diff"]), m["scenario"]] for m in mutants
            if m.get("status") == "killed" and m.get("scenario") and m.get("diff")]


def killer_first(names: list[str], known: list[list[str]], file: str, change: tuple[str, str]) -> list[str]:
    """``names`` with the scenario that last killed this change of ``file`` first, if it is among them."""
    first = next((k[3] for k in known if k[0] == file and tuple(k[1:3]) == change), None)
    return [first] + [n for n in names if n != first] if first in names else names


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


# ---- the mutants ------------------------------------------------------------------------------------

def mutant(item, pristine: Path = ROOT) -> dict:
    """A work item as the report shows it: file, line, operator, occurrence, unified diff."""
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator

    spec = item.mutations[0]
    file = spec.module_path.as_posix()
    code = (pristine / file).read_text()
    mutated = mutate_code(code, get_operator(spec.operator_name)(**(spec.operator_args or {})), spec.occurrence)
    diff = "" if mutated is None else "\n".join(difflib.unified_diff(
        code.split("\n"), mutated.split("\n"), f"a/{file}", f"b/{file}", n=1, lineterm=""))
    return {"job": item.job_id, "file": file, "line": spec.start_pos[0], "operator": spec.operator_name,
            "occurrence": spec.occurrence, "diff": diff, "start": list(spec.start_pos), "end": list(spec.end_pos),
            "mutated_sha": hashlib.sha256((mutated or "").encode()).hexdigest()}


def _provider(operator_name: str) -> str:
    return operator_name.partition("/")[0]


# ---- the cache of verdicts ---------------------------------------------------------------------------

def fingerprint(base: dict, files: list[str], pristine: Path = ROOT,
                fingerprinted: tuple[str, ...] = FINGERPRINTED) -> str:
    """What else a mutant's verdict depends on: the tracked sources of the trainer and the harness
    (every target file's pristine text among them; an example's folder, its scenarios with it, with
    ``--example``) and the scenarios that reach each target line."""
    h = hashlib.sha256()
    listed = subprocess.run(["git", "ls-files", "-z", *fingerprinted], cwd=pristine, capture_output=True)
    for name in sorted(filter(None, listed.stdout.decode().split("\0"))):
        path = pristine / name
        if path.is_file() and name.endswith((".py", ".toml")):
            h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    for f in sorted(files):
        h.update(json.dumps([f, base["reached"].get(f, {})], sort_keys=True).encode())
    return h.hexdigest()


def cache_key(m: dict, print_: str) -> str:
    """A verdict's key: the mutated file's hash, the operator, and the fingerprint of the rest."""
    return hashlib.sha256("\0".join((m["file"], m["operator"], m["mutated_sha"], print_)).encode()).hexdigest()


def cached(cache: Path | None, m: dict, print_: str) -> dict | None:
    if cache is None:
        return None
    path = cache / f"{cache_key(m, print_)}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def remember(cache: Path | None, mutants: list[dict], print_: str) -> int:
    """Keep the verdict of each mutant run here (killed or survived: a timeout or an error says
    nothing about the mutant); returns how many were new."""
    if cache is None:
        return 0
    cache.mkdir(parents=True, exist_ok=True)
    new = 0
    for m in mutants:
        status = m.get("run_status", m["status"])
        if status not in ("killed", "survived") or m.get("cached") or "wall_s" not in m:
            continue
        path = cache / f"{cache_key(m, print_)}.json"
        if not path.exists():
            keep = {k: m[k] for k in ("status", "scenario", "checks", "detail", "lines", "planned", "ran", "wall_s",
                                      "exit") if k in m}
            keep["status"] = status
            path.write_text(json.dumps({**keep, "file": m["file"], "operator": m["operator"], "diff": m["diff"]}))
            new += 1
    return new


def _wanted(spec, only: list[str]) -> bool:
    """``--mutant FILE:LINE[:OPERATOR[:OCCURRENCE]]``: whether the mutation is one of those named."""
    here = [spec.module_path.as_posix(), str(spec.start_pos[0]), spec.operator_name, str(spec.occurrence)]
    return any(here[:len(parts)] == parts for parts in (o.split(":") for o in only))


def annotate(session: Path, base: dict, files: list[str], limit: int | None, seed: int,
             equivalent: list[dict], only: list[str] | None = None, operators: str = "core",
             cache: Path | None = None, print_: str = "", targets: dict = TARGETS) -> dict[str, int]:
    """Before ``exec``: mark as done (cosmic-ray's SKIPPED, as its filters do) the mutants out of the
    checkpoint path, out of the sample (or not named with ``only``) or equivalent. What is left
    pending is what ``exec`` runs, in random order. A mutant on a line no scenario reaches is
    counted here but left pending too: its test command answers "not reached" at once, and a run cut
    short by ``--budget`` then leaves a random share of every kind pending, not of the others only,
    which would weigh those not reached more than the rest. Mutants of operators not in
    ``operators`` are out of scope; one whose verdict is in ``cache`` gets it from there."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    def done(db, job, output):
        db.set_result(job, WorkResult(output=output, worker_outcome=WorkerOutcome.SKIPPED))

    providers = OPERATOR_SETS[operators]
    counts = dict.fromkeys(("out of scope", "not sampled", "equivalent", "not reached", "to run", "cached"), 0)
    with use_db(str(session), WorkDB.Mode.open) as db:
        items = sorted(db.pending_work_items, key=lambda i: (i.mutations[0].module_path.as_posix(),
                                                              i.mutations[0].start_pos, i.mutations[0].operator_name,
                                                              i.mutations[0].occurrence))
        sources = {f: (ROOT / f).read_text() for f in files}
        scopes = {f: scope_lines(f, sources[f], targets) for f in files}
        inside = []
        for item in items:
            spec = item.mutations[0]
            scope = scopes[spec.module_path.as_posix()]
            if (scope is not None and spec.start_pos[0] not in scope or only and not _wanted(spec, only)
                    or _provider(spec.operator_name) not in providers):
                done(db, item.job_id, OUT_OF_SCOPE)
                counts["out of scope"] += 1
            else:
                inside.append(item)
        chosen = inside
        if limit is not None and limit < len(inside):
            keep = set(random.Random(seed).sample(range(len(inside)), limit))
            chosen = [it for i, it in enumerate(inside) if i in keep]
            for i, it in enumerate(inside):
                if i not in keep:
                    done(db, it.job_id, NOT_SAMPLED)
                    counts["not sampled"] += 1
        for item in chosen:
            m = mutant(item)
            if (reason := equivalent_reason(equivalent, m)) is not None:
                done(db, item.job_id, EQUIVALENT_MARK + reason)
                counts["equivalent"] += 1
            elif not select(base, m["file"], [statement_line(sources[m["file"]], m["line"])]):
                counts["not reached"] += 1
            elif (hit := cached(cache, m, print_)) is not None:
                db.set_result(item.job_id, WorkResult(
                    output=OUTCOME + json.dumps({**hit, "cached": True}), worker_outcome=WorkerOutcome.NORMAL,
                    test_outcome=TestOutcome.KILLED if hit["status"] == "killed" else TestOutcome.SURVIVED))
                counts["cached"] += 1
            else:
                counts["to run"] += 1
    return counts


# ---- the test command: one mutant against its scenarios -----------------------------------------------

def _mutated_lines(state: dict) -> tuple[str, list[int]] | None:
    """The file the mutant changed (in the current directory, against the pristine tree) and the
    statement lines of the pristine file it touches."""
    for file in state["files"]:
        old = (Path(state["pristine"]) / file).read_text()
        new = Path(file).read_text()
        if old == new:
            continue
        touched = set()
        for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, old.split("\n"), new.split("\n")).get_opcodes():
            if tag != "equal":
                touched.update(range(i1 + 1, max(i2, i1 + 1) + 1))
        return file, sorted({statement_line(old, line) for line in touched})
    return None


def run_mutant(state: dict) -> dict:
    """Run the scenarios that reach the mutated lines, cheapest first, to the first failure."""
    found = _mutated_lines(state)
    if found is None:
        return {"status": "error", "detail": "no target file differs from the pristine tree"}
    file, lines = found
    names = select(state["base"], file, lines)
    if not names:
        return {"status": "survived", "detail": NOT_REACHED, "lines": lines}
    names = killer_first(names, state.get("killers", []), file,
                         _change((Path(state["pristine"]) / file).read_text(), Path(file).read_text()))
    reports = Path(state["work"]) / "runs"
    timeout = sum(state["deadlines"].get(n, 300.0) + SLACK_S for n in names)
    cmd = [_tool("ckpt-chaos"), "run", "-x", "--plots", "none", "--golden-dir", state["golden"],
           "--reports", str(reports), *state.get("run_args", []), *names]
    if state.get("scenarios"):  # an example's: named, they are found in its folder (the pristine one)
        cmd[2:2] = ["--scenarios", state["scenarios"]]
    env = {**os.environ, "PYTHONSAFEPATH": "1", "CKPT_CHAOS_GOLDEN_TREE": state.get("golden_tree") or state["pristine"]}
    started = time.monotonic()
    with open(Path(state["work"]) / "runs.log", "ab") as log:
        log.write(f"\n== {file}:{','.join(map(str, lines))}: {shlex.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.send_signal(signal.SIGTERM)  # the harness stops its jobs and writes what it has
            try:
                proc.wait(SLACK_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    out = {"lines": lines, "planned": names, "wall_s": round(time.monotonic() - started, 1), "exit": proc.returncode}
    suite = reports / "custom" / "latest"
    rows = json.loads((suite / "results.json").read_text())["results"] if (suite / "results.json").is_file() else []
    out["ran"] = [r["scenario"] for r in rows]
    failed = next((r for r in rows if r["verdict"] not in ("pass", "skipped", "xfail")), None)
    if failed is not None:
        bad = [c for c in failed["checks"] if c["verdict"] in ("fail", "unknown")]
        out.update(status="killed", scenario=failed["scenario"], checks=[c["name"] for c in bad],
                   detail=(bad[0]["detail"] if bad else failed.get("reason", ""))[:400])
    elif timed_out:
        out.update(status="timeout", detail=f"no verdict after {timeout:.0f}s")
    elif proc.returncode not in (0, None) or len(rows) < len(names):
        out.update(status="error", detail=f"ckpt-chaos run exited {proc.returncode} with {len(rows)} of "
                                          f"{len(names)} results; see {Path(state['work']) / 'runs.log'}")
    else:
        out["status"] = "survived"
    if suite.exists() and not state.get("keep_runs"):
        shutil.rmtree(suite.resolve(), ignore_errors=True)
        suite.unlink(missing_ok=True)
    return out


def run_args(args: argparse.Namespace) -> list[str]:
    """What each mutant's ``ckpt-chaos run`` is given besides its scenarios: how they run, not what."""
    out = ["-n", args.jobs] if args.jobs else []
    if args.executor:
        out += ["--executor", args.executor]
    for flag, value in (("--slurm-nodes", args.slurm_nodes), ("--slurm-conf", args.slurm_conf)):
        if value:
            out += [flag, value]
    return out


def cmd_test(args: argparse.Namespace) -> int:
    state = json.loads(Path(args.state).read_text())
    out = run_mutant(state)
    print(OUTCOME + json.dumps(out), flush=True)
    # cosmic-ray keeps the output to itself until the end; the driver shows this file as it grows
    where = f"{out.get('lines')}" if "lines" in out else ""
    with open(Path(state["work"]) / "mutants.log", "a") as log:
        log.write(f"{out['status']:<11} {out.get('wall_s', 0):5.0f}s  lines {where}  "
                  f"{out.get('scenario') or str(len(out.get('ran', []))) + ' scenario(s) passed'}\n")
    return 1 if out["status"] == "killed" else 0


# ---- the report -------------------------------------------------------------------------------------

def collect(session: Path, pristine: Path = ROOT, equivalent: list[dict] | None = None) -> list[dict]:
    """Every counted mutant of the session with its status: killed, survived, not reached,
    timeout, error, equivalent (or pending, when exec was cut short). A mutant marked equivalent
    since it ran is equivalent too, its run kept as ``run_status``."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome

    out = []
    with use_db(str(session), WorkDB.Mode.open) as db:
        done = {item.job_id: result for item, result in db.completed_work_items}
        for item in db.work_items:
            r = done.get(item.job_id)
            text = (r.output or "") if r is not None else ""
            if text in (OUT_OF_SCOPE, NOT_SAMPLED):
                continue
            m = mutant(item, pristine)
            if r is None:
                m["status"] = "pending"
            elif text.startswith(EQUIVALENT_MARK):
                m.update(status="equivalent", reason=text[len(EQUIVALENT_MARK):])
            elif text == NOT_REACHED:
                m["status"] = "not reached"
            elif r.worker_outcome != WorkerOutcome.NORMAL:
                m.update(status="error", detail=text[-400:])
            elif OUTCOME in text:
                m.update(json.loads(text.rsplit(OUTCOME, 1)[1].strip()))
                if m.get("detail") == NOT_REACHED:
                    m["status"] = "not reached"
            else:  # cosmic-ray's own timeout: the harness gave no verdict
                m.update(status="timeout" if text == "timeout" else "error", detail=text[-400:])
            if m["status"] != "equivalent" and (reason := equivalent_reason(equivalent or [], m)) is not None:
                m.update(run_status=m["status"], status="equivalent", reason=reason)
            out.append(m)
    return sorted(out, key=lambda m: (m["file"], m["line"], m["operator"], m["occurrence"]))


STATUSES = ("killed", "survived", "not reached", "timeout", "error", "equivalent", "pending")


def wilson(killed: int, scored: int, z: float = 1.96) -> tuple[float, float] | None:
    """The 95 % Wilson score interval of a proportion: where the score of every mutant in scope
    lies, given a random sample's. It stays inside [0, 1] and is honest for small samples and
    scores near 1, where the normal approximation is neither."""
    if not scored:
        return None
    p, n = killed / scored, scored
    mid, half = p + z * z / (2 * n), z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return round(max(0.0, (mid - half) / (1 + z * z / n)), 4), round(min(1.0, (mid + half) / (1 + z * z / n)), 4)


def figures(mutants: list[dict], sampled: bool = False) -> dict:
    def count(ms):
        c = {s: sum(1 for m in ms if m["status"] == s) for s in STATUSES}
        c["total"] = len(ms)
        scored = c["total"] - c["equivalent"] - c["pending"]
        c["score"] = round(c["killed"] / scored, 4) if scored else None
        if sampled:
            c["score_ci95"] = wilson(c["killed"], scored)
        return c

    def median(status: str | None = None) -> float | None:
        walls = [m["wall_s"] for m in mutants if "wall_s" in m and not m.get("cached")
                 and status in (None, m.get("run_status", m["status"]))]
        return round(statistics.median(walls), 1) if walls else None

    operators = sorted({m.get("operator", "") for m in mutants})
    return {"totals": count(mutants),
            "files": {f: count([m for m in mutants if m["file"] == f]) for f in sorted({m["file"] for m in mutants})},
            "operators": {o: count([m for m in mutants if m.get("operator", "") == o]) for o in operators},
            # a killed mutant stops at its first failure; a survivor runs every scenario that reaches it
            "median_mutant_s": median(), "median_killed_s": median("killed"), "median_survived_s": median("survived"),
            "mutants_run": sum(1 for m in mutants if "wall_s" in m and not m.get("cached")),
            "mutants_cached": sum(1 for m in mutants if m.get("cached"))}


def _sampled(mutants: list[dict], extra: dict) -> bool:
    """Whether the scored mutants are a random sample of those in scope: drawn with ``--limit``, or
    cut short by ``--budget`` (cosmic-ray runs the pending mutants in random order)."""
    return bool(extra.get("sample", {}).get("limit")) or any(m["status"] == "pending" for m in mutants)


def results_name(operators: str, example: str | None = None) -> str:
    """``mutation`` for cosmic-ray's operators (the figures docs/mutation.md has always quoted),
    ``mutation-<operators>`` for the others, ``mutation-<operators>-<example>`` for an example's
    trainer, so that one run never overwrites another's. Also the name of the run's work folder."""
    if example is not None:
        return f"mutation-{operators}-{example}"
    return "mutation" if operators == "core" else f"mutation-{operators}"


def write_results(mutants: list[dict], command: str, extra: dict, results: Path = RESULTS) -> Path:
    """``mutation.json`` (``mutation-<operators>.json``) and, as ``report.py --tables`` does, its
    ``.md`` in ``results``."""
    from benchmarks import report

    data = {"command": command, "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            **extra, **figures(mutants, sampled=_sampled(mutants, extra)), "mutants": mutants}
    results.mkdir(parents=True, exist_ok=True)
    sample = extra.get("sample", {})
    out = results / f"{results_name(sample.get('operators', 'core'), sample.get('example'))}.json"
    out.write_text(json.dumps(data, indent=1) + "\n")
    report.write_tables(results)
    return out


# ---- the whole run ----------------------------------------------------------------------------------

def _copy_tree(dest: Path) -> None:
    """The repository's tracked files, as they are in the working tree, into ``dest``."""
    if dest.exists():
        shutil.rmtree(dest)
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if listed.returncode != 0:
        raise MutationError(f"{ROOT}: not a git checkout ({listed.stderr.decode().strip()}); the mutants go into a "
                            "copy of its tracked files: run from a clone")
    files = listed.stdout
    for name in filter(None, files.decode().split("\0")):
        src = ROOT / name
        if src.is_file() and not src.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _exec(cosmic: str, config: Path, session: Path, tree: Path, log: Path, budget: float | None,
          total: int) -> None:
    """``cosmic-ray exec`` in the copy (it writes each mutant there and runs the test command there),
    showing each outcome as it comes; stopped after ``budget`` seconds."""
    log.write_text("")
    started = time.monotonic()
    proc = subprocess.Popen([cosmic, "exec", str(config), str(session)], cwd=tree,
                            env={**os.environ, "PYTHONSAFEPATH": "1"})
    shown = 0
    try:
        while True:
            done = proc.poll() is not None
            lines = log.read_text().splitlines()
            for i, line in enumerate(lines[shown:], shown + 1):
                print(f"[{i}/{total}] {line}", flush=True)
            shown = len(lines)
            if done:
                break
            if budget is not None and time.monotonic() - started > budget:
                print(f"--budget {budget:.0f}s spent: the mutant running is stopped and left pending", flush=True)
                _stop_exec(proc)
                return
            time.sleep(5)
    except KeyboardInterrupt:
        _stop_exec(proc)
        raise
    if proc.returncode != 0:
        raise MutationError(f"cosmic-ray exec {config} {session} exited {proc.returncode}; its output is above")


def _interrupted(signum: int, frame) -> None:
    raise KeyboardInterrupt


def _stop_exec(proc: subprocess.Popen) -> None:
    """Stop ``cosmic-ray exec`` between results: cosmic-ray first, so that the mutant running gets no
    result (it stays pending), then its test command and the harness under it, which stop their
    jobs on SIGTERM, then whatever is left. Each result already recorded is in the session."""
    import psutil

    try:
        below = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        below = []
    proc.kill()
    proc.wait()
    for p in below:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(below, timeout=SLACK_S)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def report_only(args: argparse.Namespace) -> int:
    """The results again from the last run's session, e.g. after marking an equivalent mutant."""
    work = Path(args.work).resolve()
    if not (work / "run.json").is_file():
        raise MutationError(f"--report-only: no run in {work} (no run.json); run the mutants first, or give "
                            "the --work folder of one")
    run = json.loads((work / "run.json").read_text())
    return _report(work / "session.sqlite", run["command"], run["extra"], Path(args.results))


def resume(args: argparse.Namespace) -> int:
    """Go on with the last run's pending mutants (those a --budget cut off), in a fresh copy of the
    tree, and write the results of the whole run."""
    _needs()
    work = Path(args.work).resolve()
    for need in ("run.json", "state.json", "session.sqlite", "cosmic-ray.toml"):
        if not (work / need).is_file():
            raise MutationError(f"--resume: no {need} in {work}; start a run without --resume, or give the "
                                "--work folder of one")
    from cosmic_ray.work_db import WorkDB, use_db

    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    run = json.loads((work / "run.json").read_text())
    unchanged_since(work, run)
    moved(work)
    equivalent, pending = load_equivalent(), 0
    with use_db(str(work / "session.sqlite"), WorkDB.Mode.open) as db:
        for item in list(db.pending_work_items):  # marked equivalent since: not worth a run
            if (reason := equivalent_reason(equivalent, mutant(item))) is not None:
                db.set_result(item.job_id, WorkResult(output=EQUIVALENT_MARK + reason,
                                                      worker_outcome=WorkerOutcome.SKIPPED))
            else:
                pending += 1
    if args.jobs is not None or args.executor is not None:  # how the rest runs: the verdicts do not depend on it
        state = json.loads((work / "state.json").read_text())
        state["run_args"] = run_args(args)
        (work / "state.json").write_text(json.dumps(state))
    _copy_tree(work / "tree")  # a stopped exec may have left its mutant in the copy
    run["command"] += " && python benchmarks/mutation.py --resume" + (f" --budget {args.budget:g}" if args.budget else "")
    _timed_exec(work, run, lambda: _exec(_tool("cosmic-ray"), work / "cosmic-ray.toml", work / "session.sqlite",
                                         work / "tree", work / "mutants.log", args.budget, pending))
    return _report(work / "session.sqlite", run["command"], run["extra"], Path(args.results))


def moved(work: Path) -> None:
    """A run resumed from another checkout of the same code (a worktree of the commit it began at):
    its mutants are compared with, and their golden runs keyed by, this checkout, and cosmic-ray's
    test command is this script."""
    state = json.loads((work / "state.json").read_text())
    old = Path(state["pristine"])
    if old == ROOT:
        return
    state["pristine"] = str(ROOT)
    if state.get("scenarios"):
        state["scenarios"] = str(ROOT / Path(state["scenarios"]).relative_to(old))
    (work / "state.json").write_text(json.dumps(state))
    config = work / "cosmic-ray.toml"
    config.write_text(config.read_text().replace(str(old / "benchmarks" / "mutation.py"), str(Path(__file__).resolve())))


def _commit(fingerprinted: tuple[str, ...]) -> str | None:
    """The commit the checkout is at, where what the verdicts depend on (``fingerprinted``) is as committed."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *fingerprinted], cwd=ROOT, capture_output=True,
                           text=True)
    return head.stdout.strip() or None if head.returncode == 0 and not dirty.stdout.strip() else None


def unchanged_since(work: Path, run: dict) -> None:
    """A resumed run's verdicts must all be of one tree: the trainer, the harness and the scenarios
    (their fingerprint) as they were when the run began, or the pending mutants would run against
    other code and be cached under the old fingerprint."""
    began = (run["extra"].get("cache") or {}).get("fingerprint")
    if not began:
        return
    state = json.loads((work / "state.json").read_text())
    aim = target(run["extra"]["sample"].get("example"))
    if fingerprint(state["base"], state["files"], fingerprinted=aim["fingerprinted"]) != began:
        commit = run["extra"].get("commit")
        where = (f"go on in a worktree of the commit it began at: git worktree add ../at-{commit[:7]} {commit} && "
                 f"cd ../at-{commit[:7]} && python benchmarks/mutation.py {' '.join(run['extra'].get('flags', []))} "
                 f"--resume --work {work}" if commit else "check out the commit it began at to go on (git log)")
        raise MutationError(f"--resume: {', '.join(aim['fingerprinted'])} changed since the run in {work} began, so "
                            f"its pending mutants would run against other code than its verdicts so far; {where}; "
                            "or start a new run without --resume")


def _report(session: Path, command: str, extra: dict, results: Path) -> int:
    mutants = collect(session, equivalent=load_equivalent())
    cache = extra.get("cache") or {}
    remember(Path(cache["dir"]) if cache.get("dir") else None, mutants, cache.get("fingerprint", ""))
    path = write_results(mutants, command, results=results, extra=extra)
    f = figures(mutants, sampled=_sampled(mutants, extra))["totals"]
    ci = f" (95 % interval {f['score_ci95'][0]}-{f['score_ci95'][1]})" if f.get("score_ci95") else ""
    print(f"score {f['score']}{ci}: {f['killed']} killed of {f['total'] - f['equivalent'] - f['pending']} "
          f"({f['survived']} survived, {f['not reached']} not reached, {f['timeout']} timed out, "
          f"{f['error']} errors, {f['equivalent']} equivalent, {f['pending']} pending); {path}")
    for op, c in figures(mutants)["operators"].items():
        print(f"  {op}: {c['killed']} killed of {c['total'] - c['equivalent'] - c['pending']} ({c['survived']} survived, "
              f"{c['not reached']} not reached, {c['equivalent']} equivalent, {c['pending']} pending)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    _needs()
    from ckpt_chaos.config import golden_tree

    if golden_tree() is not None:
        raise MutationError("$CKPT_CHAOS_GOLDEN_TREE is set: unset it, this script sets it for the mutants")
    aim = target(args.example)
    targets = aim["targets"]
    files = args.files or list(targets)
    for f in files:
        if f not in targets:
            raise MutationError(f"--files {f}: not on the checkpoint path; one of {', '.join(targets)}")
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    golden = Path(args.golden_dir).resolve() if args.golden_dir else work / "golden"
    suite = Path(args.coverage_from) if args.coverage_from else make_baseline(work, golden, aim["scenarios"])
    base = baseline(suite, targets)
    if args.coverage_from:
        if len(base["golden"]) > 1 and not args.golden_dir:
            raise MutationError(f"--coverage-from {suite}: its scenarios used several golden folders "
                                f"({', '.join(base['golden'])}); name the one to use with --golden-dir")
        golden = Path(args.golden_dir).resolve() if args.golden_dir else Path(base["golden"][0])
    if not base["walls"]:
        raise MutationError(f"{suite}: no scenario passed on the pristine tree; fix the baseline first")
    if base["not_passing"]:
        print(f"not used against mutants (they do not pass on the pristine tree): {', '.join(base['not_passing'])}")
    tree = work / "tree"
    _copy_tree(tree)
    state = {"pristine": str(ROOT), "work": str(work), "files": files, "golden": str(golden), "base": base,
             "deadlines": _deadlines(aim["scenarios"]), "keep_runs": args.keep_runs,
             "scenarios": str(ROOT / aim["scenarios"]) if aim["scenarios"] else None,
             "golden_tree": str(Path(args.golden_tree).resolve()) if args.golden_tree else None,
             "run_args": run_args(args),
             "killers": killers(Path(args.results) / f"{results_name(args.operators, args.example)}.json")}
    (work / "state.json").write_text(json.dumps(state))
    # only a backstop: the test command stops the harness first (see run_mutant)
    backstop = sum(state["deadlines"].get(n, 300.0) + SLACK_S for n in base["walls"]) + 2 * SLACK_S
    test = f"{shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))} test --state {work / 'state.json'}"
    config = work / "cosmic-ray.toml"
    config.write_text("[cosmic-ray]\n" f"module-path = {json.dumps(files)}\n" f"timeout = {backstop:.0f}\n"
                      "excluded-modules = []\n" f"test-command = {json.dumps(test)}\n\n"
                      "[cosmic-ray.distributor]\nname = \"local\"\n")
    session = work / "session.sqlite"
    session.unlink(missing_ok=True)
    cosmic = _tool("cosmic-ray")
    subprocess.run([cosmic, "init", str(config), str(session)], cwd=tree, check=True)
    cache = None if args.no_cache else Path(args.cache).resolve()
    print_ = fingerprint(base, files, fingerprinted=aim["fingerprinted"])
    counts = annotate(session, base, files, args.limit, args.seed, load_equivalent(), args.mutant, args.operators,
                      cache, print_, targets)
    print("mutants: " + ", ".join(f"{v} {k}" for k, v in counts.items()), flush=True)
    command = "python benchmarks/mutation.py" + (" " + shlex.join(args.argv) if args.argv else "")
    sample = {"limit": args.limit, "seed": args.seed, "files": files, "named": args.mutant,
              "operators": args.operators, **counts,
              **({"example": args.example, "scenarios": aim["scenarios"]} if args.example else {})}
    flags = ["--operators", args.operators] + (["--example", args.example] if args.example else [])
    run = {"command": command, "extra": {"sample": sample, "exec_wall_s": 0.0, "baseline": str(suite),
                                         "commit": _commit(aim["fingerprinted"]), "flags": flags,
                                         "cache": {"dir": None if cache is None else str(cache),
                                                   "fingerprint": print_}}}
    _timed_exec(work, run, lambda: _exec(cosmic, config, session, tree, work / "mutants.log", args.budget,
                                         counts["to run"] + counts["not reached"]))
    return _report(session, command, run["extra"], Path(args.results))


def _timed_exec(work: Path, run: dict, exec_: Callable[[], None]) -> None:
    """Run ``exec_``, keeping ``run`` (command, sample, wall time) in ``WORK/run.json`` before and after
    it, also when Ctrl-C stops it: ``--resume`` then goes on with this run, not the one before."""
    (work / "run.json").write_text(json.dumps(run))
    started = time.monotonic()
    try:
        exec_()
    finally:
        run["extra"]["exec_wall_s"] = round(run["extra"]["exec_wall_s"] + time.monotonic() - started, 1)
        (work / "run.json").write_text(json.dumps(run))


def work_dir(operators: str, example: str | None = None) -> Path:
    """The default --work: build/mutation, build/mutation-OPERATORS, build/mutation-OPERATORS-EXAMPLE."""
    return WORK.with_name(results_name(operators, example))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    t = sub.add_parser("test", help="(cosmic-ray's test command) run the mutant now in the current directory")
    t.add_argument("--state", required=True)
    ap.add_argument("--files", nargs="+", metavar="FILE", help=f"files to mutate (default: {', '.join(TARGETS)}; "
                                                              "with --example, its train.py)")
    ap.add_argument("--example", metavar="NAME",
                    help="score examples/NAME/train.py (the whole file) under every scenario of "
                         "examples/NAME/scenarios instead of the reference trainer's checkpoint path; results "
                         "in mutation-OPERATORS-NAME.json, work in build/mutation-OPERATORS-NAME")
    ap.add_argument("--limit", type=int, help="a random sample of this many mutants (default: all)")
    ap.add_argument("--seed", type=int, default=0, help="the sample's seed (default: 0)")
    ap.add_argument("--coverage-from", metavar="DIR",
                    help="a `ckpt-chaos run --coverage` of the default suite from this tree, e.g. "
                         "reports/default/latest; with --example, of every scenario of its folder (--suite full "
                         "--scenarios examples/NAME/scenarios) (default: made first, about 10 minutes)")
    ap.add_argument("--golden-dir", metavar="DIR", help="the golden runs of the pristine tree (default: those the "
                                                        "coverage run used, or WORK/golden)")
    ap.add_argument("--operators", choices=sorted(OPERATOR_SETS), default="core",
                    help="cosmic-ray's own operators (core, the default), the checkpoint operators of "
                         "ckpt_chaos/mutation_operators.py (checkpoint), or both (all)")
    ap.add_argument("--golden-tree", metavar="DIR",
                    help="the tree whose trainer code keys the golden runs (default: this repository); for a "
                         "--coverage-from baseline made before the trainer changed in a way that leaves its "
                         "trajectory alone")
    ap.add_argument("--work", help=f"scratch folder (default: {WORK.relative_to(ROOT)}, "
                                   f"{WORK.relative_to(ROOT)}-OPERATORS for other operators)")
    ap.add_argument("--cache", default=str(CACHE), help="where verdicts are cached by the hash of the mutated file "
                                                        f"and operator (default: {CACHE.relative_to(ROOT)})")
    ap.add_argument("--no-cache", action="store_true", help="run every mutant, and cache nothing")
    ap.add_argument("--mutant", action="append", metavar="FILE:LINE[:OPERATOR[:OCCURRENCE]]",
                    help="only these mutants (repeatable), e.g. a survivor again after a new scenario: "
                         "reference_trainer/checkpoint.py:277:core/AddNot")
    ap.add_argument("--results", default=str(RESULTS), help="where mutation.json and mutation.md go "
                                                            f"(default: {RESULTS.relative_to(ROOT)})")
    ap.add_argument("--jobs", metavar="N", help="a mutant's scenarios side by side, as `ckpt-chaos run -n N` "
                                                "(auto: as the machine allows; default 1); -x still stops the "
                                                "rest at the first failure")
    ap.add_argument("--executor", choices=["local", "slurm"],
                    help="slurm: each scenario of a mutant as a Slurm job (`ckpt-chaos run --executor slurm`), "
                         "on a throwaway cluster on this host unless --slurm-conf names one")
    ap.add_argument("--slurm-nodes", metavar="N", help="the throwaway cluster's nodes (ckpt-chaos run's)")
    ap.add_argument("--slurm-conf", metavar="PATH", help="an existing cluster's slurm.conf (ckpt-chaos run's)")
    ap.add_argument("--budget", type=float, metavar="SECONDS",
                    help="stop running mutants after this long and report those done (default: no limit)")
    ap.add_argument("--resume", action="store_true",
                    help="go on with the last run in --work: its mutants still pending (cut by --budget)")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: write the results again from the last run in --work (after marking an "
                         "equivalent mutant)")
    ap.add_argument("--keep-runs", action="store_true", help="keep each mutant's scenario runs in WORK/runs")
    args = ap.parse_args(argv)
    args.argv = argv
    if args.work is None:
        args.work = str(work_dir(args.operators, args.example))
    try:
        if args.cmd == "test":
            return cmd_test(args)
        # A run started in the background ignores SIGINT: `kill PID` stops it as Ctrl-C does, the
        # mutant running left pending and every result so far kept for --resume.
        signal.signal(signal.SIGTERM, _interrupted)
        return report_only(args) if args.report_only else resume(args) if args.resume else cmd_run(args)
    except MutationError as e:
        print(f"mutation: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
