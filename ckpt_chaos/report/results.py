"""Results of a suite: one row per scenario, stored as CSV and JSON, summarised as plain HTML and JUnit XML.

A suite run lives in ``reports/<suite>/<UTC time>/`` under the output directory, with a ``latest``
link next to it (as Jepsen's store does): ``results.csv``, ``results.json``, ``index.html`` and one
directory per scenario with its history, trajectory, logs and ``result.json``.

``results.json`` and each ``result.json`` carry ``schema_version`` (raised when a key changes
meaning or goes away), ``tool_version`` (the ckpt-chaos that wrote them) and, per scenario, the
trainer (``trainer``: its module, or a ``[command]`` trainer's command, launcher and source file;
``trainer_module``, null for a ``[command]`` trainer) and its code's revision (``{"commit", "dirty"}``
of the git repository the module or source file is tracked in, null when it is not in git).
``results.json``'s ``plots`` says whose plots the run drew (all, failed, none). A row's timings
(``time_to_detect_s``, ``time_to_recover_s``, ``save_s``, ``save_stall_s``) are null where the run
does not allow them, and ``timings_why`` then says why, by column; the page shows such a cell as a
dash whose title is the reason, and lists the reasons under the scenario.
A row's ``verdict`` is ``pass``, ``fail`` or ``skipped``,
or for a scenario with ``expect.known_failure``: ``xfail`` (that check failed, as documented) or
``xpass`` (it did not: a fixed bug, or a known failure that no longer shows; this fails the suite).
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from importlib.machinery import PathFinder
from pathlib import Path

from jinja2 import Environment, Undefined, select_autoescape

from ckpt_chaos import __version__
from ckpt_chaos.check.verdict import causal
from ckpt_chaos.probe.run_files import RESULT

SCHEMA_VERSION = 1
COLUMNS = ["scenario", "verdict", "families", "kinds", "launches", "steps_lost", "time_to_detect_s",
           "time_to_recover_s", "save_s", "save_stall_s", "resumed_from", "wall_s", "reason", "trainer"]
# Verdicts that let a suite pass; "skipped" passes unless the run is strict; any other fails it
# (``fail``, ``xpass``, and a verdict this version does not know).
PASSING = ("pass", "xfail")


def suite_dir(reports_root: Path, suite: str) -> Path:
    """A new directory for one suite run, named by its UTC start time, and ``latest`` pointing at it.
    Two runs started in the same second (CI scripts, a --strict rerun) get ``-2``, ``-3``...:
    never one run's files written into another's directory."""
    base = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    (Path(reports_root) / suite).mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        stamp = base if n == 1 else f"{base}-{n}"
        out = Path(reports_root) / suite / stamp
        try:
            out.mkdir()
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"{out}: a thousand suite runs started in the same second")
    link = Path(reports_root) / suite / "latest"
    tmp = link.with_name(".latest.tmp")
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(stamp)
    os.replace(tmp, link)
    return out


def failed(row: dict) -> bool:
    """The row fails the suite: fail, xpass, or unknown that its scenario did not declare
    (``expect.may_be_unknown``)."""
    return row["verdict"] not in (*PASSING, "skipped") and not (row["verdict"] == "unknown"
                                                                 and row.get("may_be_unknown"))


def undecided(row: dict) -> bool:
    """Unknown: the run did not show whether the trainer survives what the scenario states."""
    return row["verdict"] == "unknown"


# ---- one scenario's row -------------------------------------------------------------------------

def trainer_revision(module: str) -> dict | None:
    """``{"commit", "dirty"}`` of the git repository the trainer module's code is tracked in; None when
    it is not (an installed package, no git here). Dirty: tracked files differ from the commit."""
    origin = module_file(module.split(".")[0])
    return file_revision(origin) if origin is not None else None


def module_file(module: str) -> Path | None:
    """The file of a module, found without importing it (its package's ``__init__.py``); None if none."""
    try:
        spec = PathFinder.find_spec(module.split(".")[0], [*sys.path, os.getcwd()])
        if spec is not None and "." in module:  # a submodule: look for it in its package's folders
            for part in module.split(".")[1:]:
                spec = PathFinder.find_spec(part, list(spec.submodule_search_locations or []))
                if spec is None:
                    break
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        return None
    return Path(spec.origin)


def file_revision(origin: Path) -> dict | None:
    """``{"commit", "dirty"}`` of the git repository ``origin`` (a file) is tracked in; None when it is not."""
    origin = Path(origin).absolute()

    def git(*args: str) -> subprocess.CompletedProcess | None:
        try:
            return subprocess.run(["git", "-C", str(origin.parent), *args], capture_output=True, text=True,
                                  timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None

    tracked = git("ls-files", "--error-unmatch", origin.name)
    commit = git("rev-parse", "HEAD")
    if not tracked or tracked.returncode != 0 or not commit or commit.returncode != 0:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit.stdout.strip(), "dirty": bool(status and status.stdout.strip())}


def apply_known_failure(row: dict, known_failure: str | None, source: str = "the scenario file") -> dict:
    """The row's verdict given the check the scenario is kept to show failing: ``xfail`` when that check
    failed, ``xpass`` when the run passed, ``fail`` when other checks failed and it did not."""
    if not known_failure or row["verdict"] == "skipped":
        return row
    checks = {c["name"]: c for c in row.get("checks", [])}
    named = checks.get(known_failure)
    # unknown counts as failing: a check that could not tell does not show a documented bug fixed
    failing = [c["name"] for c in row.get("checks", []) if c["verdict"] in ("fail", "unknown")]
    if named is not None and named["verdict"] in ("fail", "unknown"):
        others = [n for n in failing if n != known_failure]
        return {**row, "verdict": "xfail", "known_failure": known_failure,
                "reason": f"known failure: {known_failure}: {named['detail']}"
                          + (f" (also failing: {', '.join(others)})" if others else "")}
    if named is None:
        missing = (f"expect.known_failure names {known_failure!r}, which is no check of this run "
                   f"(its checks: {', '.join(checks) or 'none'}); fix the name in {source}")
    else:
        missing = f"{known_failure} did not fail ({named['verdict']}: {named['detail']})"
    if failing:
        return {**row, "verdict": "fail", "known_failure": known_failure,
                "reason": f"{row['reason']}; and the known failure: {missing}"}
    return {**row, "verdict": "xpass", "known_failure": known_failure,
            "reason": f"known failure passed: {missing}; if the bug it documents is fixed, remove "
                      f"expect.known_failure from {source}"}


def scenario_row(result, scenario, write: bool = True) -> dict:
    """The scenario's row for the suite's table: the runner's result with its known failure applied and
    what made it (tool version, trainer revision); also written to the run's ``result.json``."""
    row = apply_known_failure(result.to_dict(), scenario.expect.known_failure, scenario.source)
    if row["verdict"] == "unknown" and scenario.expect.may_be_unknown:
        row["may_be_unknown"] = scenario.expect.may_be_unknown
    row["trainer"] = describe_trainer(scenario)
    row["trainer_module"] = scenario.trainer_module if scenario.command is None else None
    source = row["trainer"].get("source")
    row["trainer_revision"] = (trainer_revision(scenario.trainer_module) if scenario.command is None
                               else file_revision(Path(source)) if source else None)
    if write and row.get("run_dir") and Path(row["run_dir"]).is_dir():
        _write_json(Path(row["run_dir"]) / RESULT, {**stamp(), **row})
    return row


def describe_trainer(scenario) -> dict:
    """What trained: ``{"module"}`` for a trainer module (the reference trainer's), or for a
    ``[command]`` trainer its ``command`` (argv as the scenario gives it, placeholders and all),
    ``launcher``, ``relaunch_argv`` and ``source``: the script it runs (relative to the directory it
    was run from) or the module's file, None where the command names neither."""
    c = scenario.command
    if c is None:
        return {"module": scenario.trainer_module}
    return {"command": list(c.argv), "launcher": c.launcher, "relaunch_argv": list(c.relaunch_argv),
            "source": command_source(c.argv, c.launcher)}


def command_source(argv: list[str], launcher: str = "torchrun") -> str | None:
    """The source file a [command] runs: under torchrun its script, or the module after ``-m``; with its
    own launcher (``{python} train.py``, ``accelerate launch ... train.py``) the first ``.py`` file named
    (a launcher's ``-m`` module is the launcher, not the trainer), else the module after ``-m``."""
    args = [a for a in argv if "{" not in a]
    modules = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-m"]
    if launcher == "torchrun" and args and args[0] != "-m":
        return args[0]
    if launcher != "torchrun":
        scripts = [a for a in args if a.endswith(".py") and not a.startswith("-")]
        if scripts:
            return scripts[0]
    if modules:
        found = module_file(modules[0])
        if found is None:
            return None
        try:
            return found.relative_to(Path.cwd()).as_posix()
        except ValueError:
            return str(found)
    return None


def trainer_text(row: dict) -> str:
    """The row's trainer in one line: its module, or ``launcher: command line``."""
    t = row.get("trainer") or ({"module": row["trainer_module"]} if row.get("trainer_module") else {})
    if "command" in t:
        return f"{t.get('launcher', 'torchrun')}: {shlex.join(t['command'])}"
    return t.get("module", "")


def stamp() -> dict:
    return {"schema_version": SCHEMA_VERSION, "tool_version": __version__}


def check_lines(row: dict) -> str:
    """The row's checks as text, one a line: ``verdict name: detail``."""
    return "\n".join(f"{c['verdict']:<5} {c['name']}: {c['detail']}" for c in row.get("checks", []))


def _write_json(path: Path, data) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)  # a reader never sees half a file


# ---- the suite ----------------------------------------------------------------------------------

def table(results: list[dict]) -> list[dict]:
    """The CSV's rows: COLUMNS only, lists joined with spaces, missing values (and unknown ones: steps
    lost that could not be counted) empty; the trainer as ``trainer_text``."""
    out = []
    for r in results:
        row = {}
        for col in COLUMNS:
            v = trainer_text(r) if col == "trainer" else r.get(col)
            row[col] = " ".join(map(str, v)) if isinstance(v, list) else ("" if v is None else v)
        out.append(row)
    return out


def shown(row: dict, key: str) -> str:
    """``steps_lost`` or ``resumed_from`` as the console and the page show it: "?" where a relaunch
    happened but the checks could not tell (None, or no checkpoint named per relaunch), never a 0 or
    an empty list made up; empty where there was no relaunch."""
    v = row.get(key)
    relaunched = (row.get("launches") or 0) > 1
    if key == "resumed_from":
        return ", ".join(map(str, v)) if v else ("?" if relaunched else "")
    return str(v) if v is not None else ("?" if relaunched else "")


def write(out: Path, suite: str, results: list[dict], wall_s: float, plots: bool | str = True) -> Path:
    """Write results.csv, results.json and index.html (with each scenario's plots; ``plots="failed"``:
    only those of the scenarios that failed); returns the HTML path."""
    out = Path(out)
    tmp = out / ".results.csv.tmp"
    with tmp.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(table(results))
    os.replace(tmp, out / "results.csv")
    # which scenarios' plots were drawn: what a later `report --no-plots --browser` expects to find
    drawn = "failed" if plots == "failed" else "all" if plots else "none"
    _write_json(out / "results.json", {**stamp(), "suite": suite, "wall_s": wall_s, "plots": drawn,
                                       "results": results})
    return render(out, suite, results, wall_s, plots)


def write_junit(path: Path, suite: str, results: list[dict], wall_s: float) -> Path:
    """JUnit XML, one testcase per scenario: a failure or a skip with its reason, the checks as text."""
    path = Path(path)
    name = f"ckpt-chaos.{suite}"
    # unknown is a JUnit error, apart from the failures: the run could not tell, the trainer did not fail
    ts = ET.Element("testsuite", name=name, tests=str(len(results)),
                    errors=str(sum(1 for r in results if undecided(r) and failed(r))),
                    failures=str(sum(1 for r in results if failed(r) and not undecided(r))),
                    skipped=str(sum(1 for r in results if r["verdict"] in ("skipped", "xfail")
                                    or undecided(r) and not failed(r))),
                    time=f"{wall_s:.3f}", timestamp=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()))
    for r in results:
        tc = ET.SubElement(ts, "testcase", classname=name, name=r["scenario"], time=f"{r.get('wall_s') or 0:.3f}")
        checks = check_lines(r)
        verdict = r["verdict"]
        if verdict == "skipped":
            ET.SubElement(tc, "skipped", type="ckpt-chaos.skip", message=r.get("reason", ""))
        elif verdict == "xfail":  # as pytest writes an xfail, so CI dashboards count it the same
            ET.SubElement(tc, "skipped", type="pytest.xfail", message=r.get("reason", ""))
        elif verdict == "xpass":
            ET.SubElement(tc, "failure", message=f"[XPASS(strict)] {r.get('reason', '')}").text = checks
        elif verdict == "unknown" and r.get("may_be_unknown"):
            ET.SubElement(tc, "skipped", type="ckpt-chaos.unknown",
                          message=f"unknown, as the scenario allows ({r['may_be_unknown']}): {r.get('reason', '')}")
        elif verdict == "unknown":
            ET.SubElement(tc, "error", type="ckpt-chaos.unknown",
                          message=f"could not tell: {r.get('reason', '')}").text = checks
        elif verdict != "pass":
            ET.SubElement(tc, "failure", message=r.get("reason") or f"verdict {verdict}").text = checks
        out = [f"verdict: {verdict}"] + ([f"run: {r['run_dir']}"] if r.get("run_dir") else []) + [checks]
        ET.SubElement(tc, "system-out").text = "\n".join(filter(None, out))
    suites = ET.Element("testsuites", name="ckpt-chaos")
    suites.append(ts)
    ET.indent(suites)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    ET.ElementTree(suites).write(tmp, encoding="utf-8", xml_declaration=True)
    os.replace(tmp, path)
    return path


def render(out: Path, suite: str, results: list[dict], wall_s: float, plots: bool | str = True) -> Path:
    """index.html from stored results (``ckpt-chaos report`` calls this on an old run)."""
    out = Path(out)
    rows = []
    for r in results:
        run_dir = out / r["scenario"]
        if (plots is True or plots == "failed" and failed(r)) and run_dir.is_dir():
            from ckpt_chaos.report.plots import plot_scenario

            made = plot_scenario(run_dir)
        else:  # keep what an earlier build drew
            made = {k: f for k, f in (("loss", "loss.svg"), ("timeline", "timeline.svg")) if (run_dir / f).is_file()}
        bad = causal([c for c in r.get("checks", []) if c["verdict"] == "fail"]) + \
            causal([c for c in r.get("checks", []) if c["verdict"] == "unknown"])
        rows.append({**r, "plots": made, "failed": bad, "has_dir": run_dir.is_dir()})
    families: dict[str, dict[str, int]] = {}
    counts: dict[str, int] = {"pass": 0, "fail": 0, "skipped": 0}
    for r in results:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
        for fam in r.get("families") or ["none"]:
            c = families.setdefault(fam, {})
            c[r["verdict"]] = c.get(r["verdict"], 0) + 1
    cov = out / "coverage" / "summary.json"
    coverage = json.loads(cov.read_text()).get("checkpoint_path") if cov.is_file() else None
    html = _TEMPLATE.render(suite=suite, wall_s=wall_s, rows=rows, counts=counts, families=families, coverage=coverage,
                            grid=_audit_grid(out),
                            failing=sum(1 for r in results if failed(r)),
                            generated=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                            tool_version=__version__)
    (out / "index.html").write_text(html)
    return out / "index.html"


def _audit_grid(out: Path) -> dict | None:
    """The fault x point grid of an audit's suite run (``ckpt-chaos audit`` leaves its cells beside
    results.json), else None."""
    from ckpt_chaos.audit.matrix import GRID, grid

    path = out / GRID
    if not path.is_file():
        return None
    try:
        return grid(json.loads(path.read_text())["cells"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # the grid heads the page; a damaged file leaves the rest of the report as it was


def rebuild(results_dir: Path, plots: bool = True) -> Path:
    """Re-render a stored suite run's report from its results.json."""
    data = json.loads((Path(results_dir) / "results.json").read_text())
    return render(Path(results_dir), data["suite"], data["results"], data["wall_s"], plots)


@dataclass
class BrowserView:
    """What a real browser made of a report: counts read from the rendered DOM, and script errors."""

    sections: int  # scenario sections
    rows: int  # rows of the scenario table
    plots: int  # plot images on the page
    broken_plots: int  # of which failed to load
    script_errors: list[str]
    screenshot: Path | None

    def problems(self, expected_plots: int | None = None) -> list[str]:
        out = [f"script error: {e}" for e in self.script_errors]
        if self.broken_plots:
            out.append(f"{self.broken_plots} of {self.plots} plots did not load")
        if self.sections != self.rows:
            out.append(f"{self.rows} table rows but {self.sections} scenario sections")
        if expected_plots is not None and self.plots != expected_plots:
            out.append(f"{self.plots} plots on the page, {expected_plots} expected")
        return out


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def view_in_browser(html: Path, screenshot: Path | None = None, timeout: float = 180) -> BrowserView:
    """Open the report in headless Chromium (Debian's ``chromium``) as a reader would, from the file
    system; raises FileNotFoundError when there is no Chromium here."""
    browser = chromium()
    if browser is None:
        raise FileNotFoundError("no chromium here: `make setup` installs Debian's chromium (as root)")
    base = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
            "--window-size=1300,1800", "--virtual-time-budget=10000"]
    if screenshot is not None:
        Path(screenshot).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(base + [f"--screenshot={screenshot}", Path(html).resolve().as_uri()], capture_output=True,
                       timeout=timeout)
    dom = subprocess.run(base + ["--dump-dom", Path(html).resolve().as_uri()], capture_output=True, text=True,
                         timeout=timeout)
    body = re.search(r"<body([^>]*)>", dom.stdout)
    attrs = dict(re.findall(r'data-([\w-]+)="(\d+)"', body.group(1))) if body else {}
    return BrowserView(sections=dom.stdout.count('<section class="scenario"'), rows=dom.stdout.count("<tr class="),
                       plots=int(attrs.get("plots", -1)), broken_plots=int(attrs.get("broken-plots", -1)),
                       script_errors=[line for line in dom.stderr.splitlines() if "CONSOLE" in line and "Uncaught" in line],
                       screenshot=Path(screenshot) if screenshot and Path(screenshot).is_file() else None)


def expected_plots(results_dir: Path) -> int:
    """Plots the report of a stored suite run should show: those drawn next to each scenario's history."""
    data = json.loads((Path(results_dir) / "results.json").read_text())
    return sum(1 for r in data["results"] for f in ("loss.svg", "timeline.svg")
               if (Path(results_dir) / r["scenario"] / f).is_file())


def missing_plots(results_dir: Path, drawn: bool = False) -> list[str]:
    """One line per plot a stored suite run should have and has not, naming the scenario and the plot:
    a plot whose drawing failed (``plot-error.txt``), or a loss plot of a run with a trajectory, a
    timeline of a run with a history, that was not drawn. ``drawn``: the plots were drawn just now,
    for every scenario (``ckpt-chaos report`` without ``--no-plots``); else those of the scenarios
    the run drew (results.json's ``plots``: all, the failed ones, none) or that have a plot."""
    from ckpt_chaos.report.plots import PLOT_ERROR, PLOTS, wanted

    root = Path(results_dir)
    data = json.loads((root / "results.json").read_text())
    policy = "all" if drawn else data.get("plots")
    out = []
    for r in data["results"]:
        run_dir = root / r["scenario"]
        if not run_dir.is_dir():
            continue
        error = run_dir / PLOT_ERROR
        lines = error.read_text().splitlines() if error.is_file() else []
        errors = {p: line.split(": ", 1)[1] for line in lines for p in PLOTS if line.startswith(f"{p}: ")}
        other = "; ".join(line for line in lines if line.split(": ", 1)[0] not in PLOTS)  # an older version's
        tried = (policy == "all" or policy == "failed" and failed(r) or error.is_file()
                 or any((run_dir / f).is_file() for f in PLOTS.values()))
        if not tried:
            continue
        missing = []
        for plot, source in wanted(run_dir).items():
            if (run_dir / PLOTS[plot]).is_file() and plot not in errors:
                continue
            failure = errors.get(plot) or other
            why = (f"drawing it failed: {failure} ({r['scenario']}/{PLOT_ERROR})" if failure
                   else f"its run has {source}")
            missing.append(f"{r['scenario']}: no {plot} plot ({PLOTS[plot]}): {why}")
        out += missing or ([f"{r['scenario']}: {PLOT_ERROR}: {'; '.join(lines)}"] if lines else [])
    return out


def _fmt(v, digits: int = 1) -> str:
    return "" if v is None or isinstance(v, Undefined) or v != v else f"{v:.{digits}f}"


_env = Environment(autoescape=select_autoescape(default=True))
_env.filters["fmt"] = _fmt
# Verdicts beyond pass, fail and skipped (xfail, xpass, any a newer checker gives): ", 1 xfail".
_env.globals["shown"] = shown
_env.globals["trainer_text"] = trainer_text
_env.globals["others"] = lambda counts: "".join(f", {n} {v}" for v, n in sorted(counts.items())
                                                if v not in ("pass", "fail", "skipped") and n)
# Self-contained: inline CSS and script, plots as SVG files next to each scenario's history. It opens
# from the file system with no network.
# The timing columns, as the page names them; a value left empty says why (a row's ``timings_why``).
TIMINGS = {"time_to_detect_s": "detect (s)", "time_to_recover_s": "recover (s)", "save_s": "save (s)",
           "save_stall_s": "save stall (s)"}
_env.globals["TIMINGS"] = TIMINGS
_TEMPLATE = _env.from_string("""{% macro timing(r, key, digits=1) -%}
{% if r[key] is none and r.timings_why and r.timings_why[key] %}<td class="num why" title="{{ r.timings_why[key] }}">&ndash;</td>
{%- else %}<td class="num">{{ r[key]|fmt(digits) }}</td>{% endif %}
{%- endmacro %}<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>ckpt-chaos: {{ suite }}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; max-width: 1300px; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 4px 8px; vertical-align: top; }
th { background: #f3f3f3; cursor: pointer; user-select: none; } th:after { content: " \\2195"; color: #aaa; }
.pass { background: #e5f5e0; } .fail, .xpass { background: #fde0dd; } .skipped, li.warn { background: #fff7bc; }
.unknown { background: #e7e1ef; }
#audit-grid th { cursor: default; } #audit-grid th:after { content: none; }
.xfail { background: #e0ecf4; }
td.num { text-align: right; } td.why { color: #888; cursor: help; } #banner { padding: 1em; font-size: 1.3em; margin-bottom: 1em; border-radius: 6px; }
.family { display: inline-block; margin: 0 1em 0.5em 0; padding: 2px 8px; border-radius: 4px; }
section.scenario { border-top: 2px solid #ddd; margin-top: 2em; padding-top: 0.5em; }
section.scenario img { max-width: 100%; display: block; margin: 0.5em 0; }
pre { background: #f6f6f6; padding: 0.5em; white-space: pre-wrap; } ul.failed li { color: #a50f15; }
#filter { margin: 0.5em 0; padding: 4px; width: 30em; }
</style></head><body>
<h1>ckpt-chaos: suite <code>{{ suite }}</code></h1>
<div id="banner" class="{{ 'fail' if failing else ('skipped' if counts.skipped else 'pass') }}">
{% if failing %}{{ failing }} of {{ rows|length }} scenarios FAILED{% elif counts.skipped %}{{ counts.skipped }}
of {{ rows|length }} scenarios could not run here (skipped){% else %}all {{ rows|length }} scenarios passed{% endif %}
&middot; {{ counts.pass }} passed, {{ counts.fail }} failed, {{ counts.skipped }} skipped{{ others(counts) }} &middot; {{ wall_s|fmt }} s
&middot; {{ generated }} &middot; ckpt-chaos {{ tool_version }}</div>
<div id="families">{% for fam, c in families|dictsort %}<span class="family {{ 'fail' if c.fail or c.xpass else ('skipped' if c.skipped else 'pass') }}">
{{ fam }}: {{ c.pass or 0 }} passed{% if c.fail %}, {{ c.fail }} failed{% endif %}{% if c.skipped %}, {{ c.skipped }} skipped{% endif %}{{ others(c) }}</span>{% endfor %}</div>
{% if coverage %}<p id="coverage"><a href="coverage/index.html">Trainer coverage</a> under these scenarios{% if coverage.statements %}:
checkpoint path {{ coverage.line_percent|fmt }} % of lines, {{ coverage.branch_percent|fmt }} % of branches{% endif %}</p>{% endif %}
{% if grid %}<h2 id="audit">Audit: fault &times; point</h2>
<table id="audit-grid"><thead><tr><th>fault \\ point</th>{% for p in grid.points %}<th><code>{{ p }}</code></th>{% endfor %}</tr></thead><tbody>
{% for fault, cells in grid.rows %}<tr><th>{{ fault }}</th>{% for c in cells %}{% if not c %}<td></td>
{%- elif c.verdict == "left out" %}<td class="skipped" title="{{ c.detail }}">left out</td>
{%- else %}<td class="{{ c.verdict }}"{% if c.check or c.detail %} title="{{ (c.check ~ ': ' if c.check else '') ~ c.detail }}"{% endif %}><a href="#{{ c.scenario }}">{{ c.verdict }}</a>{% if c.check %}<br><small>{{ c.check }}</small>{% endif %}</td>
{%- endif %}{% endfor %}</tr>
{% endfor %}</tbody></table>{% endif %}
<input id="filter" placeholder="filter: a scenario name, verdict, fault kind or family" aria-label="filter">
<table id="scenarios"><thead><tr><th>scenario</th><th>verdict</th><th>faults</th><th>resumed from</th>
<th>launches</th><th>steps lost</th><th>detect (s)</th><th>recover (s)</th><th>save stall (s)</th><th>wall (s)</th></tr></thead><tbody>
{% for r in rows %}<tr class="{{ r.verdict }}" data-text="{{ r.scenario }} {{ r.verdict }} {{ r.families|join(' ') }} {{ r.kinds|join(' ') }} {{ r.tags|join(' ') }}">
<td><a href="#{{ r.scenario }}">{{ r.scenario }}</a></td><td>{{ r.verdict }}</td>
<td>{{ r.families|join(' ') }}: {{ r.kinds|join(' ') }}</td>
<td>{{ shown(r, 'resumed_from') }}</td>
<td class="num">{{ r.launches }}</td><td class="num">{{ shown(r, 'steps_lost') }}</td>
{{ timing(r, 'time_to_detect_s') }}{{ timing(r, 'time_to_recover_s') }}
{{ timing(r, 'save_stall_s', 3) }}<td class="num">{{ r.wall_s|fmt }}</td></tr>
{% endfor %}</tbody></table>
{% for r in rows %}<section class="scenario" id="{{ r.scenario }}">
<h2 class="{{ r.verdict }}">{{ r.scenario }}: {{ r.verdict }}</h2>
{% if r.reason %}<p><b>{{ r.reason }}</b></p>{% endif %}
{% if trainer_text(r) %}<p class="trainer">Trainer: <code>{{ trainer_text(r) }}</code>{% if r.trainer and r.trainer.source %}
(<code>{{ r.trainer.source }}</code>){% endif %}</p>{% endif %}
{% if r.timings_why %}<p class="timings">Not measured: {% for k, w in r.timings_why|dictsort %}<b>{{ TIMINGS.get(k, k) }}</b>: {{ w }}{% if not loop.last %}; {% endif %}{% endfor %}</p>{% endif %}
{% if r.failed %}<p>Diagnosis:</p><ul class="failed">{% for c in r.failed %}<li><b>{{ c.name }}</b>: {{ c.detail }}</li>{% endfor %}</ul>{% endif %}
{% if r.plots.loss %}<img class="plot" src="{{ r.scenario }}/{{ r.plots.loss }}" alt="loss of {{ r.scenario }} against the golden run">{% endif %}
{% if r.plots.timeline %}<img class="plot" src="{{ r.scenario }}/{{ r.plots.timeline }}" alt="timeline of {{ r.scenario }}">{% endif %}
<p>Reproduce: <code>ckpt-chaos run {{ r.scenario }}</code>{% if r.has_dir %}, or exactly this run's copy:
<code>ckpt-chaos run {{ r.scenario }}/scenario.toml</code>; re-check it: <code>ckpt-chaos check {{ r.scenario }}</code>
(<a href="{{ r.scenario }}/history.jsonl">history</a>, <a href="{{ r.scenario }}/torchrun.log">log</a>){% endif %}</p>
<details><summary>{{ r.checks|length }} checks</summary><ul>
{% for c in r.checks %}<li class="{{ c.verdict }}">{{ c.name }}: {{ c.detail }}</li>{% endfor %}</ul></details>
</section>{% endfor %}
<script>
// Sort by a column on click (numbers numerically); filter rows by the text box.
document.querySelectorAll("#scenarios th").forEach((th, col) => th.addEventListener("click", () => {
  const body = document.querySelector("#scenarios tbody");
  const rows = Array.from(body.rows);
  const dir = th.dataset.dir === "asc" ? -1 : 1;
  th.dataset.dir = dir === 1 ? "asc" : "desc";
  const key = r => { const t = r.cells[col].textContent.trim(); const n = parseFloat(t); return isNaN(n) ? t : n; };
  rows.sort((a, b) => { const x = key(a), y = key(b);
    return (typeof x === typeof y ? (x > y) - (x < y) : (typeof x === "number" ? -1 : 1)) * dir; });
  rows.forEach(r => body.appendChild(r));
}));
// For tests and for readers: how many plots failed to load (a missing or broken SVG file).
window.addEventListener("load", () => {
  const imgs = Array.from(document.querySelectorAll("img.plot"));
  document.body.dataset.plots = imgs.length;
  document.body.dataset.brokenPlots = imgs.filter(i => !i.complete || i.naturalWidth === 0).length;
});
document.getElementById("filter").addEventListener("input", e => {
  const q = e.target.value.toLowerCase();
  document.querySelectorAll("#scenarios tbody tr").forEach(r => {
    r.style.display = r.dataset.text.toLowerCase().includes(q) ? "" : "none"; });
});
</script>
</body></html>
""")
