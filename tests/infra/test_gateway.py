"""The local gateway: faithful API Gateway REST proxy events, 413 before reading,
502 on handler failures without losing the server, keep-alive, Lambda-like environments."""
from __future__ import annotations

import base64
import json
import socket
import threading
import time

import pytest
import requests

from infra.local.standins.gateway import Gateway
from tests.infra.sample_handlers import echo


@pytest.fixture
def gateway():
    with Gateway(echo) as g:
        yield g


def test_request_becomes_a_rest_proxy_event(gateway):
    r = requests.put(f"{gateway.url}/tasks/abc%20d?x=1&x=2&y=&z=%2F", data='{"k": "é"}'.encode(),
                     headers={"Authorization": "Bearer t", "X-Multi": "a", "Content-Type": "application/json"})
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "application/json"
    assert r.headers["Set-Cookie"] == "a=1, b=2"  # multiValueHeaders become repeated headers
    assert r.headers["x-amzn-RequestId"]
    info = r.json()
    event, ctx = info["event"], info["context"]
    assert event["httpMethod"] == "PUT"
    assert event["path"] == event["resource"] == "/tasks/abc d"
    assert event["queryStringParameters"] == {"x": "2", "y": "", "z": "/"}
    assert event["multiValueQueryStringParameters"] == {"x": ["1", "2"], "y": [""], "z": ["/"]}
    assert event["headers"]["Authorization"] == "Bearer t"
    assert event["multiValueHeaders"]["X-Multi"] == ["a"]
    assert event["pathParameters"] is None
    assert event["body"] == '{"k": "é"}' and event["isBase64Encoded"] is False
    rc = event["requestContext"]
    assert rc["stage"] == "local" and rc["httpMethod"] == "PUT" and rc["path"] == "/local/tasks/abc d"
    assert rc["identity"]["sourceIp"] == "127.0.0.1"
    assert abs(rc["requestTimeEpoch"] / 1000 - time.time()) < 60
    assert rc["requestId"] == ctx["aws_request_id"] == r.headers["x-amzn-RequestId"]
    assert ctx["function_name"] == "skyfn-api" and ctx["function_version"] == "$LATEST"
    assert ctx["invoked_function_arn"].endswith(":function:skyfn-api")
    assert ctx["log_group_name"] == "/aws/lambda/skyfn-api" and ctx["log_stream_name"]
    assert ctx["memory_limit_in_mb"] > 0 and 0 < ctx["remaining_ms"] <= 29_000


def test_get_without_body_or_query(gateway):
    event = requests.get(f"{gateway.url}/endpoints").json()["event"]
    assert event["httpMethod"] == "GET" and event["path"] == "/endpoints"
    assert event["body"] is None and event["isBase64Encoded"] is False
    assert event["queryStringParameters"] is None and event["multiValueQueryStringParameters"] is None


def test_binary_body_is_base64(gateway):
    payload = bytes(range(256)) * 4
    event = requests.post(f"{gateway.url}/bin", data=payload,
                          headers={"Content-Type": "application/octet-stream"}).json()["event"]
    assert event["isBase64Encoded"] is True
    assert base64.b64decode(event["body"]) == payload


def test_chunked_body(gateway):
    event = requests.post(f"{gateway.url}/c", data=iter([b"ab", b"cd", b"ef"])).json()["event"]
    assert event["body"] == "abcdef"


def test_binary_response_is_decoded():
    def handler(event, context):
        return {"statusCode": 201, "headers": {"Content-Type": "application/octet-stream"},
                "body": base64.b64encode(b"\x00\xff").decode(), "isBase64Encoded": True}
    with Gateway(handler) as g:
        r = requests.get(f"{g.url}/x")
    assert r.status_code == 201 and r.content == b"\x00\xff"


def test_oversized_body_refused_before_reading(gateway):
    # Announce 11 MiB, send nothing: the answer must come without the server waiting for it.
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as s:
        s.sendall(b"POST /tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % (11 << 20))
        start = time.monotonic()
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        assert time.monotonic() - start < 2
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert b"Connection: close" in head
    assert json.loads(body)["error"] == "payload_too_large"


def test_oversized_body_sent_by_a_client_gets_413(gateway):
    r = requests.post(f"{gateway.url}/tasks", data=b"x" * ((10 << 20) + 1))
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"
    assert requests.get(f"{gateway.url}/still-up").status_code == 200


def test_handler_exception_is_502_and_server_keeps_serving(gateway, caplog):
    with requests.Session() as s:
        r = s.get(f"{gateway.url}/boom")
        assert r.status_code == 502
        assert r.json()["error"] == "bad_gateway" and "ValueError" in r.json()["message"]
        assert s.get(f"{gateway.url}/after").status_code == 200
    assert "boom requested" in caplog.text  # the traceback is in the log


def test_malformed_handler_response_is_502():
    with Gateway(lambda e, c: "not a dict") as g:
        r = requests.get(f"{g.url}/x")
        assert r.status_code == 502
        assert requests.get(f"{g.url}/x").status_code == 502


def test_keep_alive_with_session(gateway):
    with requests.Session() as s:
        for i in range(20):
            r = s.post(f"{gateway.url}/k{i}", json={"i": i})
            assert r.status_code == 200 and r.json()["event"]["path"] == f"/k{i}"
        manager = s.get_adapter(gateway.url).poolmanager
        pools = [manager.pools[key] for key in manager.pools.keys()]
        assert sum(p.num_connections for p in pools) == 1  # one TCP connection for all 20


def test_gateway_overhead_is_small(gateway):
    import http.client

    def nop(event, context):
        return {"statusCode": 200, "body": "{}"}
    with Gateway(nop) as g:
        conn = http.client.HTTPConnection("127.0.0.1", g.port)
        for _ in range(50):
            conn.request("GET", "/x"); conn.getresponse().read()
        n, start = 500, time.perf_counter()
        for _ in range(n):
            conn.request("POST", "/x", body=b'{"a": 1}', headers={"Authorization": "Bearer t"})
            conn.getresponse().read()
        per_request = (time.perf_counter() - start) / n
        conn.close()
    assert per_request < 0.002, f"{per_request * 1e3:.2f} ms per round trip"


# -- Lambda-like execution environments (the default for lambdas.api) ------------------

@pytest.fixture(scope="module")
def pooled():
    with Gateway("tests.infra.sample_handlers:echo", workers=(1, 4)) as g:
        yield g


def test_pool_translates_and_recovers(pooled):
    with requests.Session() as s:
        assert s.post(f"{pooled.url}/a?q=1", data=b"\xff").json()["event"]["isBase64Encoded"] is True
        assert s.get(f"{pooled.url}/boom").status_code == 502
        assert s.get(f"{pooled.url}/exit").status_code == 502  # the environment died: replaced
        assert s.get(f"{pooled.url}/after").status_code == 200


def test_pool_runs_blocking_requests_side_by_side(pooled):
    """A long poll occupies one environment; other requests are served meanwhile."""
    slow = threading.Thread(target=requests.get, args=(f"{pooled.url}/sleep?s=2",))
    slow.start()
    time.sleep(0.2)
    start = time.monotonic()
    assert requests.get(f"{pooled.url}/fast").status_code == 200
    assert time.monotonic() - start < 1.5
    slow.join()
    assert len(set(pooled.invoker.pids())) >= 2


def test_pool_target_that_does_not_import_fails_at_start():
    with pytest.raises(RuntimeError, match="cannot load"):
        Gateway("tests.infra.no_such_module:handler", workers=(1, 1)).start()
