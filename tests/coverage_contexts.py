"""Per-test coverage contexts for ``make test-coverage`` (loaded with ``-p tests.coverage_contexts``).

The test's node id becomes the coverage context of the pytest worker and, through the environment
that tests/coverage.ini reads, of every process the test starts, so that the data says which test
reached each line and branch of ckpt_chaos/ (``coverage report --contexts``, or the HTML report's
"show contexts"). A rank forked from a launcher agent's spare carries the context of the test that
started the spare: the totals are exact, a line's test is a hint.
"""

from __future__ import annotations

import os

import pytest

ENV = "COVERAGE_CKPT_CHAOS_CONTEXT"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    os.environ[ENV] = item.nodeid
    import coverage

    cov = coverage.Coverage.current()
    if cov is not None:
        cov.switch_context(item.nodeid)
