"""The one patch of hypothesis's internals the search makes, and why.

hypothesis (6.1xx) draws about one integer in twenty from the constants it finds in the project's
modules present in ``sys.modules`` (``providers._get_local_constants``), a pool that grows as
modules are imported: the same seed drew other schedules from the CLI, from a benchmark and from a
test, and could change mid-search when a run imported a module lazily (measured with 6.170: without
the patch, three seeds' schedules parted within their first 2 to 26 schedules once the process had
imported the CLI and the report). hypothesis has no setting for it, so the pool is emptied while the
search runs. ``tests/test_hypothesis_compat.py`` fails when a release renames or reshapes what is
patched here; until then, if the hook is gone, nothing is patched and the search goes on, seeds
drawing with whatever the process imported.
"""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def fixed_constants() -> Iterator[None]:
    """Make a seed draw the same schedules whatever the process imported: inside, hypothesis's pool of
    the project's constants is empty (its global constants stay)."""
    from hypothesis.internal.conjecture import providers

    hook = getattr(providers, "_get_local_constants", None)
    if hook is None:
        yield
        return
    empty = providers.Constants()
    providers._get_local_constants = lambda: empty
    providers.CONSTANTS_CACHE.cache.clear()  # may hold the permitted values of the pool seen so far
    try:
        yield
    finally:
        providers._get_local_constants = hook
        providers.CONSTANTS_CACHE.cache.clear()
