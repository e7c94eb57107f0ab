"""Eviction is the owner's (issue 36), from bob's side: bob marks his copy of a ref alice shared
with him `evict=True` and resolves it through her peer-ref broker; he reads it and her object
stays (her own resolve after his still works). A ref alice herself made use-once (evict=True,
signed into its capability) is removed by bob's resolve, as she asked. dave is served."""
from __future__ import annotations

import pytest

from skyfn import Executor
from tests.mu_endpoint.tenant import third_user_served


def make_refs(reader):
    from skyfn.data import default_store

    store = default_store()
    kept = store.ref(list(range(1000)), share_with=[reader], ttl=600)
    once = store.ref(list(range(10)), share_with=[reader], ttl=600, evict=True)
    return kept, once


def marked_evict(ref):
    """bob's task: his copy of the ref, marked evict=True, resolved."""
    import dataclasses

    from skyfn.data.ref import Ref, ref_info

    forged = Ref(dataclasses.replace(ref_info(ref), evict=True))
    return sum(forged)


def total(ref):
    return sum(ref)


def test_a_readers_evict_removes_nothing_and_the_owners_use_once_ref_goes(site):
    third_user_served(site)
    alice, bob = site.user("alice"), site.user("bob")
    ea = Executor(endpoint_id=site.endpoint_id, client=alice)
    eb = Executor(endpoint_id=site.endpoint_id, client=bob)
    try:
        kept, once = ea.submit(make_refs, "bob-id").result(timeout=120)
        assert eb.submit(marked_evict, kept).result(timeout=120) == sum(range(1000))
        assert eb.submit(marked_evict, kept).result(timeout=120) == sum(range(1000))  # still there for him
        assert ea.submit(total, kept).result(timeout=120) == sum(range(1000))  # and for its owner
        third_user_served(site)
        assert eb.submit(total, once).result(timeout=120) == sum(range(10))  # use-once, as alice signed it
        with pytest.raises(Exception) as info:
            ea.submit(total, once).result(timeout=120)
        assert "no such object" in str(info.value), info.value
    finally:
        ea.shutdown()
        eb.shutdown()
        alice.close()
        bob.close()
