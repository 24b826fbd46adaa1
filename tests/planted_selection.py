"""Which scenarios of the nightly planted-bug matrix (``tests/test_planted_matrix.py``) can show a planted
trainer anything: those whose run of the reference trainer reaches a function the planted module replaces.

A planted trainer is the reference trainer with a few functions replaced at import. On a scenario whose
coverage-measured run of the unmodified reference never executes a line of those functions, the planted
trainer runs exactly as the reference, so running it there shows nothing new. ``patches`` reads a planted
module's source (``ast``) for every patch it makes and resolves each to the original function (its file
and body lines); anything it cannot resolve (a class, a constant, a module attribute of torch or ``time``,
a statement at import that may act beyond the functions it replaces) sends the module to every scenario,
with the reason. ``selection`` then says, per scenario, whether to run it or why not; the coverage is one
``ckpt-chaos run --coverage`` of the matrix's scenarios (``make_coverage``), read with
``ckpt_chaos.mutation.scope``'s ``baseline``. Only a scenario that passes on the reference counts as
evidence: any other is run for every module.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ckpt_chaos.mutation import scope, tool
from ckpt_chaos.mutation.cache import fingerprint

REPO = Path(__file__).resolve().parents[1]
PLANTED = REPO / "tests" / "planted"

# What ``ckpt-chaos run --coverage`` measures in a trainer module's processes (``trainer_coverage.
# default_sources``): the reference trainer's package and the layout helpers it shares with the harness.
# A patch is resolvable only to a function of these files.
MEASURED_PACKAGES = ("reference_trainer",)
MEASURED_MODULES = ("ckpt_chaos.probe.layout",)
FINGERPRINT = "matrix-fingerprint.json"  # beside results.json in a coverage run this module made


def measured_files() -> list[str]:
    files = [str(p.relative_to(REPO)) for pkg in MEASURED_PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]
    return files + [m.replace(".", "/") + ".py" for m in MEASURED_MODULES]


def _measured_module(name: str) -> bool:
    return name in MEASURED_MODULES or any(name == p or name.startswith(p + ".") for p in MEASURED_PACKAGES)


# ---- what a planted module replaces ---------------------------------------------------------------

@dataclass
class Patches:
    module: str
    functions: dict[str, tuple[str, frozenset[int]]] = field(default_factory=dict)  # target -> (file, body lines)
    fallback: list[str] = field(default_factory=list)  # why it must run everywhere; empty: it need not

    @property
    def everywhere(self) -> bool:
        return bool(self.fallback)


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` -> ["a", "b", "c"]; None for anything but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _imports(tree: ast.Module) -> dict[str, tuple[str, str | None]]:
    """Module-level name -> (module, attribute or None) it was imported as."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = (a.name if a.asname else a.name.split(".")[0], None)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            for a in node.names:
                out[a.asname or a.name] = (node.module, a.name)
    return out


def _bound(module: str, attr: str | None):
    mod = importlib.import_module(module)
    if attr is None:
        return mod
    if hasattr(mod, attr):
        return getattr(mod, attr)
    return importlib.import_module(f"{module}.{attr}")


def _is_main_guard(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"'


def _in_function(tree: ast.Module) -> set[int]:
    """ids of the nodes inside a def or lambda: what runs only when the planted module calls it."""
    inner = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner.update(id(n) for n in ast.walk(node) if n is not node)
    return inner


def _targets(tree: ast.Module) -> list[tuple[ast.AST, ast.AST]]:
    """(statement, target) of every assignment, deletion and ``setattr`` call."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            stack = list(node.targets)
            while stack:
                t = stack.pop()
                if isinstance(t, (ast.Tuple, ast.List)):
                    stack += t.elts
                else:
                    out.append((node, t))
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            out.append((node, node.target))
        elif isinstance(node, ast.Delete):
            out += [(node, t) for t in node.targets]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            obj, name = (node.args + [None, None])[:2]
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and obj is not None:
                out.append((node, ast.Attribute(value=obj, attr=name.value, ctx=ast.Store())))
            else:
                out.append((node, node))  # a name only known at run time: unresolvable
    return out


def _made(tree: ast.Module) -> set[tuple[str, ...]]:
    """Chains (``("shim",)``, ``("remote", "time")``) the module binds, at its top level, to an object it
    creates there (a call's result, a class or function of its own): changing that object's attributes
    changes nothing of the reference's until the object is installed, and the installing is a patch."""
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add((node.name,))
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            out.update(tuple(c) for t in node.targets if (c := _chain(t)))
    return out


def function_lines(fn) -> tuple[str, frozenset[int]]:
    """The file (relative to the repository) of a function and the lines of its body: what coverage records
    only when it is called (its ``def`` line and decorators run at import)."""
    fn = inspect.unwrap(fn)
    path = Path(inspect.getsourcefile(fn)).resolve()
    _, first = inspect.getsourcelines(fn)
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == fn.__name__
                and min([node.lineno, *(d.lineno for d in node.decorator_list)]) == first):
            return str(path.relative_to(REPO)), frozenset(range(node.body[0].lineno, node.end_lineno + 1))
    raise LookupError(f"no def {fn.__name__} at {path}:{first}")


# The trainer processes' own code besides the measured files, where a reader of a rebound global would hide.
TRAINER_SIDE = ("ckpt_chaos/probe",)


_LOOKUPS = ("getattr", "hasattr", "setattr", "delattr", "attrgetter")


def _module_aliases(tree: ast.Module, module: str) -> tuple[set[str], set[str]]:
    """Names a file binds (anywhere in it) to module ``module``, and to any other module."""
    ours, others = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                bound = a.asname or a.name.split(".")[0]
                (ours if (a.name if a.asname else a.name.split(".")[0]) == module else others).add(bound)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                (ours if f"{node.module}.{a.name}" == module else others).add(a.asname or a.name)
    return ours, others - ours


def _reads(node: ast.AST, name: str, own_file: bool, ours: set[str], others: set[str]) -> bool:
    """Whether code ``node`` may read global ``name`` of the rebound module: by its bare name in that
    module's own file; as ``x.name`` on the module, or on anything not known to be another module; by
    ``getattr``-like lookups of the string; by a ``from module import name`` run at call time."""
    for n in ast.walk(node):
        if own_file and isinstance(n, ast.Name) and n.id == name:
            return True
        if isinstance(n, ast.Attribute) and n.attr == name:
            base = n.value
            if not (isinstance(base, ast.Name) and base.id in others and base.id not in ours):
                return True
        if isinstance(n, ast.alias) and name in (n.name, n.asname):
            return True
        if (isinstance(n, ast.Call) and (ast.unparse(n.func).split(".")[-1] in _LOOKUPS)
                and any(isinstance(a, ast.Constant) and a.value == name for a in n.args)):
            return True
    return False


def readers(module, name: str) -> dict[str, tuple[str, frozenset[int]]]:
    """A global ``name`` of ``module`` rebound to something other than a function (a constant, a class, a
    module): its effect lies in the functions that read it when called (what read it at import, a class
    body, a default argument, a subclass, read the original already). Those are, conservatively, every
    function of a measured file that may read it (``_reads``), each as if replaced; LookupError where
    none does, where one lies outside the measured files, or where a file imports the name itself at its
    top (it may have run after the rebinding)."""
    found: dict[str, tuple[str, frozenset[int]]] = {}
    side = [str(p.relative_to(REPO)) for d in TRAINER_SIDE for p in sorted((REPO / d).glob("*.py"))]
    own = str(Path(inspect.getsourcefile(module)).resolve().relative_to(REPO))
    for file in dict.fromkeys([*measured_files(), *side]):
        tree = ast.parse((REPO / file).read_text())
        ours, others = _module_aliases(tree, module.__name__)
        for node in tree.body:
            if (isinstance(node, ast.ImportFrom) and node.module == module.__name__
                    and any(a.name in (name, "*") for a in node.names)):
                raise LookupError(f"{file}:{node.lineno} imports {name} from {module.__name__} at import")
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if _reads(node, name, file == own, ours, others):
                fn = getattr(node, "name", "<lambda>")
                if file not in measured_files():
                    raise LookupError(f"{file}:{node.lineno} ({fn}) reads {name}, and the coverage does not "
                                      "measure that file")
                body = node.body[0] if isinstance(node.body, list) else node  # a lambda: its own line(s)
                found[f"{file}:{fn}:{node.lineno} (reads {module.__name__}.{name})"] = (
                    file, frozenset(range(body.lineno, node.end_lineno + 1)))
    if not found:
        raise LookupError(f"no function of the measured files reads {name}")
    return found


def _original(obj, name: str) -> list:
    """The functions behind attribute ``name`` of ``obj`` (a property's accessors), or [] if it is no function."""
    raw = inspect.getattr_static(obj, name)
    if isinstance(raw, (staticmethod, classmethod)):
        raw = raw.__func__
    if isinstance(raw, property):
        return [f for f in (raw.fget, raw.fset, raw.fdel) if f is not None]
    if inspect.isfunction(inspect.unwrap(raw)) and inspect.unwrap(raw).__name__ != "<lambda>":
        return [raw]
    return []


def patches(module: str) -> Patches:
    """Every patch planted module ``module`` (a stem of ``tests/planted``) makes, resolved to the reference's
    original functions; ``fallback`` says why it must run on every scenario where any is not."""
    planted = [m for m in sys.modules if m.startswith("tests.planted.")]
    if planted:  # its import replaced the reference's functions in this process: what we would read is theirs
        raise RuntimeError(f"{planted} imported in this process: the reference trainer here is patched")
    source = (PLANTED / f"{module}.py").read_text()
    tree = ast.parse(source)
    imports = _imports(tree)
    inner = _in_function(tree)
    out = Patches(module)
    for node in tree.body:  # what runs at import besides imports, defs and plain names
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) or _is_main_guard(node):
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            continue  # its targets are judged below
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func) == "setattr"):
            continue  # judged below
        out.fallback.append(f"line {node.lineno}: `{ast.unparse(node)[:60]}` runs at import and may act beyond "
                            "the functions it replaces")
    made = _made(tree)
    for stmt, target in _targets(tree):
        where = f"line {stmt.lineno}: `{ast.unparse(target)}`"
        if isinstance(target, ast.Name):
            continue  # the planted module's own name
        chain = _chain(target.value if isinstance(target, ast.Subscript) else target)
        root = chain[0] if chain else None
        if id(stmt) in inner and root not in imports:
            continue  # a local's state, in code that runs only where the module calls it
        if chain and any(tuple(chain[:i]) in made for i in range(1, len(chain))):
            continue  # inside an object the module made: it acts where that object is installed, judged there
        if isinstance(stmt, ast.Delete) or isinstance(target, ast.Subscript) or chain is None or len(chain) < 2:
            out.fallback.append(f"{where}: a deletion, an item or a computed target")
            continue
        if root not in imports or not (_measured_module(imports[root][0])
                                       or _measured_module(".".join(filter(None, imports[root])))):
            out.fallback.append(f"{where}: not rooted in a module the coverage measures (reference_trainer, "
                                "ckpt_chaos.probe.layout)")
            continue
        try:
            obj = _bound(*imports[root])
            for part in chain[1:-1]:
                obj = getattr(obj, part)
            originals = _original(obj, chain[-1])
        except (AttributeError, ImportError) as e:
            out.fallback.append(f"{where}: {type(e).__name__}: {e}")
            continue
        if not originals and inspect.ismodule(obj) and len(chain) == 2:
            try:
                out.functions.update(readers(obj, chain[-1]))
            except LookupError as e:
                out.fallback.append(f"{where}: {e}")
            continue
        if not originals:
            out.fallback.append(f"{where}: replaces a {type(inspect.getattr_static(obj, chain[-1])).__name__}, "
                                "not a function")
            continue
        for fn in originals:
            file, lines = function_lines(fn)
            if file not in measured_files():
                out.fallback.append(f"{where}: its original is in {file}, which the coverage does not measure")
                break
            key = ast.unparse(target) if len(originals) == 1 else f"{ast.unparse(target)}.{fn.__name__}"
            out.functions[key] = (file, lines)
    if not out.functions and not out.fallback:
        out.fallback.append("no patch found")
    return out


# ---- which scenarios ------------------------------------------------------------------------------

def module_scenarios():
    """The default suite's scenarios that run a trainer module (not a [command] trainer) on this machine's
    local launcher: what a planted trainer can be swapped into."""
    from ckpt_chaos.config import builtin_scenarios
    from ckpt_chaos.scenario import catalogue

    return [s for s in catalogue(builtin_scenarios()) if "default" in s.suites and s.command is None
            and s.cluster.backend == "local"]


def selection(p: Patches, base: dict, scenarios: list[str]) -> dict[str, str | None]:
    """Scenario -> None (run it) or why not (its reference run never reaches a replaced function).
    ``base``: ``scope.baseline`` of a coverage run of ``scenarios``."""
    out: dict[str, str | None] = {}
    for name in scenarios:
        if p.everywhere or name not in base["walls"]:  # unresolved, or no evidence: the reference did not pass
            out[name] = None
            continue
        reached = [t for t, (file, lines) in p.functions.items()
                   if file not in base["reached"] or name in scope.select(base, file, sorted(lines))]
        out[name] = None if reached else (f"never reaches {', '.join(sorted(p.functions))}; "
                                          "same run as the reference")
    return out


# ---- the coverage of the reference over the matrix's scenarios -------------------------------------

# What a coverage run must have been made on to be reused (``$CKPT_CHAOS_MATRIX_COVERAGE``): the measured
# trainer and the probe it calls, with the scenarios' own files. A change to the harness elsewhere (a check,
# a fault) does not void it; a session that makes its own always measures the tree it runs.
FINGERPRINTED = ("reference_trainer", "ckpt_chaos/probe")


def fingerprint(scenario_files: list[str]) -> str:
    """The tracked sources of ``FINGERPRINTED`` (``cache.fingerprint``), and each scenario's file."""
    h = hashlib.sha256(fingerprint({"reached": {}}, [], fingerprinted=FINGERPRINTED).encode())
    for f in sorted(scenario_files):
        h.update(Path(f).name.encode() + b"\0" + Path(f).read_bytes() + b"\0")
    return h.hexdigest()


def usable(suite_dir: Path, scenario_files: list[str]) -> str | None:
    """Why the coverage run in ``suite_dir`` cannot stand for this tree and these scenarios, or None."""
    stamp = suite_dir / FINGERPRINT
    if not stamp.is_file():
        return f"no {FINGERPRINT} in {suite_dir}"
    if json.loads(stamp.read_text())["fingerprint"] != fingerprint(scenario_files):
        return f"{suite_dir} was measured on other sources or scenarios than these"
    return None


def make_coverage(reports: Path, golden: Path, scenario_files: list[str], jobs: str = "1") -> Path:
    """One ``ckpt-chaos run --coverage -n JOBS`` of ``scenario_files`` on this tree, as
    ``scope.make_baseline`` runs the default suite; its suite folder, stamped with the fingerprint it
    was made at."""
    print_ = fingerprint(scenario_files)
    cmd = [tool("ckpt-chaos"), "run", "--coverage", "--plots", "none", "--golden-dir", str(golden),
           "--reports", str(reports), "-n", jobs, *scenario_files]
    t0 = time.monotonic()
    subprocess.run(cmd, cwd=REPO, env={k: v for k, v in os.environ.items() if k != "CKPT_CHAOS_GOLDEN_TREE"},
                   stdout=subprocess.DEVNULL)
    suite = (reports / "custom" / "latest").resolve()
    (suite / FINGERPRINT).write_text(json.dumps({"fingerprint": print_, "wall_s": time.monotonic() - t0}))
    return suite


def baseline(suite_dir: Path) -> dict:
    """``scope.baseline`` over every measured file (a planted module may replace any of them)."""
    return scope.baseline(suite_dir, {f: None for f in measured_files()})


# ---- golden runs: the reference's where the planted trainer's would be the same ------------------

# A planted trainer's golden run is its own fault-free run. Where that run never reaches a function the
# module replaces, it executes the reference's code line for line and makes the reference's golden run:
# the same trajectory, state digests and final state (what differs between any two golden runs, times,
# pids, the bytes DCP pickles, differs as much between two of the reference's). The matrix then takes the
# reference's instead of making it again, a third of the runs of a planted trainer that can share it. The
# evidence is a coverage-measured golden run of the reference per configuration (``measure_goldens``).
GOLDEN_COVERAGE = "coverage/coverage.json"  # under a measure_goldens folder


def golden_configs(scenarios) -> dict[str, tuple[dict, int]]:
    """The reference's golden key -> (configuration, world size) of every scenario's golden run."""
    from ckpt_chaos.run.runner import golden_config, golden_key

    return {golden_key("reference_trainer", s.trainer, s.world_size): (golden_config(s.trainer), s.world_size)
            for s in scenarios}


def _measure_golden(folder: str, runs: str, key: str, cfg: dict, world_size: int) -> None:
    """In a process of its own (the coverage folder is process-wide state): one measured golden run."""
    from ckpt_chaos.report import trainer_coverage
    from ckpt_chaos.run.runner import golden_run

    os.environ[trainer_coverage.ENV] = folder
    with trainer_coverage.measuring(key):
        made = golden_run("reference_trainer", cfg, world_size, Path(runs))
    if made.name != key:
        raise RuntimeError(f"golden run {made} is not under key {key}")


def measured_goldens(root: Path) -> set[str]:
    """The golden keys a ``measure_goldens`` folder has a measured run of."""
    return _measured_keys(golden_reach(root)) if (root / GOLDEN_COVERAGE).is_file() else set()


def _measured_keys(reach: dict[str, dict[str, set[str]]]) -> set[str]:
    return {k for lines in reach.values() for ctx in lines.values() for k in ctx}


def measure_goldens(root: Path, scenarios, jobs: int = 1) -> Path:
    """Make the reference's golden run of each scenario's configuration in ``root/runs`` (under its key)
    with coverage.py in every process, one coverage context per key, ``jobs`` at a time; ``root``."""
    import concurrent.futures
    import multiprocessing
    import shutil

    from ckpt_chaos.report import trainer_coverage

    if root.exists():
        shutil.rmtree(root)
    folder = root / "coverage"
    trainer_coverage.start(folder, trainer_coverage.default_sources(scenarios[:1]))
    os.environ.pop(trainer_coverage.ENV)  # start sets it for this process; each run's process sets its own
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for done in [pool.submit(_measure_golden, str(folder), str(root / "runs"), key, cfg, world_size)
                     for key, (cfg, world_size) in golden_configs(scenarios).items()]:
            done.result()
    import coverage  # the JSON with each line's contexts is all golden_reach reads: no HTML

    cov = coverage.Coverage(data_file=str(folder / ".coverage"))
    cov.combine([str(folder)], keep=False)
    cov.save()
    cov.json_report(outfile=str(root / GOLDEN_COVERAGE), ignore_errors=True, show_contexts=True)
    return root


def golden_reach(root: Path) -> dict[str, dict[str, set[str]]]:
    """From a ``measure_goldens`` folder: measured file -> line -> the golden keys whose run reaches it."""
    out: dict[str, dict[str, set[str]]] = {}
    for path, f in json.loads((root / GOLDEN_COVERAGE).read_text())["files"].items():
        file = next((m for m in measured_files() if path.endswith(m)), None)
        if file is not None:
            out[file] = {line: set(ctx) for line, ctx in f["contexts"].items()}
    return out


def golden_differs(p: Patches, reach: dict[str, dict[str, set[str]]], key: str) -> str | None:
    """Why the planted module's golden run of reference key ``key`` may differ from the reference's, or
    None where it cannot: the module resolves to functions, and the measured run reaches none of them."""
    if p.everywhere:
        return "its patches do not all resolve to functions of the measured trainer"
    if key not in _measured_keys(reach):
        return f"no measured golden run of the reference for {key}"
    reached = sorted(t for t, (file, lines) in p.functions.items()
                     if any(key in reach.get(file, {}).get(str(line), ()) for line in lines))
    return f"the reference's golden run reaches {', '.join(reached)}" if reached else None


# ---- made before the tests: make test-full's first step ------------------------------------------

def prepare(root: Path, jobs: str = "auto") -> Path:
    """What the matrix needs, in ``root``: the coverage run of its scenarios (``reports/custom/latest``),
    ``jobs`` at a time, unless the one there was made on these sources and scenarios; the reference's
    measured golden runs (``goldens``) unless every one is there. The tests find it through
    ``$CKPT_CHAOS_MATRIX_COVERAGE``; made here, no test waits for it."""
    scenarios = module_scenarios()
    files = [str(s.source) for s in scenarios]
    suite = root / "reports" / "custom" / "latest"
    t0 = time.monotonic()
    if suite.exists() and usable(suite.resolve(), files) is None:
        print(f"matrix coverage: {suite.resolve()} stands for this tree", flush=True)
    else:
        suite = make_coverage(root / "reports", root / "golden", files, jobs)
        print(f"matrix coverage: {suite} in {time.monotonic() - t0:.0f} s", flush=True)
    wanted = set(golden_configs(scenarios))
    if wanted <= measured_goldens(root / "goldens"):
        print(f"matrix golden runs: {root / 'goldens'} has all {len(wanted)}", flush=True)
    else:
        t0 = time.monotonic()
        measure_goldens(root / "goldens", scenarios, jobs=2)
        print(f"matrix golden runs: {len(wanted)} measured in {time.monotonic() - t0:.0f} s", flush=True)
    return root


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tests.planted_selection", description=prepare.__doc__)
    ap.add_argument("root", type=Path, help="the folder to make (and reuse) it in")
    ap.add_argument("-n", dest="jobs", default="auto", help="scenarios at once in the coverage run (default: auto)")
    a = ap.parse_args()
    prepare(a.root.resolve(), a.jobs)
