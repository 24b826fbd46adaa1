"""Fixtures shared by the tests: fault-free (golden) runs made once per pytest run, whatever the worker;
launcher agents kept warm from test to test."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from ckpt_chaos.scenario import Scenario, load
from tests.helpers import REPO, final_state, log_tail, train


# The planted matrix's items run for minutes each: first, so that the run does not end on one of them
# while the other workers idle (xdist's worksteal hands out consecutive chunks, then halves of queues).
LONGEST_FIRST = "tests/test_planted_matrix.py::test_each_planted_trainer_against_the_default_suite"


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not item.nodeid.startswith(LONGEST_FIRST))  # stable: the rest keep their order


def pytest_configure(config):
    config.addinivalue_line("markers", "nightly: only in `make test-full` (nightly); `make test` deselects it "
                                       "(-m 'not nightly'): what another test of make test already asserts or reaches")


@pytest.fixture(scope="session")
def command_golden_root(tmp_path_factory) -> Path:
    """Where golden runs go, shared by every test module and worker of this pytest run: ``golden_run``
    makes each key (trainer, configuration, world size) once, under a lock, and the others wait for it.
    Named for the [command] trainers it was made for; ``golden_root`` is the same folder."""
    base = tmp_path_factory.getbasetemp()
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    root = base.parent / f"command-golden-{uid}" if uid else base / "command-golden"
    root.mkdir(parents=True, exist_ok=True)
    return root


@pytest.fixture(scope="session")
def golden_root(command_golden_root) -> Path:
    """The golden-run cache of ``run_scenario`` and ``--golden-dir``, shared by every module and worker."""
    return command_golden_root


@pytest.fixture(scope="session")
def golden(command_golden_root):
    """Fault-free runs of the reference trainer with ``tests.helpers.BASE``, made once per pytest run and
    world size, under a lock, whichever worker asks first."""
    from filelock import FileLock

    def get(nproc: int) -> Path:
        run_dir = command_golden_root / f"reference-golden{nproc}"
        with FileLock(f"{run_dir}.lock"):
            if final_state(run_dir) is None:
                shutil.rmtree(run_dir, ignore_errors=True)
                rc = train(run_dir, nproc)
                assert rc == 0, log_tail(run_dir)
                assert final_state(run_dir) is not None
        return run_dir

    return get


@dataclass(frozen=True)
class StoredRun:
    """A scenario run made once per pytest run, to be read (never changed: copy what a test changes)."""

    scenario: Scenario
    suite: Path  # the suite folder the run directory is in (reports/<suite>/<time> as the CLI leaves it)
    run_dir: Path
    golden: Path
    row: dict  # its row of results.json, as the run's result.json has it

    @property
    def result(self):
        """The row as the ``Result`` that ``run_scenario`` returned."""
        from dataclasses import fields

        from ckpt_chaos.run.runner import Result

        return Result(**{f.name: self.row[f.name] for f in fields(Result) if f.name in self.row})


def stored_run(root: Path, scenario: Scenario, golden_root: Path) -> StoredRun:
    """``scenario`` run once under ``root`` by whichever test worker asks first, the others waiting for it."""
    from filelock import FileLock

    from ckpt_chaos.report import results
    from ckpt_chaos.run.runner import run_scenario

    suite = root / scenario.name
    done = suite / scenario.name / "result.json"
    with FileLock(f"{suite}.lock"):
        if not done.is_file():
            shutil.rmtree(suite, ignore_errors=True)
            results.scenario_row(run_scenario(scenario, suite, golden_root), scenario)  # writes result.json
    row = json.loads(done.read_text())
    run_dir = Path(row["run_dir"])
    return StoredRun(scenario, suite, run_dir, (run_dir / "golden").resolve(), row)


@pytest.fixture(scope="session")
def stored_root(command_golden_root) -> Path:
    root = command_golden_root.parent / command_golden_root.name.replace("command-golden", "stored-runs")
    root.mkdir(parents=True, exist_ok=True)
    return root


@pytest.fixture(scope="session")
def plain_ddp_mid_write(stored_root, command_golden_root) -> StoredRun:
    """The plain DDP example, unmodified, with rank 0 killed half-way through its 2nd checkpoint file: a
    passing run, made once and checked many ways (tests/test_any_trainer.py, test_evidence.py,
    test_report_any_trainer.py)."""
    return stored_run(stored_root, load(REPO / "examples" / "plain_ddp" / "scenarios"
                                        / "plain-ddp-kill-rank0-mid-file-write.toml"), command_golden_root)


@pytest.fixture(scope="session")
def reference_mid_write(stored_root, golden_root) -> StoredRun:
    """The reference trainer with rank 1 killed half-way through its shard of the 2nd checkpoint
    (kill-rank1-mid-shard-write): a passing run, made once, read by tests/test_harness_planted_bugs.py
    and test_report.py."""
    from ckpt_chaos.config import builtin_scenarios

    return stored_run(stored_root, load(builtin_scenarios() / "process" / "kill-rank1-mid-shard-write.toml"),
                      golden_root)


PLANTED = "tests.planted."


@pytest.fixture(scope="session", autouse=True)
def launcher_agents_kept_warm():
    """The launcher's warm agents (spares) serve test after test, as they serve scenario after
    scenario in one ``ckpt-chaos run``. A spare is kept per module and start environment; pytest
    changes ``PYTEST_CURRENT_TEST`` in the environment at every test, which left no spare usable by the
    next test: each test's first launch paid an import of torch (seconds). Here that variable is no
    part of a spare's environment. And a planted trainer (``tests.planted.X``) is the reference trainer
    with one function replaced when ``python -m tests.planted.X`` runs, so its ranks are forked from the
    reference trainer's spare, which has imported what they need: the planted module itself runs in
    the forked rank, as it does under a spare of its own, and its replacement stays there. What a
    spare is per module and environment is tested in tests/test_launcher.py, without this."""
    from ckpt_chaos.env import launcher

    key, start = launcher._Spares._key, launcher._Spares._start

    def warm_as(module: str, env: dict[str, str]) -> tuple[str, dict[str, str]]:
        return ("reference_trainer" if module.startswith(PLANTED) else module,
                {k: v for k, v in env.items() if k != "PYTEST_CURRENT_TEST"})

    patch = pytest.MonkeyPatch()
    patch.setattr(launcher._Spares, "_key", staticmethod(lambda module, env: key(*warm_as(module, env))))
    patch.setattr(launcher._Spares, "_start", lambda self, module, env: start(self, *warm_as(module, env)))
    yield
    patch.undo()
