"""What a mutation run mutates and under which scenarios: the target files and the lines of them in
scope, and the baseline (one coverage run of the pristine tree) that says which passing scenarios
reach each line and what each costs."""

from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
from pathlib import Path

from ckpt_chaos.mutation import ROOT, MutationError, tool
from ckpt_chaos.report.trainer_coverage import CHECKPOINT_PATH

# What is mutated: the checkpoint path whose coverage `run --coverage` reports; in the loop, of
# Trainer.run only the statements that name the checkpoint, its cadence or a stop (``_run_statement``).
TARGETS = CHECKPOINT_PATH
CADENCE_NAMES = {"resume", "save", "save_and_exit", "ckpt", "ckpt_every_steps", "ckpt_every_seconds",
                 "last_time_save", "time_due", "cadence", "stop_here", "stop_after_microbatches"}
CTL_FLAGS = {1, 2, 3}  # the loop's all-reduced flags: SIGTERM, stop here, time cadence due
# --operators: which providers' mutants a run makes (cosmic-ray's own are ``core``)
OPERATOR_SETS = {"core": ("core",), "checkpoint": ("checkpoint",), "all": ("core", "checkpoint")}
# What a cached verdict depends on besides the mutated file: the trainer's and the harness's code
# and the scenarios (a new check can kill a survivor).
FINGERPRINTED = ("reference_trainer", "ckpt_chaos")
EXAMPLES = "examples"  # --example NAME: examples/NAME/train.py under examples/NAME/scenarios


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


def deadlines(scenarios: str | None = None) -> dict[str, float]:
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
    cmd = [tool("ckpt-chaos"), "run", "--coverage", "--plots", "none", "--golden-dir", str(golden),
           "--reports", str(work / "baseline")]
    cmd += baseline_scenarios() if scenarios is None else ["--suite", "full", "--scenarios", str(ROOT / scenarios)]
    print(f"baseline: {shlex.join(cmd)}", flush=True)
    subprocess.run(cmd, cwd=ROOT, env={k: v for k, v in os.environ.items() if k != "CKPT_CHAOS_GOLDEN_TREE"})
    return work / "baseline" / ("custom" if scenarios is None else "full") / "latest"
