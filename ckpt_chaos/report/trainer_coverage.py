"""Which lines of the trainer the scenarios reach: coverage.py in every process of the job under test.

``ckpt-chaos run --coverage`` sets ``CKPT_CHAOS_COVERAGE`` to a folder in the suite's report; each
scenario then writes a coverage.py configuration there (its name as the coverage context) and
starts its jobs with ``COVERAGE_PROCESS_START`` pointing at it. coverage.py's own ``.pth`` file
starts measuring in every Python process that inherits it: torchrun's ranks, the launcher agent's
forked ranks (``patch = fork``), relaunches, the remote tier's uploader, a Slurm job's tasks.
Ranks end with ``os._exit`` (``patch = _exit`` saves first), and a rank the nemesis SIGKILLs would
take its unsaved lines with it, so the probe saves the data at each probe point (where a kill can
land) while coverage runs. Golden runs are not measured: the scenarios' own runs reach everything
a fault-free run does.

After the suite the data is combined into ``coverage/`` next to ``index.html``: the HTML report
(with each line's scenarios), ``coverage.json``, and a summary of the checkpoint path.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ckpt_chaos.extras import missing_extra

ENV = "CKPT_CHAOS_COVERAGE"  # the folder the suite's coverage data goes to
SOURCES = ".sources.json"  # in that folder: what is measured

# The reference trainer's checkpoint path: whole files, and the functions of the loop that save and
# resume. What `summary` reports against the acceptance figures (docs/coverage.md).
CHECKPOINT_PATH = {
    "reference_trainer/checkpoint.py": None,
    "reference_trainer/state.py": None,
    "reference_trainer/remote.py": None,
    "ckpt_chaos/probe/layout.py": None,
    "reference_trainer/train.py": ("Trainer.resume", "Trainer.save_and_exit", "Trainer.run"),
}


def missing() -> str | None:
    """Why coverage cannot be measured here, or None."""
    return missing_extra("coverage")


def default_sources(scenarios) -> list[str]:
    """The trainers the scenarios run: the reference trainer's package (and the layout helpers it
    shares with the harness), and for a ``[command]`` trainer the folder of its script or module."""
    import importlib.util

    found: list[str] = []
    for s in scenarios:
        if s.command is None:
            spec = importlib.util.find_spec(s.trainer_module.split(".")[0])
            if spec and spec.origin:
                found.append(str(Path(spec.origin).parent))
            found.append(str(Path(__file__).resolve().parent.parent / "probe" / "layout.py"))
            continue
        argv = [a for a in s.command.argv if "{" not in a]
        if "-m" in argv and argv.index("-m") + 1 < len(argv):
            spec = importlib.util.find_spec(argv[argv.index("-m") + 1].split(".")[0])
            if spec and spec.origin:
                found.append(str(Path(spec.origin).parent))
        found += [str(Path(a).resolve().parent) for a in argv if a.endswith(".py")]
    return list(dict.fromkeys(found))


def start(folder: Path, sources: list[str]) -> None:
    """Make ``folder`` this suite's coverage folder: scenarios run from now on are measured."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SOURCES).write_text(json.dumps(sources))
    os.environ[ENV] = str(folder)


def _rcfile(folder: Path, context: str) -> Path:
    sources = json.loads((folder / SOURCES).read_text())
    files = [s for s in sources if s.endswith(".py")]
    dirs = [s for s in sources if not s.endswith(".py")]
    lines = ["[run]", "branch = true", "parallel = true", f"data_file = {folder / '.coverage'}",
             f"context = {context}", "patch =\n    _exit\n    fork\n    subprocess",
             # the harness's own Python helpers (moto, the proxy, faultfs) inherit the variable too
             "disable_warnings =\n    no-data-collected"]
    lines.append("include =\n" + "\n".join([f"    {d}/*" for d in dirs] + [f"    {f}" for f in files]))
    path = folder / "rc" / f"{context}.coveragerc"
    path.parent.mkdir(exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


@contextmanager
def measuring(context: str) -> Iterator[None]:
    """While a scenario runs: the processes it starts measure coverage, under ``context``."""
    folder = os.environ.get(ENV)
    if not folder:
        yield
        return
    before = os.environ.get("COVERAGE_PROCESS_START")
    os.environ["COVERAGE_PROCESS_START"] = str(_rcfile(Path(folder), context))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("COVERAGE_PROCESS_START", None)
        else:
            os.environ["COVERAGE_PROCESS_START"] = before


def report(folder: Path) -> dict:
    """Combine the suite's data, write the HTML and JSON reports into ``folder``; the summary."""
    import coverage

    rc = _rcfile(folder, "combined")
    cov = coverage.Coverage(config_file=str(rc), data_file=str(folder / ".coverage"))
    cov.combine([str(folder)], keep=False)
    cov.save()
    cov.load()
    if not cov.get_data().measured_files():
        return {"files": {}, "note": "no line of the trainer was measured"}
    cov.html_report(directory=str(folder), show_contexts=True, title="ckpt-chaos: trainer coverage",
                    ignore_errors=True)
    cov.json_report(outfile=str(folder / "coverage.json"), ignore_errors=True, show_contexts=True)
    out = summary(json.loads((folder / "coverage.json").read_text()))
    (folder / "summary.json").write_text(json.dumps(out, indent=1))
    return out


def _counts(summary: dict) -> dict:
    return {"statements": summary["num_statements"], "missing": summary["missing_lines"],
            "branches": summary.get("num_branches", 0), "partial": summary.get("num_partial_branches", 0),
            "branches_missing": summary.get("missing_branches", 0),
            "covered_branches": summary.get("covered_branches", 0)}


def summary(data: dict) -> dict:
    """Line and branch coverage of the checkpoint path (``CHECKPOINT_PATH``), from coverage.json,
    with the lines and branches no scenario reaches; and every measured file's totals."""
    files = {}
    for path, f in data["files"].items():
        files[path] = {**_counts(f["summary"]), "percent": f["summary"]["percent_covered"]}
    parts, missing = [], {}
    for path, f in data["files"].items():
        key = next((k for k in CHECKPOINT_PATH if path.endswith(k)), None)
        if key is None:
            continue
        wanted = CHECKPOINT_PATH[key]
        pieces = [f] if wanted is None else [f["functions"][n] for n in wanted if n in f.get("functions", {})]
        for piece in pieces:
            parts.append(_counts(piece["summary"]))
            missed = piece.get("missing_lines", [])
            branches = piece.get("missing_branches", [])
            if missed or branches:
                entry = missing.setdefault(key, {"lines": [], "branches": []})
                entry["lines"] += missed
                entry["branches"] += branches
    stmts = sum(p["statements"] for p in parts)
    branches = sum(p["branches"] for p in parts)
    return {
        "checkpoint_path": {
            "statements": stmts, "missing": sum(p["missing"] for p in parts),
            "line_percent": 100.0 * (stmts - sum(p["missing"] for p in parts)) / stmts if stmts else None,
            "branches": branches, "covered_branches": sum(p["covered_branches"] for p in parts),
            "branch_percent": 100.0 * sum(p["covered_branches"] for p in parts) / branches if branches else None,
        },
        "missing": missing,
        "files": files,
    }


def format_summary(s: dict) -> list[str]:
    """The lines ``run --coverage`` prints."""
    cp = s.get("checkpoint_path")
    if not cp or not cp["statements"]:  # another trainer: its files' totals
        return [f"{path}: lines {f['percent']:.1f} %, {f['missing']} of {f['statements']} not reached, "
                f"branches {f['covered_branches']} of {f['branches']}"
                for path, f in sorted(s.get("files", {}).items())] or [s.get("note", "nothing was measured")]
    out = [f"checkpoint path: lines {cp['line_percent']:.1f} % ({cp['statements'] - cp['missing']} of "
           f"{cp['statements']}), branches {cp['branch_percent']:.1f} % ({cp['covered_branches']} of {cp['branches']})"]
    for path, m in sorted(s["missing"].items()):
        lines = ",".join(map(str, m["lines"])) or "-"
        out.append(f"  {path}: lines not reached {lines}; branches not taken {len(m['branches'])}")
    return out
