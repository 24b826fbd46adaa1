"""Fixtures shared by the tests: fault-free (golden) runs computed once per worker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import final_state, log_tail, train


def pytest_configure(config):
    config.addinivalue_line("markers", "nightly: only in `make test-full` (nightly); `make test` deselects it "
                                       "(-m 'not nightly'): what another test of make test already asserts or reaches")


@pytest.fixture(scope="session")
def golden(tmp_path_factory):
    """Fault-free runs, computed once per test worker and world size."""
    cache: dict[int, Path] = {}

    def get(nproc: int) -> Path:
        if nproc not in cache:
            run_dir = tmp_path_factory.mktemp(f"golden{nproc}")
            rc = train(run_dir, nproc)
            assert rc == 0, log_tail(run_dir)
            assert final_state(run_dir) is not None
            cache[nproc] = run_dir
        return cache[nproc]

    return get



@pytest.fixture(scope="session")
def command_golden_root(tmp_path_factory) -> Path:
    """Where [command] trainers' golden runs go, shared by every test worker of this pytest run:
    ``golden_run`` makes each key once, under a lock, and the others wait for it."""
    base = tmp_path_factory.getbasetemp()
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    root = base.parent / f"command-golden-{uid}" if uid else base / "command-golden"
    root.mkdir(parents=True, exist_ok=True)
    return root
