"""Amazon SQS adapter of the task-queue port: the task queues of the AWS deployment (and of
the embedded runtime against moto or LocalStack, since boto3 honours AWS_ENDPOINT_URL).

Body encoding. The port carries bytes; SQS carries text restricted to the XML character
set. A body that is valid UTF-8 made only of characters SQS accepts (every task and result
pack: they are UTF-8 JSON) is sent as that text, unchanged, so Lambda event sources and
the console see plain JSON. Any other body is sent base64-encoded with the message
attribute ``skyfn-encoding = base64``; the empty body, which SQS refuses, is sent as "-"
with ``skyfn-encoding = empty``. receive() undoes both.

Dead letters. ensure() creates ``<name>-dlq`` and gives the queue a RedrivePolicy with
maxReceiveCount = max_deliveries; SQS (and moto, checked on 5.2.5) then moves a message to
the dead-letter queue on the receive that would have been its (max_deliveries + 1)-th
delivery, keeping its MessageId and body. The adapter therefore does no moving itself.

Visibility timeouts and waits are whole seconds in SQS: fractions are rounded up.
"""
from __future__ import annotations

import base64
import json
import logging
import math
import re
import time
from typing import Any

from botocore.exceptions import ClientError

from skyfn.protocol.errors import SkyfnError
from skyfn.protocol.queues.base import Message, TaskQueue

log = logging.getLogger(__name__)

ENCODING_ATTRIBUTE = "skyfn-encoding"
BATCH_SIZE = 10
# The classic per-request payload limit of SendMessageBatch; a bigger single message is
# still sent, alone in its batch.
BATCH_BYTES = 256 * 1024
MAX_WAIT_SECONDS = 20
MAX_VISIBILITY_SECONDS = 12 * 3600
# Characters SQS refuses in a message body (everything outside #x9 #xA #xD #x20-#xD7FF
# #xE000-#xFFFD #x10000-#x10FFFF).
_NOT_SQS_TEXT = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# Answers to extend/delete for a receipt whose lease is gone; skipped, as in the Redis adapter.
_LOST_LEASE_CODES = {"ReceiptHandleIsInvalid", "MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight",
                     "InvalidParameterValue"}


class SqsQueue(TaskQueue):
    """A task queue on an SQS standard queue with a dead-letter queue. See the module docstring."""

    def __init__(self, name: str, client: Any = None, visibility_timeout: float = 30.0, max_deliveries: int = 5,
                 url: str | None = None):
        if not name:
            raise ValueError("SqsQueue needs a non-empty queue name")
        if name.endswith(".fifo"):
            raise ValueError(f"SqsQueue({name!r}): FIFO queues are not supported; task queues are standard queues")
        if not 1 <= max_deliveries <= 1000:
            raise ValueError(f"max_deliveries must be between 1 and 1000 (SQS maxReceiveCount), not {max_deliveries}")
        _seconds(visibility_timeout, MAX_VISIBILITY_SECONDS, "visibility_timeout")
        super().__init__(name, visibility_timeout, max_deliveries)
        self._owns_client = client is None
        if client is None:
            import boto3

            client = boto3.client("sqs")
        self._client = client
        self._url = url
        self._dlq_url: str | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            self._url = self._lookup_url(self.name)
        return self._url

    @property
    def dlq_url(self) -> str:
        if self._dlq_url is None:
            attrs = self._client.get_queue_attributes(QueueUrl=self.url, AttributeNames=["RedrivePolicy"])
            policy = attrs.get("Attributes", {}).get("RedrivePolicy")
            if policy:
                # arn:aws:sqs:region:account:queue-name
                arn = json.loads(policy)["deadLetterTargetArn"].split(":")
                self._dlq_url = self._lookup_url(arn[5], owner=arn[4])
            else:
                self._dlq_url = self._lookup_url(f"{self.name}-dlq")
        return self._dlq_url

    def _lookup_url(self, name: str, owner: str | None = None) -> str:
        kwargs = {"QueueName": name}
        if owner:
            kwargs["QueueOwnerAWSAccountId"] = owner
        try:
            return self._client.get_queue_url(**kwargs)["QueueUrl"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("QueueDoesNotExist",
                                                                  "AWS.SimpleQueueService.NonExistentQueue"):
                raise
            raise SkyfnError(f"SQS queue {name!r} does not exist: call ensure() first, or pass its url") from None

    def ensure(self) -> None:
        dlq_url = self._client.create_queue(QueueName=f"{self.name}-dlq")["QueueUrl"]
        dlq_arn = self._client.get_queue_attributes(
            QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        attributes = {
            "VisibilityTimeout": str(_seconds(self.visibility_timeout, MAX_VISIBILITY_SECONDS, "visibility_timeout")),
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(self.max_deliveries)}),
        }
        try:
            url = self._client.create_queue(QueueName=self.name, Attributes=attributes)["QueueUrl"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("QueueNameExists", "QueueAlreadyExists"):
                raise
            # exists with other attributes (an older max_deliveries, say): bring it in line
            url = self._client.get_queue_url(QueueName=self.name)["QueueUrl"]
            self._client.set_queue_attributes(QueueUrl=url, Attributes=attributes)
        self._url = url
        self._dlq_url = dlq_url

    def send(self, bodies: list[bytes]) -> list[str]:
        ids: list[str] = []
        batch: list[dict] = []
        size = 0
        for body in bodies:
            entry = _encode(body)
            entry_size = len(entry["MessageBody"].encode("utf-8"))
            if batch and (len(batch) == BATCH_SIZE or size + entry_size > BATCH_BYTES):
                ids.extend(self._send_batch(batch))
                batch, size = [], 0
            entry["Id"] = str(len(batch))
            batch.append(entry)
            size += entry_size
        if batch:
            ids.extend(self._send_batch(batch))
        return ids

    def _send_batch(self, entries: list[dict]) -> list[str]:
        answer = self._client.send_message_batch(QueueUrl=self.url, Entries=entries)
        failed = answer.get("Failed") or []
        if failed:
            reasons = "; ".join(f"{f.get('Code')}: {f.get('Message')}" for f in failed)
            raise SkyfnError(f"SQS queue {self.name!r} refused {len(failed)} of {len(entries)} messages: {reasons}")
        by_id = {s["Id"]: s["MessageId"] for s in answer.get("Successful", [])}
        return [by_id[e["Id"]] for e in entries]

    def receive(self, max_messages: int = 10, wait_seconds: float = 0.0,
                visibility_timeout: float | None = None) -> list[Message]:
        if max_messages < 1:
            raise ValueError(f"max_messages must be at least 1, not {max_messages}")
        vt = _seconds(self.visibility_timeout if visibility_timeout is None else visibility_timeout,
                      MAX_VISIBILITY_SECONDS, "visibility_timeout")
        messages: list[Message] = []
        give_up = time.monotonic() + max(0.0, wait_seconds)
        first = True
        while len(messages) < max_messages:
            # Long-poll only until something arrives; then drain what is ready without waiting.
            # A wait longer than SQS's 20 s maximum is several long polls.
            wait = 0
            if first:
                wait = min(MAX_WAIT_SECONDS, math.ceil(max(0.0, give_up - time.monotonic())))
            got = self._receive_batch(self.url, min(BATCH_SIZE, max_messages - len(messages)), wait, vt)
            if got:
                messages.extend(got)
                first = False
            elif not (first and wait > 0 and time.monotonic() < give_up):
                break
        return messages

    def _receive_batch(self, url: str, count: int, wait: int, vt: int | None) -> list[Message]:
        kwargs: dict[str, Any] = dict(
            QueueUrl=url, MaxNumberOfMessages=count, WaitTimeSeconds=wait,
            MessageSystemAttributeNames=["ApproximateReceiveCount"], MessageAttributeNames=[ENCODING_ATTRIBUTE],
        )
        if vt is not None:
            kwargs["VisibilityTimeout"] = vt
        answer = self._client.receive_message(**kwargs)
        return [Message(message_id=m["MessageId"], body=_decode(m), receipt=m["ReceiptHandle"],
                        delivery_count=int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1)))
                for m in answer.get("Messages", [])]

    def extend(self, receipts: list[str], visibility_timeout: float | None = None) -> None:
        """Push the leases to now + timeout. Receipts whose lease is gone are skipped."""
        vt = _seconds(self.visibility_timeout if visibility_timeout is None else visibility_timeout,
                      MAX_VISIBILITY_SECONDS, "visibility_timeout")
        for chunk in _chunks(receipts, BATCH_SIZE):
            answer = self._client.change_message_visibility_batch(QueueUrl=self.url, Entries=[
                {"Id": str(i), "ReceiptHandle": r, "VisibilityTimeout": vt} for i, r in enumerate(chunk)])
            self._check_batch("extend", answer, len(chunk))

    def delete(self, receipts: list[str]) -> None:
        self._delete(self.url, receipts)

    def _delete(self, url: str, receipts: list[str]) -> None:
        for chunk in _chunks(receipts, BATCH_SIZE):
            answer = self._client.delete_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), "ReceiptHandle": r} for i, r in enumerate(chunk)])
            self._check_batch("delete", answer, len(chunk))

    def _check_batch(self, what: str, answer: dict, total: int) -> None:
        failed = answer.get("Failed") or []
        lost = [f for f in failed if f.get("Code") in _LOST_LEASE_CODES]
        if lost:
            log.debug("queue %s: %s skipped %d receipts whose lease is gone", self.name, what, len(lost))
        other = [f for f in failed if f.get("Code") not in _LOST_LEASE_CODES]
        if other:
            reasons = "; ".join(f"{f.get('Code')}: {f.get('Message')}" for f in other)
            raise SkyfnError(f"SQS queue {self.name!r}: {what} failed for {len(other)} of {total} messages: {reasons}")

    def dead_letters(self, max_messages: int = 10) -> list[Message]:
        """Take messages from the dead-letter queue. delivery_count is the number of
        deliveries from the main queue (SQS keeps counting receives in the DLQ, and taking
        the message here is one of them)."""
        if max_messages < 1:
            raise ValueError(f"max_messages must be at least 1, not {max_messages}")
        taken: list[Message] = []
        while len(taken) < max_messages:
            got = self._receive_batch(self.dlq_url, min(BATCH_SIZE, max_messages - len(taken)), 0, None)
            if not got:
                break
            self._delete(self.dlq_url, [m.receipt for m in got])
            taken.extend(Message(m.message_id, m.body, m.receipt, max(1, m.delivery_count - 1)) for m in got)
        return taken

    def depth(self) -> int:
        attrs = self._client.get_queue_attributes(
            QueueUrl=self.url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attrs.get("ApproximateNumberOfMessages", 0)) + int(attrs.get("ApproximateNumberOfMessagesNotVisible", 0))

    def close(self) -> None:
        if self._owns_client:
            self._client.close()


def _seconds(value: float, limit: int, what: str) -> int:
    if value < 0 or value > limit:
        raise ValueError(f"{what} must be between 0 and {limit} seconds for SQS, not {value}")
    return math.ceil(value)


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _encode(body: bytes) -> dict:
    body = bytes(body)
    if not body:
        return {"MessageBody": "-", "MessageAttributes": {
            ENCODING_ATTRIBUTE: {"DataType": "String", "StringValue": "empty"}}}
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and not _NOT_SQS_TEXT.search(text):
        return {"MessageBody": text}
    return {"MessageBody": base64.b64encode(body).decode("ascii"), "MessageAttributes": {
        ENCODING_ATTRIBUTE: {"DataType": "String", "StringValue": "base64"}}}


def _decode(message: dict) -> bytes:
    encoding = message.get("MessageAttributes", {}).get(ENCODING_ATTRIBUTE, {}).get("StringValue")
    if encoding == "base64":
        return base64.b64decode(message["Body"])
    if encoding == "empty":
        return b""
    return message["Body"].encode("utf-8")
