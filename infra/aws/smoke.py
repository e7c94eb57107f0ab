"""Post-deploy smoke test of a stage: what synthesis cannot prove (docs/deploy.md, "Only a
real account can verify"). Run it with credentials of the deploying account:

    .venv/bin/python -m infra.aws.smoke --stage prod --region us-east-1

Checks, each printed PASS/FAIL with what was seen:
1. the six stacks are deployed (CloudFormation *_COMPLETE);
2. API Gateway maps GET /openapi.json to the API function (public route; its latency is
   the cold start of a VPC Lambda with the dependency layer);
3. the authorizer guards the other routes (POST /tasks without a token -> 401);
4. the reaper runs: Redis over TLS with the AUTH token from Secrets Manager (ElastiCache
   networking, SKYFN_SECRET_ENV), SQS permissions on the endpoint-queue prefixes;
5. the history drain runs: DynamoDB bulk writes under its role;
6. the results queue's event source is enabled and an empty ResultPack sent to the queue
   is consumed (results function, Redis) without reaching the DLQ;
7. the rendezvous NLB accepts TCP on its port.
Exit status 0 only if every check passed. Not run from this repository's machine (it has
no AWS account); the checks use only read calls, synchronous invokes of the scheduled
functions (idempotent) and one empty message.
"""
from __future__ import annotations

import argparse
import json
import socket
import time
import urllib.error
import urllib.request
from typing import Callable

PARTS = ("network", "data", "service", "agent-access", "rendezvous", "workflows")


class Smoke:
    def __init__(self, stage: str, region: str):
        import boto3

        self.stage, self.prefix = stage, f"skyfn-{stage}"
        session = boto3.Session(region_name=region)
        self.cfn, self.lam, self.sqs = session.client("cloudformation"), session.client("lambda"), session.client("sqs")
        self.outputs: dict[str, str] = {}
        self.failures = 0

    def check(self, name: str, fn: Callable[[], str]) -> None:
        try:
            seen = fn()
            print(f"PASS {name}: {seen}")
        except Exception as exc:  # every failure is reported, the run goes on
            self.failures += 1
            print(f"FAIL {name}: {type(exc).__name__}: {exc}")

    def stacks(self) -> str:
        for part in PARTS:
            (stack,) = self.cfn.describe_stacks(StackName=f"Skyfn-{self.stage}-{part}")["Stacks"]
            if not stack["StackStatus"].endswith("_COMPLETE") or "ROLLBACK" in stack["StackStatus"]:
                raise RuntimeError(f"{stack['StackName']} is {stack['StackStatus']}")
            self.outputs.update({o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])})
        return f"{len(PARTS)} stacks complete"

    def api_url(self) -> str:
        urls = [v for k, v in self.outputs.items() if k.startswith("ApiEndpoint")]
        if not urls:
            raise RuntimeError("the service stack has no ApiEndpoint output")
        return urls[0].rstrip("/")

    def openapi(self) -> str:
        start = time.monotonic()
        with urllib.request.urlopen(f"{self.api_url()}/openapi.json", timeout=30) as resp:
            doc = json.load(resp)
        if "openapi" not in doc or "/tasks" not in doc.get("paths", {}):
            raise RuntimeError("the answer is not skyfn's OpenAPI document")
        return f"200 in {time.monotonic() - start:.2f} s"

    def authorizer(self) -> str:
        req = urllib.request.Request(f"{self.api_url()}/tasks", data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=30)
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                return "401 without a token"
            raise RuntimeError(f"expected 401, got {exc.code}") from None
        raise RuntimeError("an unauthenticated POST /tasks was accepted")

    def invoke(self, key: str, expect: str) -> str:
        start = time.monotonic()
        answer = self.lam.invoke(FunctionName=f"{self.prefix}-{key}", Payload=b"{}")
        payload = json.loads(answer["Payload"].read() or b"null")
        if answer.get("FunctionError") or not isinstance(payload, dict) or expect not in payload:
            raise RuntimeError(f"{answer.get('FunctionError')}: {str(payload)[:500]}")
        return f"{payload} in {time.monotonic() - start:.2f} s"

    def results(self) -> str:
        mappings = self.lam.list_event_source_mappings(FunctionName=f"{self.prefix}-results")["EventSourceMappings"]
        if not mappings or mappings[0]["State"] != "Enabled":
            raise RuntimeError(f"results event source: {[m.get('State') for m in mappings]}")
        url = self.sqs.get_queue_url(QueueName=f"{self.prefix}-results")["QueueUrl"]
        dlq = self.sqs.get_queue_url(QueueName=f"{self.prefix}-results-dlq")["QueueUrl"]
        before = _visible(self.sqs, dlq)
        self.sqs.send_message(QueueUrl=url, MessageBody=json.dumps({"endpoint_id": "smoke-test", "results": []}))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            attrs = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
                "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
            if not any(int(v) for v in attrs.values()):
                break
            time.sleep(3)
        else:
            raise RuntimeError("the message was not consumed within 60 s")
        if _visible(self.sqs, dlq) > before:
            raise RuntimeError("the message went to the dead-letter queue")
        return "empty ResultPack consumed"

    def rendezvous(self) -> str:
        address = self.outputs.get("RendezvousAddress")
        if not address:
            raise RuntimeError("the rendezvous stack has no RendezvousAddress output")
        host, _, port = address.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=10):
            return f"TCP connect to {address}"


def _visible(sqs, url: str) -> int:
    return int(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
               ["Attributes"]["ApproximateNumberOfMessages"])


def checks(s: Smoke) -> list[tuple[str, Callable[[], str]]]:
    """The checks in the order they run (name, what to call)."""
    return [
        ("stacks deployed", s.stacks),
        ("API mapping (GET /openapi.json)", s.openapi),
        ("authorizer (POST /tasks, no token)", s.authorizer),
        ("reaper: Redis TLS + AUTH, SQS IAM", lambda: s.invoke("reaper", "offline")),
        ("history: DynamoDB IAM", lambda: s.invoke("history", "tasks")),
        ("results queue -> results function", s.results),
        ("rendezvous NLB", s.rendezvous),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.aws.smoke", description="post-deploy smoke test of a stage")
    ap.add_argument("--stage", required=True)
    ap.add_argument("--region", required=True)
    args = ap.parse_args(argv)
    s = Smoke(args.stage, args.region)
    todo = checks(s)
    for name, fn in todo:
        s.check(name, fn)
    print(f"{len(todo) - s.failures} passed, {s.failures} failed")
    return 1 if s.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
