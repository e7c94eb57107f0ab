"""Task and submission ids: version-4 UUID text, and keyed ids that never change across
releases (a retry after an upgrade must find the tasks its first attempt stored)."""
from __future__ import annotations

import os
import uuid

from lambdas.core.ids import _as_uuid4s, is_uuid, keyed_ids, new_ids


def test_bytes_become_exactly_what_uuid_renders():
    raw = os.urandom(16 * 5000) + bytes(16) + b"\xff" * 16
    assert _as_uuid4s(raw) == [str(uuid.UUID(bytes=raw[i:i + 16], version=4)) for i in range(0, len(raw), 16)]


def test_new_ids_are_distinct_time_ordered_uuids():
    import time

    from skyfn.protocol.ids import time_ms

    before = int(time.time() * 1000)
    ids = new_ids(10_000)
    after = int(time.time() * 1000)
    assert len(set(ids)) == 10_000
    assert all(uuid.UUID(i).version == 7 and uuid.UUID(i).variant == uuid.RFC_4122 and is_uuid(i) for i in ids)
    assert all(before <= time_ms(i) <= after for i in ids)
    assert time_ms(str(uuid.uuid4())) is None and time_ms("not-an-id") is None


def test_keyed_ids_of_a_v7_key_carry_the_keys_time_and_are_stable():
    from skyfn.protocol.ids import time_ms, uuid7_hex

    key = uuid7_hex()
    ids = keyed_ids("alice", key, 3)
    assert ids == keyed_ids("alice", key, 3) and len(set(ids)) == 3  # a retry gets the same ids
    assert {time_ms(i) for i in ids} == {time_ms(key)} and ids != keyed_ids("bob", key, 3)


def test_keyed_ids_are_stable_across_releases():
    # values computed by the release before the fast formatting: they must never change
    assert keyed_ids("alice", "key-1", 2) == ["6cb72b2e-b359-489e-96c7-e37cdf603391",
                                              "74650f53-5133-4da6-8b9f-c636f0a16607"]
    assert keyed_ids("bob", "k", 1, "submission") == ["e1867fa5-462c-4d7b-894b-25cec1a1197a"]
    assert keyed_ids("alice", "key-1", 3)[:2] == keyed_ids("alice", "key-1", 2)
