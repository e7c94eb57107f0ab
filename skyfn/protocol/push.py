"""The results push of the WebSocket API: the messages both ends speak (DESIGN.md 2, step 7).

Connect with the REST API's token (``Authorization: Bearer <token>`` header, or the
``token`` query parameter for browsers, which cannot set headers on a WebSocket), then:

client -> service   ``{"action": "subscribe"}`` or ``{"action": "subscribe", "peek": true}``
service -> client   ``{"type": "subscribed", "cursor": C}``: C is the owner's completion
                    stream position at subscription time; every completion after C is pushed.
                    Results inside a push delivered to a connection subscribed without peek
                    count as retrieved (the service drops them SKYFN_RESULT_TTL later); a peek
                    connection (the status page, `skyfn task watch`) gets the same pushes
                    and consumes nothing.
service -> client   ``{"type": "done", "prev": P, "cursor": C, "ids": [...], "tasks": [...]}``:
                    one entry of the owner's completion stream (the ids that became final
                    together), with the status of those whose result is small (``tasks``:
                    TaskStatus dicts, as POST /tasks/status answers them). P is the entry
                    just before it: a client whose cursor is not P has missed something and
                    catches up with POST /tasks/status (a *gap*).
service -> client   ``{"type": "error", "message": ...}``

Cursors are Redis stream ids (``"ms-seq"``), the same ones POST /tasks/status returns, so a
client moves between push and long-poll without losing its place.
"""
from __future__ import annotations

from typing import Any, Iterable

import orjson

PATH = "/ws"
# A result up to this size travels inside the push; larger ones are fetched with /tasks/status.
INLINE_RESULT_BYTES = 8 << 10
# API Gateway WebSocket messages are at most 128 KiB: stay below with the ids and framing.
MAX_MESSAGE_BYTES = 120 << 10
CHANNEL_PREFIX = "push:"  # the embedded runtime's Redis pub/sub channel of an owner


def subscribe_peek(msg: dict[str, Any]) -> bool:
    """The ``peek`` of a subscribe message (absent: False); ValueError if it is not a boolean."""
    peek = msg.get("peek", False)
    if not isinstance(peek, bool):
        raise ValueError('"peek" must be true or false')
    return peek


def cursor_key(cursor: str | None) -> tuple[int, int]:
    """A stream id as a comparable pair; None or garbage sorts first."""
    if not cursor:
        return (-1, -1)
    try:
        ms, _, seq = cursor.partition("-")
        return (int(ms), int(seq or 0))
    except ValueError:
        return (-1, -1)


def done_message(prev: str, cursor: str, ids: list[str], statuses: Iterable[dict[str, Any]],
                 max_bytes: int = MAX_MESSAGE_BYTES) -> bytes:
    """One completion-stream entry as a push message: every id, plus as many small
    statuses as fit in ``max_bytes`` (the rest are fetched by the client)."""
    statuses = list(statuses)
    whole = orjson.dumps({"type": "done", "prev": prev, "cursor": cursor, "ids": ids, "tasks": statuses})
    if len(whole) <= max_bytes:  # the usual case: everything fits, measured by encoding once
        return whole
    budget = max_bytes - 64 - len(prev) - len(cursor) - sum(len(i) + 3 for i in ids)
    tasks = []
    for st in statuses:  # a bound on the encoded size, without encoding each status twice
        size = 64 + sum(len(k) + 2 * len(v) if isinstance(v, str) else 16 for k, v in st.items())
        if size > budget:
            continue
        budget -= size
        tasks.append(st)
    return orjson.dumps({"type": "done", "prev": prev, "cursor": cursor, "ids": ids, "tasks": tasks})


def small_status(task_id: str, state: str, result: str | None, error: str | None, reason: str | None,
                 is_ref) -> dict[str, Any] | None:
    """The TaskStatus of a task pushed with its result, or None when the result must be
    fetched (too large, or a reference to object storage)."""
    st: dict[str, Any] = {"task_id": task_id, "state": state}
    size = 0
    if result is not None:
        if is_ref(result):
            return None
        st["result"] = result
        size += len(result)
    if error is not None:
        st["error"] = error
        size += len(error)
    if reason is not None:
        st["reason"] = reason
    return st if size <= INLINE_RESULT_BYTES else None
