"""The local API Gateway: an HTTP/1.1 server (keep-alive, one daemon thread per
connection) that turns each request into an API Gateway REST (v1 proxy) event, invokes
the API handler with a LambdaContext-like object and writes its proxy response back.

Like API Gateway it refuses bodies above 10 MiB with 413, decided from Content-Length
before any of the body is read (the connection is then closed; bytes the client still
sends are dropped unbuffered for a moment so it can read the 413), and
answers 502 when the handler raises or returns a malformed response; the traceback goes
to the log and the server keeps serving.

Where the handler runs: a callable is invoked in the connection's thread (for handlers
known to be thread-safe, and tests); a "module:attr" target (the default,
"lambdas.api:handler") runs in a pool of Lambda-like execution environments
(lambda_pool.py), one invocation per environment at a time, as on AWS: Powertools'
resolvers keep the current event in shared state, and long polls must not block others.
"""
from __future__ import annotations

import base64
import json
import logging
import socket
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qsl, unquote

from infra.local.standins.events import ACCOUNT
from infra.local.standins.lambda_pool import HandlerFailed, HandlerTimedOut, InProcess, LambdaPool

log = logging.getLogger("skyfn.local.gateway")

Handler = Callable[[dict, Any], dict]

try:  # the shared wire contract; a fallback keeps this module usable on its own
    from skyfn.protocol.api import MAX_REQUEST_BYTES
except Exception:  # pragma: no cover
    MAX_REQUEST_BYTES = 10 << 20
WS_PATH = "/ws"  # skyfn.protocol.push.PATH: the WebSocket API, when the gateway has a push hub

_REASONS = {s.value: s.phrase for s in HTTPStatus}
_HOP_BY_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive"}
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")


def _json_error(code: str, message: str) -> bytes:
    return json.dumps({"error": code, "message": message}).encode()


class _BodyTooLarge(Exception):
    pass


class _BadRequest(Exception):
    pass


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"
    timeout = 300  # an idle keep-alive connection is closed after this many seconds

    def setup(self) -> None:
        super().setup()
        # Responses go out in one write, but disable Nagle anyway: a request/response
        # protocol must never wait on delayed ACKs.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    _linger = False

    def finish(self) -> None:
        super().finish()
        if self._linger:
            self._discard_unread()

    def _discard_unread(self, seconds: float = 2.0) -> None:
        """Closing with unread bytes makes the kernel send a reset, and a client still
        sending its body would never see our 413. Half-close, then drop (never buffer)
        what the client still sends, for a bounded time."""
        sock = self.connection
        try:
            sock.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + seconds
            while (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                if not sock.recv(1 << 16):
                    break
        except OSError:
            pass

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s", self.address_string(), format % args)

    # -- body ----------------------------------------------------------------------

    def handle_expect_100(self) -> bool:
        """Refuse an oversized body before the client sends it."""
        length = self.headers.get("Content-Length")
        if length and length.strip().isdigit() and int(length) > self.server.gateway.max_body:
            self._refuse_too_large(int(length))
            return False
        return super().handle_expect_100()

    def _read_body(self) -> bytes:
        limit = self.server.gateway.max_body
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked(limit)
        length = self.headers.get("Content-Length")
        if length is None:
            return b""
        try:
            n = int(length)
        except ValueError:
            raise _BadRequest(f"Content-Length {length!r} is not a number") from None
        if n < 0:
            raise _BadRequest("negative Content-Length")
        if n > limit:
            raise _BodyTooLarge(n)
        return self.rfile.read(n) if n else b""

    def _read_chunked(self, limit: int) -> bytes:
        parts, total = [], 0
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _BadRequest("malformed chunked body") from None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            total += size
            if total > limit:
                raise _BodyTooLarge(total)
            parts.append(self.rfile.read(size))
            self.rfile.readline(8)  # CRLF after the chunk

    def _refuse_too_large(self, size: int) -> None:
        limit = self.server.gateway.max_body
        self.close_connection = True  # the unread body makes the connection unusable
        self._linger = True
        self._send(413, {"Content-Type": "application/json"}, _json_error(
            "payload_too_large",
            f"request body of {size} bytes exceeds the {limit} byte limit; "
            "send large payloads through the SDK, which moves them via object storage"))

    # -- dispatch ------------------------------------------------------------------

    def _dispatch(self) -> None:
        gateway = self.server.gateway
        if gateway.websocket is not None and self.headers.get("Upgrade", "").lower() == "websocket":
            self._websocket(gateway.websocket)
            return
        if gateway.ui and self.command in ("GET", "HEAD") and self.path.split("?", 1)[0].startswith("/ui"):
            self._ui()
            return
        try:
            body = self._read_body()
        except _BodyTooLarge as exc:
            self._refuse_too_large(exc.args[0])
            return
        except _BadRequest as exc:
            self.close_connection = True
            self._send(400, {"Content-Type": "application/json"}, _json_error("bad_request", str(exc)))
            return
        request_id = str(uuid.uuid4())
        event = self._event(body, request_id)
        try:
            response = gateway.invoker.invoke(event, gateway.function_name, gateway.timeout_seconds, request_id)
            status, headers, payload = _proxy_response(response)
        except HandlerTimedOut:
            log.error("%s %s: handler %s timed out after %.0f s (request %s)", self.command, self.path,
                      gateway.function_name, gateway.timeout_seconds, request_id)
            status, headers = 504, {"Content-Type": "application/json"}
            payload = _json_error("gateway_timeout", f"the service handler did not answer within "
                                                     f"{gateway.timeout_seconds:.0f} s; request id {request_id}")
        except HandlerFailed as exc:
            log.error("%s %s: handler %s failed (request %s)\n%s", self.command, self.path,
                      gateway.function_name, request_id, exc.remote_traceback.rstrip())
            status, headers = 502, {"Content-Type": "application/json"}
            payload = _json_error("bad_gateway", f"the service handler failed ({str(exc).split(':')[0]}); "
                                                 f"see the service log, request id {request_id}")
        except Exception as exc:
            log.exception("%s %s: handler %s failed (request %s)", self.command, self.path,
                          gateway.function_name, request_id)
            status, headers = 502, {"Content-Type": "application/json"}
            payload = _json_error("bad_gateway", f"the service handler failed ({type(exc).__name__}); "
                                                 f"see the service log, request id {request_id}")
        headers = list(headers.items()) if isinstance(headers, dict) else headers
        headers.append(("x-amzn-RequestId", request_id))
        self._send(status, headers, payload)

    def _websocket(self, hub) -> None:
        """An upgrade to the WebSocket API (infra/local/standins/push_hub.py). The request line may
        carry a token (?token=): it is never logged."""
        from websockets.utils import accept_key

        self.close_connection = True
        raw_path, _, query = self.path.partition("?")
        if unquote(raw_path).rstrip("/") != WS_PATH:
            return self._raw(404, _json_error("not_found", f"the WebSocket API is at {WS_PATH}"))
        key = self.headers.get("Sec-WebSocket-Key", "")
        if self.headers.get("Sec-WebSocket-Version") != "13" or not key:
            return self._raw(400, _json_error("bad_request", "a WebSocket upgrade needs Sec-WebSocket-Version 13 "
                                                             "and a Sec-WebSocket-Key"))
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        if not token:
            token = dict(parse_qsl(query)).get("token", "")
        user = hub.authenticate(token) if token else None
        if not user:
            return self._raw(401, _json_error("unauthorized", "the WebSocket API needs a valid user token "
                                                              "(Authorization: Bearer, or ?token=)"))
        conn = hub.accept(self.connection, user)
        self.wfile.write(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          f"Sec-WebSocket-Accept: {accept_key(key)}\r\n\r\n").encode())
        try:
            conn.serve()
        finally:
            hub.leave(conn)

    def _ui(self) -> None:
        """The status page (lambdas/ui_assets, as the AWS stack serves it): static files, no
        data; everything it shows comes from the API with the token the user signs in with.
        Its config: both APIs on this origin."""
        from lambdas import ui_assets

        gateway = self.server.gateway
        host = self.headers.get("Host", f"{gateway.host}:{gateway.port}")
        config = ui_assets.PageConfig(api_url="/", ws_url=WS_PATH if gateway.websocket is not None else None,
                                      connect_src=(f"ws://{host}", f"wss://{host}"))
        answer = ui_assets.serve(self.path.split("?", 1)[0], config, if_none_match=self.headers.get("If-None-Match"))
        self._send(answer.status, answer.headers, answer.body)

    def _raw(self, status: int, payload: bytes) -> None:
        """An answer that is not logged with its request line (which may hold a token)."""
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n")
        self.wfile.write(head.encode() + payload)

    def _event(self, body: bytes, request_id: str) -> dict:
        gateway = self.server.gateway
        target = self.path
        if target.startswith(("http://", "https://")):  # absolute-form request target
            target = "/" + target.split("://", 1)[1].partition("/")[2]
        raw_path, _, query = target.partition("?")
        path = unquote(raw_path) or "/"
        headers: dict[str, str] = {}
        multi_headers: dict[str, list[str]] = {}
        for name, value in self.headers.items():
            headers[name] = value
            multi_headers.setdefault(name, []).append(value)
        qs: dict[str, str] | None = None
        multi_qs: dict[str, list[str]] | None = None
        if query:
            qs, multi_qs = {}, {}
            for name, value in parse_qsl(query, keep_blank_values=True):
                qs[name] = value
                multi_qs.setdefault(name, []).append(value)
        if body:
            try:
                text, is_b64 = body.decode("utf-8"), False
            except UnicodeDecodeError:
                text, is_b64 = base64.b64encode(body).decode("ascii"), True
        else:
            text, is_b64 = None, False
        now = time.time()
        source_ip = self.client_address[0]
        stage = gateway.stage
        return {
            "resource": path,
            "path": path,
            "httpMethod": self.command,
            "headers": headers,
            "multiValueHeaders": multi_headers,
            "queryStringParameters": qs,
            "multiValueQueryStringParameters": multi_qs,
            "pathParameters": None,
            "stageVariables": None,
            "requestContext": {
                "accountId": ACCOUNT,
                "apiId": "local",
                "resourceId": "local",
                "resourcePath": path,
                "httpMethod": self.command,
                "path": f"/{stage}{path}",
                "stage": stage,
                "protocol": self.request_version,
                "requestId": request_id,
                "extendedRequestId": request_id,
                "requestTime": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
                "requestTimeEpoch": int(now * 1000),
                "domainName": headers.get("Host", gateway.host),
                "domainPrefix": "local",
                "identity": {"sourceIp": source_ip, "userAgent": headers.get("User-Agent"),
                             "accountId": None, "caller": None, "user": None, "userArn": None,
                             "apiKey": None, "accessKey": None, "cognitoIdentityId": None},
            },
            "body": text,
            "isBase64Encoded": is_b64,
        }

    def _send(self, status: int, headers: dict[str, str] | list[tuple[str, str]], payload: bytes) -> None:
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}"]
        items = headers.items() if isinstance(headers, dict) else headers
        for name, value in items:
            if name.lower() not in _HOP_BY_HOP:
                lines.append(f"{name}: {value}")
        lines.append(f"Content-Length: {len(payload)}")
        if self.close_connection:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", errors="replace")
        self.wfile.write(head if self.command == "HEAD" else head + payload)
        self.log_request(status, len(payload))

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _dispatch


def _proxy_response(response: Any) -> tuple[int, list[tuple[str, str]], bytes]:
    """Validate a Lambda proxy response and turn it into (status, headers, body bytes).
    Like API Gateway: multiValueHeaders and headers are merged, multiValueHeaders winning."""
    if not isinstance(response, dict):
        raise TypeError(f"the handler returned {type(response).__name__}, not a proxy response dict")
    status = response.get("statusCode", 200)
    if isinstance(status, str) and status.isdigit():
        status = int(status)
    if not isinstance(status, int) or not 100 <= status <= 599:
        raise ValueError(f"malformed statusCode {status!r} in the handler's response")
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for name, values in (response.get("multiValueHeaders") or {}).items():
        seen.add(name.lower())
        for value in values if isinstance(values, (list, tuple)) else [values]:
            pairs.append((name, str(value)))
    for name, value in (response.get("headers") or {}).items():
        if name.lower() not in seen:
            pairs.append((name, str(value)))
    body = response.get("body")
    if body is None:
        payload = b""
    elif response.get("isBase64Encoded"):
        payload = base64.b64decode(body)
    elif isinstance(body, bytes):
        payload = body
    else:
        payload = str(body).encode("utf-8")
    return status, pairs, payload


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 256
    gateway: "Gateway"


class Gateway:
    """Serve `handler` over HTTP: a callable (run in process) or a "module:attr" target
    run in a pool of `workers` = (min, max) execution environments."""

    def __init__(self, handler: Handler | str = "lambdas.api:handler", host: str = "127.0.0.1", port: int = 0, *,
                 function_name: str = "skyfn-api", stage: str = "local", timeout_seconds: float = 29.0,
                 max_body: int = MAX_REQUEST_BYTES, concurrency: int | None = None,
                 workers: tuple[int, int] = (2, 16), env: dict | None = None, inherit: bool = True, websocket=None,
                 ui: bool = False, sock: socket.socket | None = None):
        """`sock`: a listening socket to serve on (bound by whoever started us, so clients
        could connect, and wait in its backlog, before we serve) instead of binding `port`."""
        if callable(handler):
            self.invoker = InProcess(handler, concurrency)
        else:
            self.invoker = LambdaPool(handler, min_workers=workers[0], max_workers=workers[1], env=env,
                                      inherit=inherit, start_timeout=60.0)
        self.host = host
        self.requested_port = port
        self.function_name = function_name
        self.stage = stage
        self.timeout_seconds = timeout_seconds
        self.max_body = max_body
        self.websocket = websocket  # a push_hub.PushHub: GET /ws upgrades are its connections
        self.ui = ui  # serve the status page at /ui (lambdas/ui_assets)
        self.sock = sock
        self._prepared: _Server | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the gateway is not started")
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def prepare(self) -> "Gateway":
        """Bind (unless given a socket) and start the handler's environments, without serving
        yet: connections wait in the socket's backlog until start()."""
        if self._prepared is not None:
            return self
        if self.sock is not None:
            server = _Server(self.sock.getsockname()[:2], _RequestHandler, bind_and_activate=False)
            server.socket.close()
            server.socket, server.server_address = self.sock, self.sock.getsockname()[:2]
        else:
            server = _Server((self.host, self.requested_port), _RequestHandler)  # bind first: a taken port fails fast
        try:
            self.invoker.start()
        except BaseException:
            server.server_close()
            raise
        server.gateway = self
        self._prepared = server
        return self

    def start(self) -> "Gateway":
        """Serve (preparing first if prepare() was not called)."""
        server = self.prepare()._prepared
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="skyfn-gateway", daemon=True)
        self._thread.start()
        log.info("gateway listening on %s", self.url)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
        if self._prepared is not None:
            self._prepared.server_close()
        self._server = self._prepared = None
        self.invoker.close()

    def __enter__(self) -> "Gateway":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
