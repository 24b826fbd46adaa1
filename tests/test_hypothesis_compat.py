"""The private names of hypothesis that the search patches (ckpt_chaos/search/_hypothesis_compat.py).

A hypothesis release that renames or reshapes them fails here: the patch would otherwise do nothing
without a word, and a seed would draw other schedules depending on what the process imported.
"""

from __future__ import annotations

import inspect

from hypothesis.internal.conjecture import providers

from ckpt_chaos.search._hypothesis_compat import fixed_constants


def test_the_local_constants_hook_is_where_the_patch_expects_it_and_shaped_so():
    hook = providers._get_local_constants
    assert callable(hook) and not inspect.signature(hook).parameters
    assert isinstance(hook(), providers.Constants)
    empty = providers.Constants()
    assert not any(empty.set_for_type(t) for t in ("integer", "float", "bytes", "string"))
    assert callable(providers.CONSTANTS_CACHE.cache.clear)


def test_inside_fixed_constants_a_provider_draws_from_an_empty_pool_and_the_hook_comes_back(monkeypatch):
    # as if the process had imported modules full of small numbers
    monkeypatch.setattr(providers, "_get_local_constants", lambda: providers.Constants(integers={7, 11}))
    hook = providers._get_local_constants
    assert providers.HypothesisProvider(None)._local_constants.integers == {7, 11}
    with fixed_constants():
        # the provider looks the hook up in its module when it first needs constants
        pool = providers.HypothesisProvider(None)._local_constants
        assert isinstance(pool, providers.Constants) and not pool.integers
    assert providers._get_local_constants is hook
