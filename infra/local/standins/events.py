"""The shapes AWS hands to Lambda handlers, built locally: the LambdaContext-like object,
SQS event-source records and EventBridge scheduled events. (API Gateway proxy events are
built by gateway.py, which owns the HTTP request.) Field names and value types follow
what Lambda really sends, so handlers written against AWS run unchanged here."""
from __future__ import annotations

import hashlib
import time
import uuid
from datetime import datetime, timezone

REGION = "us-east-1"
ACCOUNT = "000000000000"


class LocalLambdaContext:
    """What Lambda passes as `context`: names, ARN, memory, request id, log names and
    the remaining time before the (configurable) timeout."""

    __slots__ = ("function_name", "function_version", "invoked_function_arn", "memory_limit_in_mb",
                 "aws_request_id", "log_group_name", "log_stream_name", "_deadline")

    def __init__(self, function_name: str, timeout_seconds: float = 30.0, memory_limit_in_mb: int = 1024,
                 request_id: str | None = None, region: str = REGION, account: str = ACCOUNT):
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:{region}:{account}:function:{function_name}"
        self.memory_limit_in_mb = memory_limit_in_mb
        self.aws_request_id = request_id or str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = f"local/[$LATEST]{function_name}"
        self._deadline = time.monotonic() + timeout_seconds

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))

    def __repr__(self) -> str:
        return f"LocalLambdaContext({self.function_name!r}, request_id={self.aws_request_id!r})"


def queue_arn(queue_name: str, region: str = REGION, account: str = ACCOUNT) -> str:
    return f"arn:aws:sqs:{region}:{account}:{queue_name}"


def sqs_record(message_id: str, receipt: str, body: bytes | str, receive_count: int, source_arn: str,
               sent_ms: int | None = None, region: str = REGION) -> dict:
    """One record of an SQS event as the Lambda event-source mapping delivers it."""
    text = body if isinstance(body, str) else body.decode("utf-8", errors="replace")
    now_ms = str(int(time.time() * 1000))
    return {
        "messageId": message_id,
        "receiptHandle": receipt,
        "body": text,
        "attributes": {
            "ApproximateReceiveCount": str(receive_count),
            "SentTimestamp": str(sent_ms) if sent_ms is not None else now_ms,
            "SenderId": ACCOUNT,
            "ApproximateFirstReceiveTimestamp": now_ms,
        },
        "messageAttributes": {},
        "md5OfBody": hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest(),
        "eventSource": "aws:sqs",
        "eventSourceARN": source_arn,
        "awsRegion": region,
    }


def stream_id_millis(message_id: str) -> int | None:
    """A Redis stream entry id is `<ms>-<seq>`: its first part is when it was sent."""
    head = message_id.split("-", 1)[0]
    return int(head) if head.isdigit() and len(head) >= 12 else None


def scheduled_event(rule_name: str, region: str = REGION, account: str = ACCOUNT) -> dict:
    """An EventBridge `Scheduled Event`, as a rate() rule sends it."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": account,
        "time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [f"arn:aws:events:{region}:{account}:rule/{rule_name}"],
        "detail": {},
    }
