"""Task and submission ids: version-4 UUID text, and keyed ids that never change across
releases (a retry after an upgrade must find the tasks its first attempt stored)."""
from __future__ import annotations

import os
import uuid

from lambdas.core.ids import _as_uuid4s, is_uuid, keyed_ids, new_ids


def test_bytes_become_exactly_what_uuid_renders():
    raw = os.urandom(16 * 5000) + bytes(16) + b"\xff" * 16
    assert _as_uuid4s(raw) == [str(uuid.UUID(bytes=raw[i:i + 16], version=4)) for i in range(0, len(raw), 16)]


def test_new_ids_are_distinct_version_4_uuids():
    ids = new_ids(10_000)
    assert len(set(ids)) == 10_000
    assert all(uuid.UUID(i).version == 4 and is_uuid(i) for i in ids[:100])


def test_keyed_ids_are_stable_across_releases():
    # values computed by the release before the fast formatting: they must never change
    assert keyed_ids("alice", "key-1", 2) == ["6cb72b2e-b359-489e-96c7-e37cdf603391",
                                              "74650f53-5133-4da6-8b9f-c636f0a16607"]
    assert keyed_ids("bob", "k", 1, "submission") == ["e1867fa5-462c-4d7b-894b-25cec1a1197a"]
    assert keyed_ids("alice", "key-1", 3)[:2] == keyed_ids("alice", "key-1", 2)
