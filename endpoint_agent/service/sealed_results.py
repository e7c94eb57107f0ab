"""The agent's results queue, sealed: every ResultPack body it sends carries a MAC under the
endpoint's results key (skyfn.protocol.result_seal), which is how the service knows the pack
is this endpoint's -- the results queue is shared, and the body's `endpoint_id` proves
nothing. The key is read at each send, so a credential rotated while the agent runs seals
from then on with the new one. Everything but `send` goes to the wrapped queue (WrappedQueue).
"""
from __future__ import annotations

from typing import Callable, Optional

from skyfn.protocol.queues.base import TaskQueue, WrappedQueue
from skyfn.protocol.result_seal import seal


class SealedResults(WrappedQueue):
    """`inner` with each body sent sealed as `endpoint_id()` under `key()` (hex)."""

    def __init__(self, inner: TaskQueue, endpoint_id: Callable[[], Optional[str]], key: Callable[[], Optional[str]]):
        super().__init__(inner)
        self._endpoint_id, self._key = endpoint_id, key

    def send(self, bodies: list[bytes]) -> list[str]:
        endpoint_id, key = self._endpoint_id(), self._key()
        if not endpoint_id or not key:
            raise RuntimeError("no results key for the endpoint yet: the agent seals its results with its endpoint "
                               "credential's key (registered or connected), and the service refuses unsealed ones")
        return self.inner.send([seal(endpoint_id, key, b) for b in bodies])
