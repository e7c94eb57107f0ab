"""The HTTP routes of the Globus Transfer stand-in (infra/local/standins/globus_transfer): parse a
request, call the TransferStandIn's operation, answer JSON (errors in Globus's shape)."""
from __future__ import annotations

import base64
import json
import logging
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from infra.local.standins.globus_transfer.model import PREFIX, APIError

log = logging.getLogger("skyfn.local.globus")


def handler_class(server: Any) -> type:
    """The request handler class serving `server` (a TransferStandIn) over HTTP."""
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:  # headers carry tokens: log nothing of them
            log.debug("%s %s", self.command, self.path.split("?")[0])

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> bytes:
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        def _dispatch(self) -> None:
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            path = parts.path.rstrip("/") or "/"
            body = self._body()
            try:
                if path == "/v2/oauth2/token" and self.command == "POST":
                    form = {k: v[-1] for k, v in parse_qs(body.decode()).items()}
                    basic = None
                    auth = self.headers.get("Authorization") or ""
                    if auth.startswith("Basic "):
                        cid, _, secret = base64.b64decode(auth[6:]).decode().partition(":")
                        basic = (cid, secret)
                    return self._send(200, server.issue_token(form, basic))
                if path == "/standin/log":
                    return self._send(200, server.log.snapshot())
                if not path.startswith(PREFIX + "/"):
                    raise APIError(404, "ClientError.NotFound", f"No such resource {path}")
                owner = server.check_token(self.headers.get("Authorization"))
                route = path[len(PREFIX):].split("/")[1:]
                if route == ["submission_id"] and self.command == "GET":
                    return self._send(200, {"DATA_TYPE": "submission_id", "value": str(uuid.uuid4())})
                if route in (["transfer"], ["delete"]) and self.command == "POST":
                    try:
                        doc = json.loads(body or b"{}")
                    except ValueError:
                        raise APIError(400, "ClientError.BadRequest", "The body is not JSON") from None
                    return self._send(*server.submit(doc, owner, route[0].upper()))
                if route == ["task_list"] and self.command == "GET":
                    return self._send(200, server.task_list(query))
                if len(route) == 2 and route[0] == "task" and self.command == "GET":
                    return self._send(200, server.task(route[1]).document(server.collections))
                if len(route) == 3 and route[0] == "task":
                    task = server.task(route[1])
                    if route[2] == "successful_transfers" and self.command == "GET":
                        return self._send(200, server.paged(task.succeeded, "successful_transfers",
                                                            query.get("marker")))
                    if route[2] == "skipped_errors" and self.command == "GET":
                        return self._send(200, server.paged(task.skipped, "skipped_errors", query.get("marker")))
                    if route[2] == "cancel" and self.command == "POST":
                        return self._send(200, server.cancel(route[1]))
                if len(route) == 4 and route[:2] == ["operation", "endpoint"] and route[3] == "ls":
                    return self._send(200, server.ls(route[2], query.get("path", "/")))
                raise APIError(404, "ClientError.NotFound", f"No such resource {self.command} {path}")
            except APIError as exc:
                body_out: dict[str, Any] = {"code": exc.code, "message": exc.message, "request_id":
                                            uuid.uuid4().hex[:12], "resource": path}
                if path == "/v2/oauth2/token":
                    body_out = {"error": exc.code, "error_description": exc.message}
                return self._send(exc.status, body_out)

        do_GET = do_POST = do_PUT = do_DELETE = _dispatch

    return Handler
