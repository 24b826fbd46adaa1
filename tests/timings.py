"""The time of every test in view: a pytest plugin that ``make test`` loads (``-p tests.timings``).

At the end of the run it prints the run's phases (start and collection, the tests, the wall time),
the slowest tests (setup, call and teardown together: a session fixture's golden run counts in the
first test that asks for it) and the slowest files, and compares them with the previous run; it
writes every test's durations to ``--timings-json`` (``make test``: ``reports/timings/test.json``),
first moving the file it replaces to ``*.prev.json``, the run the next one compares against. Under
xdist it runs in the controller only, where every worker's reports arrive; each worker adds the CPU
time a test took, its own and its reaped children's (trainer launches), which a loaded machine
inflates far less than the wall time: the figure to cut when make test is over its budget. Nothing here asserts a
time: the figures are for people (and docs/benchmarks.md), never for a verdict.

    .venv/bin/python -m pytest -n 2 tests -p tests.timings --timings-json reports/timings/test.json
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from pathlib import Path

import pytest

SCHEMA = 1
SHOWN = 15  # slowest tests printed
FILES_SHOWN = 10


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("timings")
    g.addoption("--timings-json", metavar="PATH", default=None,
                help="write every test's durations to PATH (the file it replaces becomes PATH's .prev.json, "
                     "compared against) and print the slowest tests and files")
    g.addoption("--timings-shown", type=int, default=SHOWN, help=f"slowest tests printed (default {SHOWN})")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("timings_json") and not hasattr(config, "workerinput"):  # the controller, or no xdist
        config.pluginmanager.register(Timings(config), "ckpt-chaos-timings")


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    if not item.config.getoption("timings_json"):
        yield
        return
    item.stash[_CPU_AT_START] = _cpu_s()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    if call.when == "teardown" and _CPU_AT_START in item.stash:
        outcome.get_result().user_properties.append(("cpu_s", round(_cpu_s() - item.stash[_CPU_AT_START], 2)))


_CPU_AT_START = pytest.StashKey[float]()


def fmt(s: float) -> str:
    """Seconds as people read them: ``7 min 12 s``, ``42.1 s``."""
    return f"{int(s // 60)} min {s % 60:.0f} s" if s >= 60 else f"{s:.1f} s"


def git_commit(root: Path) -> dict | None:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())} if head.returncode == 0 else None


def machine() -> dict:
    return {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]}


def _process_start() -> float:
    """When this pytest process started (its interpreter's start and imports count in the wall time)."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - psutil is a dependency of ckpt-chaos, but the times are no verdict
        return time.time()


def prev_path(path: Path) -> Path:
    return path.with_name(path.stem + ".prev" + path.suffix)


class Timings:
    def __init__(self, config: pytest.Config):
        self.config = config
        self.path = Path(config.getoption("timings_json"))
        if not self.path.is_absolute():
            self.path = Path(config.invocation_params.dir) / self.path
        self.shown = config.getoption("timings_shown")
        self.tests: dict[str, dict] = {}
        self.started = _process_start()
        self.start_machine = machine()
        self.first = self.last = None

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        now = time.time()
        self.first = self.first or now - report.duration
        self.last = now
        t = self.tests.setdefault(report.nodeid, {"s": 0.0, "setup_s": 0.0, "call_s": 0.0, "teardown_s": 0.0,
                                                  "outcome": None, "slow": "slow" in report.keywords})
        t[f"{report.when}_s"] = round(t[f"{report.when}_s"] + report.duration, 3)
        t["s"] = round(t["setup_s"] + t["call_s"] + t["teardown_s"], 3)
        worker = getattr(getattr(report, "node", None), "gateway", None)
        if worker is not None:
            t["worker"] = worker.id
        t["outcome"] = _outcome(report, t["outcome"])
        for key, value in report.user_properties:
            if key == "cpu_s":
                t["cpu_s"] = value

    def record(self, exitstatus: int) -> dict:
        end = time.time()
        workers = self.config.getoption("numprocesses", None) if self.config.pluginmanager.hasplugin("xdist") else None
        first = self.first or end
        return {
            "schema": SCHEMA, "what": "pytest", "args": list(self.config.invocation_params.args),
            "revision": git_commit(Path(self.config.rootpath)), "machine": {**self.start_machine, "loadavg_end": machine()["loadavg"]},
            "workers": workers, "started": round(self.started, 1),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started)),
            "exit_status": int(exitstatus), "wall_s": round(end - self.started, 1),
            "phases": {"start_and_collection_s": round(first - self.started, 1),
                       "tests_s": round((self.last or end) - first, 1),
                       "teardown_and_summary_s": round(end - (self.last or end), 1)},
            "test_time_s": round(sum(t["s"] for t in self.tests.values()), 1),
            "test_cpu_s": round(sum(t.get("cpu_s", 0) for t in self.tests.values()), 1),
            "counts": _counts(self.tests), "tests": dict(sorted(self.tests.items())),
        }

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter, exitstatus: int) -> None:
        rec = self.record(exitstatus)
        prev = None
        if self.path.exists():
            try:
                prev = json.loads(self.path.read_text())
            except (OSError, ValueError):
                prev = None
            self.path.replace(prev_path(self.path))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(rec, indent=1) + "\n")
        for line in summary(rec, prev, self.shown):
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"timings written to {self.path}" + (f" (the last run's: {prev_path(self.path)})"
                                                                         if prev else ""))


def _outcome(report: pytest.TestReport, before: str | None) -> str | None:
    """What pytest's summary line calls the test, from its setup, call and teardown reports."""
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            return "xfailed" if report.skipped else "xpassed"
        return report.outcome
    if report.failed:
        return "error"
    if report.when == "setup" and report.skipped:
        return "skipped"
    return before


def _counts(tests: dict[str, dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tests.values():
        out[t["outcome"]] = out.get(t["outcome"], 0) + 1
    return dict(sorted(out.items()))


def by_file(tests: dict[str, dict]) -> dict[str, tuple[int, float]]:
    out: dict[str, list] = {}
    for nodeid, t in tests.items():
        f = out.setdefault(nodeid.split("::")[0], [0, 0.0])
        f[0] += 1
        f[1] += t["s"]
    return {k: (n, s) for k, (n, s) in sorted(out.items(), key=lambda kv: -kv[1][1])}


def summary(rec: dict, prev: dict | None, shown: int = SHOWN) -> list[str]:
    """The lines printed at the end of a run: phases, tiers, slowest tests and files, the change since ``prev``."""
    tests, ph = rec["tests"], rec["phases"]
    slow = [t["s"] for t in tests.values() if t["slow"]]
    rest = [t["s"] for t in tests.values() if not t["slow"]]
    counts = ", ".join(f"{n} {k}" for k, n in rec["counts"].items())
    lines = [f"==== timings: {len(tests)} tests ({counts}) in {fmt(rec['wall_s'])} of wall time, "
             f"{fmt(rec['test_time_s'])} of test time on {rec['workers'] or 1} worker(s); load average "
             f"{rec['machine']['loadavg'][0]:.1f} at the start, {rec['machine']['loadavg_end'][0]:.1f} at the end "
             f"on {rec['machine']['cpus']} cores ====",
             f"phases: start and collection {fmt(ph['start_and_collection_s'])}, tests {fmt(ph['tests_s'])}, "
             f"teardown and summary {fmt(ph['teardown_and_summary_s'])}",
             f"tiers: {len(rest)} unit and light tests {fmt(sum(rest))} (median {_median(rest):.2f} s); "
             f"{len(slow)} slow-marked (real training) {fmt(sum(slow))} (median {_median(slow):.1f} s)"]
    before = prev["tests"] if prev else {}
    lines.append(f"slowest {min(shown, len(tests))} tests (setup + call + teardown"
                 + (", change since the last run" if prev else "") + "):")
    for nodeid, t in sorted(tests.items(), key=lambda kv: -kv[1]["s"])[:shown]:
        was = before.get(nodeid, {}).get("s")
        delta = f"  ({t['s'] - was:+.1f} s)" if was is not None else "  (new)" if prev else ""
        lines.append(f"  {t['s']:7.1f} s  {nodeid}{delta}")
    lines.append("slowest files:")
    for f, (n, s) in list(by_file(tests).items())[:FILES_SHOWN]:
        lines.append(f"  {s:7.1f} s  {f} ({n} tests)")
    if prev:
        same = [k for k in tests if k in before]
        moved = sorted(same, key=lambda k: -abs(tests[k]["s"] - before[k]["s"]))[:5]
        rev = (prev.get("revision") or {}).get("commit", "?")
        lines.append(f"since the last run (at {rev}, {prev.get('started_at', '?')}): wall {fmt(prev['wall_s'])} -> "
                     f"{fmt(rec['wall_s'])}, test time {fmt(prev['test_time_s'])} -> {fmt(rec['test_time_s'])}; "
                     f"{len(set(tests) - set(before))} tests new, {len(set(before) - set(tests))} gone")
        for k in moved:
            lines.append(f"  {before[k]['s']:7.1f} s -> {tests[k]['s']:7.1f} s  {k}")
    return lines


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return 0.0 if not xs else xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2
