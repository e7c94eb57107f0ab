"""Handlers the infra tests serve through the gateway and its Lambda environments."""
from __future__ import annotations

import json
import os
import time


def echo(event, context):
    """Answer with the event and the context, so tests can check the translation."""
    if event["path"] == "/boom":
        raise ValueError("boom requested")
    if event["path"] == "/exit":
        os._exit(3)
    if event["path"] == "/sleep":
        time.sleep(float(event["queryStringParameters"]["s"]))
    if event["path"] == "/pid":
        return {"statusCode": 200, "headers": {"Content-Type": "application/json"}, "body": json.dumps(os.getpid())}
    info = {"event": event, "context": {
        "function_name": context.function_name, "function_version": context.function_version,
        "invoked_function_arn": context.invoked_function_arn, "memory_limit_in_mb": context.memory_limit_in_mb,
        "aws_request_id": context.aws_request_id, "log_group_name": context.log_group_name,
        "log_stream_name": context.log_stream_name, "remaining_ms": context.get_remaining_time_in_millis()}}
    return {"statusCode": 200, "headers": {"Content-Type": "application/json"},
            "multiValueHeaders": {"Set-Cookie": ["a=1", "b=2"]}, "body": json.dumps(info),
            "isBase64Encoded": False}


def scheduled_record(event, context):
    """A scheduled handler that appends (pid, niceness, detail-type, function) to the file
    named by SKYFN_TEST_SCHEDULE_LOG."""
    with open(os.environ["SKYFN_TEST_SCHEDULE_LOG"], "a") as f:
        f.write(json.dumps([os.getpid(), os.getpriority(os.PRIO_PROCESS, 0), event["detail-type"],
                            context.function_name]) + "\n")
    return {"ok": True}


def environment(event, context):
    """The environment variables this execution environment sees (those named in the event)."""
    return {name: os.environ.get(name) for name in event["names"]}
