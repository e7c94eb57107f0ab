"""The SQS-style task queue port.

Two adapters implement it: Redis Streams (the embedded runtime) and SQS (AWS). Both the
service (producer) and endpoint agents (consumers) use it, which is why it lives in the
shared protocol package rather than in lambdas/ (lambdas and endpoint_agent never import
each other). Semantics, checked by one contract suite on both adapters:

- send(bodies): enqueue many messages; returns their ids.
- receive(max_messages, wait_seconds, visibility_timeout): long poll; returns up to
  max_messages (may make several underlying calls to fill it). Every returned message is
  leased: invisible to other receivers until its visibility timeout passes.
- extend(receipts, visibility_timeout): push the leases' expiry to now + timeout.
- delete(receipts): acknowledge; the message is gone for good.
- A message whose lease expires is delivered again (delivery_count increases). A message
  delivered more than max_deliveries times goes to the dead-letter queue instead.
- dead_letters(max_messages): take messages from the dead-letter queue (removes them).
- depth(): approximate count of messages not yet deleted (visible + in flight).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class Message:
    message_id: str
    body: bytes
    receipt: str
    delivery_count: int


class TaskQueue(ABC):
    def __init__(self, name: str, visibility_timeout: float = 30.0, max_deliveries: int = 5):
        self.name = name
        self.visibility_timeout = visibility_timeout
        self.max_deliveries = max_deliveries

    @abstractmethod
    def ensure(self) -> None:
        """Create the queue (and its dead-letter queue) if missing. Idempotent."""

    @abstractmethod
    def send(self, bodies: list[bytes]) -> list[str]: ...

    @abstractmethod
    def receive(self, max_messages: int = 10, wait_seconds: float = 0.0,
                visibility_timeout: float | None = None) -> list[Message]: ...

    @abstractmethod
    def extend(self, receipts: list[str], visibility_timeout: float | None = None) -> None: ...

    @abstractmethod
    def delete(self, receipts: list[str]) -> None: ...

    @abstractmethod
    def dead_letters(self, max_messages: int = 10) -> list[Message]: ...

    @abstractmethod
    def depth(self) -> int: ...

    def close(self) -> None:
        """Release connections."""


class WrappedQueue(TaskQueue):
    """`inner` with every call passed through; a subclass overrides the calls it adds to (the
    agent's sealed results queue, a lane's queues)."""

    def __init__(self, inner: TaskQueue):
        super().__init__(inner.name, inner.visibility_timeout, inner.max_deliveries)
        self.inner = inner

    def ensure(self) -> None:
        self.inner.ensure()

    def send(self, bodies: list[bytes]) -> list[str]:
        return self.inner.send(bodies)

    def receive(self, max_messages: int = 10, wait_seconds: float = 0.0,
                visibility_timeout: float | None = None) -> list[Message]:
        return self.inner.receive(max_messages, wait_seconds, visibility_timeout)

    def extend(self, receipts: list[str], visibility_timeout: float | None = None) -> None:
        self.inner.extend(receipts, visibility_timeout)

    def delete(self, receipts: list[str]) -> None:
        self.inner.delete(receipts)

    def dead_letters(self, max_messages: int = 10) -> list[Message]:
        return self.inner.dead_letters(max_messages)

    def depth(self) -> int:
        return self.inner.depth()

    def set_password(self, password: str) -> None:
        """The Redis queue's new login (a rotated credential); SQS queues have none."""
        setter = getattr(self.inner, "set_password", None)
        if setter is not None:
            setter(password)

    def close(self) -> None:
        self.inner.close()
