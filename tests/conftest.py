"""Fixtures shared by the tests: fault-free (golden) runs computed once per worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import final_state, log_tail, train


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

