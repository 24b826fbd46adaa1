"""pytest plugin: ckpt-chaos scenario files as test items, in the projects that ask for them.

Installing ckpt-chaos registers this plugin (the ``pytest11`` entry point), but in a project that
does not ask it only adds its options: it collects nothing, registers no marker, imports nothing
of the harness. It is active with either

* ``--chaos`` on the command line: every ``*.toml`` file under the paths given to pytest is a
  scenario (``pyproject.toml`` excepted)::

      pytest --chaos ckpt_chaos/scenarios                  # the whole built-in catalogue
      pytest --chaos chaos/ -m "kill and mid_write" -n 2   # some of a project's, in parallel

* or the ``chaos_scenarios`` ini option: folders (relative to the ini file) whose ``*.toml`` files
  are scenarios, collected when pytest walks them (list them in ``testpaths`` too, or name them)::

      [tool.pytest.ini_options]
      chaos_scenarios = ["chaos/scenarios"]
      testpaths = ["tests", "chaos/scenarios"]

As ``ckpt-chaos list`` and ``run`` in a project take its own folders only (``--builtin`` adds the
built-in catalogue), the plugin collects the built-in catalogue only when its folder is named
(``pytest --chaos ckpt_chaos/scenarios``). Scenario files load as for the CLI (``scenario.load``), so a
project's file without ``suites`` is in ``full`` only there too.

Each item carries markers for its fault families (``process``, ``storage``, ``node``, ``network``, ``scheduler``),
its fault kinds (``kill``, ``partition``, ...), its backend (``docker``, ``netns``), ``topology`` when
it resumes at another world size, and its tags (``-`` becomes ``_``): ``-m "kill and mid_write"``.
An invalid scenario file is a collection error that names the file and key. A scenario whose fault
this machine cannot inject is skipped with the reason; a failed one shows its checks.

A scenario kept to document a bug declares the check it fails (``expect.known_failure``): when that
check fails the item is an expected failure (xfail, the reason names the check); when it does not,
the item fails as ``[XPASS(strict)]``, so that a fixed bug is noticed and the declaration removed.

With ``--junitxml`` each testcase carries properties ``verdict``, ``run_dir``, ``trainer_revision``
and one ``check NAME`` per check, valued ``VERDICT: what was seen``.

Options: ``--chaos-out DIR`` where runs go (default: ``OUT/runs/pytest``, OUT as for the CLI: the
``CKPT_CHAOS_OUT`` variable, the project's ``[tool.ckpt-chaos] out``, else the current directory;
one folder per xdist worker), ``--chaos-golden DIR`` the cache of fault-free runs (default: the
user cache, moved by ``CKPT_CHAOS_CACHE``).

Under ``-n`` (xdist) the workers admit scenarios as ``ckpt-chaos run -n`` does: at most two ranks per
core together, timing-sensitive scenarios and those on Docker or netns nodes alone (``ckpt_chaos/run/parallel.py``); an
item may wait for its turn.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("ckpt-chaos")
    g.addoption("--chaos", action="store_true",
                help="collect the *.toml files under the given paths as ckpt-chaos scenarios")
    g.addoption("--chaos-out", default=None,
                help="where scenario runs are written (default: OUT/runs/pytest; one folder per xdist worker)")
    g.addoption("--chaos-golden", default=None,
                help="cache of fault-free runs (default: $CKPT_CHAOS_CACHE/golden or the user cache)")
    parser.addini("chaos_scenarios", type="paths", default=[],
                  help="ckpt-chaos: folders whose *.toml files are scenarios (activates the plugin)")


def active(config: pytest.Config) -> bool:
    return bool(config.getoption("chaos") or config.getini("chaos_scenarios"))


def pytest_configure(config: pytest.Config) -> None:
    if not active(config):
        return
    from ckpt_chaos.scenario import FAMILIES, FAULT_KINDS

    config.addinivalue_line("markers", "chaos: a ckpt-chaos scenario")
    for family in FAMILIES:
        config.addinivalue_line("markers", f"{family}: scenarios with {family} faults")
    for kind, (_, meaning) in FAULT_KINDS.items():
        config.addinivalue_line("markers", f"{kind}: {meaning}")
    config.addinivalue_line("markers", "docker: scenarios whose nodes are Docker containers")
    config.addinivalue_line("markers", "netns: scenarios whose nodes are plain network namespaces")
    config.addinivalue_line("markers", "slurm: scenarios run as jobs of a throwaway Slurm cluster")
    config.addinivalue_line("markers", "topology: scenarios that resume at another world size")


def marker_name(label: str) -> str:
    return label.replace("-", "_").replace(".", "_")


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    # pyproject.toml is pytest's own configuration, never a scenario, and often under the paths given.
    if file_path.suffix != ".toml" or file_path.name == "pyproject.toml":
        return None
    config = parent.config
    if config.getoption("chaos") or any(file_path.resolve().is_relative_to(Path(d).resolve())
                                        for d in config.getini("chaos_scenarios")):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


class ScenarioFile(pytest.File):
    def collect(self):
        from ckpt_chaos.scenario import load

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
    def __init__(self, *, scenario, **kwargs):
        super().__init__(**kwargs)
        self.scenario = scenario

    def _dirs(self) -> tuple[Path, Path]:
        from ckpt_chaos import config as cfg

        out = self.config.getoption("chaos_out")
        out = Path(out) if out else cfg.out_dir(None, cfg.project_config(self.config.rootpath)) / "runs" / "pytest"
        golden = self.config.getoption("chaos_golden")
        return out / os.environ.get("PYTEST_XDIST_WORKER", "main"), Path(golden) if golden else cfg.golden_dir()

    def _admitted(self, shared: Path):
        """Under xdist, the admission of ``ckpt-chaos run -n``: the workers take the machine's rank
        budget from lock files in the output folder they share, and a timing-sensitive or multi-node
        scenario waits until it has the machine to itself (ckpt_chaos/run/parallel.py)."""
        import contextlib

        if not os.environ.get("PYTEST_XDIST_WORKER"):
            return contextlib.nullcontext()
        from ckpt_chaos.run.parallel import Slots, weight

        return Slots(shared / ".admission").hold(weight(self.scenario))

    def runtest(self) -> None:
        from ckpt_chaos.report import results
        from ckpt_chaos.run.runner import run_scenario

        out, golden = self._dirs()
        with self._admitted(out.parent):
            row = results.scenario_row(run_scenario(self.scenario, out, golden), self.scenario)
        rev = row.get("trainer_revision")
        self.user_properties += [("verdict", row["verdict"]), ("run_dir", row["run_dir"]),
                                 ("trainer_revision", f"{rev['commit']}{' (dirty)' if rev['dirty'] else ''}"
                                  if rev else "not in git")]
        self.user_properties += [(f"check {c['name']}", f"{c['verdict']}: {c['detail']}") for c in row["checks"]]
        verdict = row["verdict"]
        if verdict == "skipped":
            pytest.skip(row["reason"])
        if verdict == "xfail":
            pytest.xfail(row["reason"])
        if verdict == "pass":
            return
        if not results.failed(row):  # unknown, as the scenario allows
            pytest.skip(f"unknown, as the scenario allows ({row['may_be_unknown']}): {row['reason']}")
        head = (f"[XPASS(strict)] scenario {self.scenario.name}: {row['reason']}" if verdict == "xpass" else
                f"scenario {self.scenario.name} could not tell (run in {row['run_dir']}):" if verdict == "unknown"
                else f"scenario {self.scenario.name} failed (run in {row['run_dir']}):")
        raise ScenarioFailed(f"{head}\n{results.check_lines(row)}")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ScenarioFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, 0, f"scenario {self.scenario.name}: {self.scenario.description}"
