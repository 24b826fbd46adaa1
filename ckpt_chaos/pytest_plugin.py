"""pytest plugin: every scenario file under a ``scenarios`` directory is a test item.

Registered through the ``pytest11`` entry point, so it is active wherever ckpt-chaos is installed:

    pytest scenarios                 # the whole catalogue
    pytest scenarios -m kill -n auto # only SIGKILL scenarios, in parallel (pytest-xdist)
    pytest scenarios -k mid_write

Each item carries markers for its fault families (``process``, ``storage``, ``node``, ``network``),
its fault kinds (``kill``, ``partition``, ...), its backend (``docker``, ``netns``), ``topology`` when
it resumes at another world size, and its tags (``-`` becomes ``_``). An invalid scenario file is a
collection error that names the file and key. A scenario whose fault this machine cannot inject
is skipped with the reason; a failed one shows its checks.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckpt_chaos.config import golden_dir, out_dir
from ckpt_chaos.scenario import FAMILIES, FAULT_KINDS, Scenario, load


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("ckpt-chaos")
    g.addoption("--chaos-out", default=str(out_dir() / "runs" / "pytest"),
                help="where scenario runs are written (one directory per xdist worker)")
    g.addoption("--chaos-golden", default=str(golden_dir()), help="cache of fault-free runs")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos: a ckpt-chaos scenario")
    for family in FAMILIES:
        config.addinivalue_line("markers", f"{family}: scenarios with {family} faults")
    for kind, (_, meaning) in FAULT_KINDS.items():
        config.addinivalue_line("markers", f"{kind}: {meaning}")
    config.addinivalue_line("markers", "docker: scenarios whose nodes are Docker containers")
    config.addinivalue_line("markers", "netns: scenarios whose nodes are plain network namespaces")
    config.addinivalue_line("markers", "topology: scenarios that resume at another world size")


def marker_name(label: str) -> str:
    return label.replace("-", "_").replace(".", "_")


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if file_path.suffix == ".toml" and "scenarios" in file_path.parts:
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


class ScenarioFile(pytest.File):
    def collect(self):
        scenario = load(self.path)  # a ScenarioError here is a collection error naming file and key
        item = ScenarioItem.from_parent(self, name=scenario.name, scenario=scenario)
        for label in ["chaos", *scenario.labels]:
            name = marker_name(label)
            self.config.addinivalue_line("markers", f"{name}: scenario label")
            item.add_marker(getattr(pytest.mark, name))
        yield item


class ScenarioFailed(AssertionError):
    pass


class ScenarioItem(pytest.Item):
    def __init__(self, *, scenario: Scenario, **kwargs):
        super().__init__(**kwargs)
        self.scenario = scenario

    def runtest(self) -> None:
        from ckpt_chaos.run.runner import run_scenario

        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        out = Path(self.config.getoption("chaos_out")) / worker
        result = run_scenario(self.scenario, out, Path(self.config.getoption("chaos_golden")))
        self.user_properties.append(("result", result.to_dict()))
        if result.verdict == "skipped":
            pytest.skip(result.reason)
        if result.verdict != "pass":
            lines = [f"scenario {self.scenario.name} failed (run in {result.run_dir}):"]
            lines += [f"  {c['verdict']:<4} {c['name']}: {c['detail']}" for c in result.checks]
            raise ScenarioFailed("\n".join(lines))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ScenarioFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, 0, f"scenario {self.scenario.name}: {self.scenario.description}"
