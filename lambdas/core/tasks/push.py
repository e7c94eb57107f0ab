"""The results push (DESIGN.md 2, step 7): once tasks reach a final state, their owners'
WebSocket connections are told (skyfn.protocol.push). Every final-state write of the store
returns its Notices (results, memo hits, cancels, expired leases, dead letters, tasks failed
at submission); their writers pass them to `notify`. Two adapters behind it, chosen by
SKYFN_PUSH:

- ``redis`` (the embedded runtime's default): PUBLISH on ``push:<owner>``
  (lambdas/adapters/redis_store/push_channel.py); the local gateway's hub
  (infra/local/standins/push_hub.py) fans the message out to the owner's connections;
- ``apigw`` (AWS): the owner's subscribed connections from the connection table
  (SKYFN_CONNECTION_TABLE: owner, connection_id, subscribed, peek, expires = TTL) and the API
  Gateway Management API's PostToConnection (SKYFN_WS_ENDPOINT, the stage's https URL);
  connections that are gone are deleted; results handed over to a connection subscribed
  without peek are marked retrieved (observers such as the status page consume nothing);
- ``off``: nothing is pushed (clients long-poll).

Pushing is best effort: a failure is logged and counted, never fails the results batch.
Clients notice a lost push as a gap in the cursors and catch up with POST /tasks/status.
"""
from __future__ import annotations

import functools
import logging
import os
import time
from typing import Iterable

from lambdas.adapters.redis_store.rows import Notice, Status
from skyfn.protocol.blobs import HEADER as BLOB_HEADER
from skyfn.protocol.push import done_message, small_status

log = logging.getLogger("skyfn.push")

CONNECTION_TTL_S = 2 * 3600  # API Gateway closes a WebSocket connection after 2 hours


def kind() -> str:
    value = os.environ.get("SKYFN_PUSH")
    if value:
        return value
    return "redis" if os.environ.get("SKYFN_QUEUE_KIND", "redis") == "redis" else "off"


def _is_ref(result: str) -> bool:
    return result.startswith(BLOB_HEADER)


def messages(notices: Iterable[Notice], statuses: dict[str, Status]) -> list[tuple[str, bytes, list[str]]]:
    """(owner, message, ids whose result is inside) for each notice; a notice's statuses
    come from `statuses` or, when it has them, from the notice itself."""
    out = []
    for n in notices:
        small = []
        known = n.statuses or statuses
        for tid in n.ids:
            st = known.get(tid)
            if st is not None:
                s = small_status(tid, st[0], st[1], st[2], st[3], _is_ref)
                if s is not None:
                    small.append(s)
        body = done_message(n.prev, n.cursor, n.ids, small)
        out.append((n.owner, body, [s["task_id"] for s in small]))
    return out


def notify(notices: list[Notice], statuses: dict[str, Status] | None = None) -> int:
    """Push `notices` to their owners; returns how many messages went out."""
    if not notices:
        return 0
    how = kind()
    if how == "off":
        return 0
    try:
        msgs = messages(notices, statuses or {})
        if how == "redis":
            return _publish(msgs)
        if how == "apigw":
            return _post(msgs)
        log.warning("SKYFN_PUSH=%r is not one of redis, apigw, off: nothing pushed", how)
    except Exception:  # never fail a results batch (or a cancel, a reaper run) over a push
        log.exception("pushing %d notices failed; clients catch up by polling", len(notices))
    return 0


def _publish(msgs: list[tuple[str, bytes, list[str]]]) -> int:
    from lambdas.core import deps

    return deps.push_channels().publish((owner, body) for owner, body, _ in msgs)


# -- AWS: connection table + API Gateway Management API ---------------------------------

@functools.lru_cache(maxsize=1)
def _table():
    import boto3

    return boto3.resource("dynamodb").Table(os.environ["SKYFN_CONNECTION_TABLE"])


@functools.lru_cache(maxsize=1)
def _management():
    import boto3

    return boto3.client("apigatewaymanagementapi", endpoint_url=os.environ["SKYFN_WS_ENDPOINT"])


def connections(owner: str) -> list[tuple[str, bool]]:
    """The owner's subscribed connections: (connection id, peek)."""
    from boto3.dynamodb.conditions import Key

    items = _table().query(KeyConditionExpression=Key("owner").eq(owner),
                           ProjectionExpression="connection_id, subscribed, peek, expires")["Items"]
    now = time.time()
    return [(i["connection_id"], bool(i.get("peek"))) for i in items
            if i.get("subscribed") and float(i.get("expires", 0)) > now]


def _post(msgs: list[tuple[str, bytes, list[str]]]) -> int:
    from lambdas.core import deps

    client, sent, handed = _management(), 0, []
    for owner, body, inline in msgs:
        handed_over = False
        for cid, peek in connections(owner):
            try:
                client.post_to_connection(ConnectionId=cid, Data=body)
                sent += 1
                handed_over = handed_over or not peek
            except client.exceptions.GoneException:
                forget(owner, cid)
        if handed_over:  # observers alone (peek) consume nothing
            handed.extend(inline)
    deps.store().mark_retrieved(handed)
    return sent


def remember(owner: str, connection_id: str, subscribed: bool = False, peek: bool = False) -> None:
    _table().put_item(Item={"owner": owner, "connection_id": connection_id, "subscribed": subscribed,
                            "peek": peek, "expires": int(time.time()) + CONNECTION_TTL_S})


def forget(owner: str, connection_id: str) -> None:
    _table().delete_item(Key={"owner": owner, "connection_id": connection_id})
