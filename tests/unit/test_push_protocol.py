"""The results push's message and cursor rules (skyfn.protocol.push, skyfn.push.follow)."""
from __future__ import annotations

import orjson

from skyfn.protocol.push import INLINE_RESULT_BYTES, cursor_key, done_message, small_status
from skyfn.push import follow, ws_url


def test_cursor_order_and_follow():
    assert cursor_key("1700000000000-5") < cursor_key("1700000000000-12") < cursor_key("1700000000001-0")
    assert cursor_key(None) < cursor_key("0-0") and cursor_key("junk") == (-1, -1)
    # contiguous: the entry's prev is our cursor
    assert follow("5-0", "5-0", "6-0") == ("6-0", False)
    # old news: at or before our cursor (a status read already covered it)
    assert follow("9-0", "5-0", "6-0") == ("9-0", False)
    assert follow("6-0", "5-0", "6-0") == ("6-0", False)
    # a gap: something between our cursor and this entry was not pushed to us
    assert follow("5-0", "7-0", "8-0") == ("5-0", True)
    assert follow(None, "0-0", "1-0") == (None, True)


def test_done_message_inlines_what_fits_and_lists_every_id():
    ids = [f"t{i}" for i in range(50)]
    statuses = [{"task_id": t, "state": "SUCCEEDED", "result": "json 3.11\n" + "x" * 1000} for t in ids]
    msg = orjson.loads(done_message("1-0", "2-0", ids, statuses, max_bytes=20_000))
    assert msg["type"] == "done" and msg["prev"] == "1-0" and msg["cursor"] == "2-0" and msg["ids"] == ids
    assert 0 < len(msg["tasks"]) < 50  # the rest are fetched by the client
    assert len(done_message("1-0", "2-0", ids, statuses, max_bytes=20_000)) <= 20_000
    everything = orjson.loads(done_message("1-0", "2-0", ids, statuses))
    assert len(everything["tasks"]) == 50


def test_small_status_leaves_large_and_stored_results_out():
    is_ref = lambda r: r.startswith("ref ")  # noqa: E731
    assert small_status("a", "SUCCEEDED", "json 3.11\n1", None, None, is_ref) == {
        "task_id": "a", "state": "SUCCEEDED", "result": "json 3.11\n1"}
    assert small_status("a", "SUCCEEDED", "x" * (INLINE_RESULT_BYTES + 1), None, None, is_ref) is None
    assert small_status("a", "SUCCEEDED", "ref s3://b/k", None, None, is_ref) is None
    assert small_status("a", "FAILED", None, "err", "why", is_ref) == {
        "task_id": "a", "state": "FAILED", "error": "err", "reason": "why"}


def test_ws_url_follows_the_service_url():
    assert ws_url("http://127.0.0.1:8080") == "ws://127.0.0.1:8080/ws"
    assert ws_url("https://api.example.org/") == "wss://api.example.org/ws"
