"""The privileged process's side of lanes (skyfn.protocol.lanes): binding identities to user
agents' lanes at the service, closing lanes, and its own handle on a lane's queue.

The endpoint's queue login may write to and read from its lanes' queues (the service's
Redis): the privileged process hands a lane the tasks that reached it through the endpoint's
own queue (the first of each binding), and takes back what is left in a lane it closed.
Where the service cannot have lanes (409 lanes_unavailable: SQS task queues), `available`
turns false once and every task is routed through the router's Redis as before.
"""
from __future__ import annotations

import logging
import time
from typing import Optional

import redis

from endpoint_agent.service.link import ServiceError, ServiceLink
from skyfn.protocol.lanes import LaneGranted
from skyfn.protocol.queues.redis_streams import SOCKET_TIMEOUT_S, RedisStreamQueue

log = logging.getLogger("skyfn.multiuser.lanes")

UNAVAILABLE = ("lanes_unavailable", "not_multi_user")
RETRY_S = 30.0


class Lanes:
    def __init__(self, link: ServiceLink, endpoint_id: str, queue_url: str, lease_seconds: float):
        self.link = link
        self.endpoint_id = endpoint_id
        self.lease_seconds = lease_seconds
        self.available = True
        self._retry_at = 0.0
        self._client = redis.Redis.from_url(queue_url, socket_timeout=SOCKET_TIMEOUT_S)

    def bind(self, lane: str, identity_id: str, config_key: str) -> Optional[LaneGranted]:
        """The lane, with (identity, config key) bound to it; None when it could not be bound
        (the tasks then go through the router)."""
        if not self.available or time.monotonic() < self._retry_at:
            return None
        try:
            return self.link.bind_lane(self.endpoint_id, lane, identity_id, config_key)
        except ServiceError as exc:  # refused: asking again will not help
            level = logging.INFO if exc.code in UNAVAILABLE else logging.WARNING
            log.log(level, "no lanes (%s): every task goes through the router", exc)
            self.available = False
        except Exception as exc:  # noqa: BLE001 - the service down: route through the router meanwhile
            log.warning("cannot bind lane %s (%s); tasks go through the router for %.0f s", lane, exc, RETRY_S)
            self._retry_at = time.monotonic() + RETRY_S
        return None

    def close(self, lane: str) -> bool:
        try:
            self.link.close_lane(self.endpoint_id, lane)
            return True
        except Exception as exc:  # noqa: BLE001
            log.warning("cannot close lane %s (%s)", lane, exc)
            return False

    def queue(self, name: str) -> RedisStreamQueue:
        """The endpoint's own handle on a lane's task queue."""
        q = RedisStreamQueue(name, client=self._client, consumer="router", visibility_timeout=self.lease_seconds)
        q.ensure()
        return q

    @property
    def client(self) -> redis.Redis:
        """The endpoint's queue login on the service's Redis (it may read its lanes' streams)."""
        return self._client

    def shut(self) -> None:
        self._client.close()
