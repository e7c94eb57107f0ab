"""A test double of the skyfn REST service for the SDK's unit tests.

A real HTTP server (http.server, HTTP/1.1 keep-alive, in a thread) that implements the
routes of docs/contracts.md in memory, validates bodies with the models of
skyfn.protocol.api, "runs" tasks by calling the deserialized function in a runner
thread, honours ``wait`` on POST /tasks/status, and can inject faults (drop a
connection, answer 503) to exercise the SDK's retries. The SDK is the thing under test;
the real service has its own tests.
"""
from __future__ import annotations

import itertools
import queue
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

import orjson
from pydantic import ValidationError

from skyfn.protocol import api
from skyfn.protocol.remote_exception import wrap_exception
from skyfn.protocol.serialize import deserialize, serialize, unpack_args

FINAL = {"SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED"}
TOKEN = "test-token"


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class FakeService:
    def __init__(self, token: str = TOKEN):
        self.token = token
        self.lock = threading.Condition()
        self.functions: dict[str, dict] = {}
        self.endpoints: dict[str, dict] = {}
        self.tasks: dict[str, dict] = {}
        self.submissions: dict[str, dict] = {}  # idempotency key -> Submitted
        self.log: list[tuple[str, str]] = []  # (method, path) of every request
        self.faults: list[tuple[str, str, str]] = []  # (method, path, action), consumed in order
        self.gate = threading.Event()  # tasks run only while the gate is open
        self.gate.set()
        self.stopped = False
        self.connections: set = set()
        self.done_log: list[str] = []  # task ids in the order they became final (cursor = index)
        self.cursor_polls = 0
        self._ids = itertools.count(1)
        self._fn_cache: dict[str, Any] = {}
        self._runq: "queue.Queue[Optional[str]]" = queue.Queue()
        self.local_endpoint = self.add_endpoint("local")
        self.server = _Server(("127.0.0.1", 0), _make_handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._threads = [
            threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True),
            threading.Thread(target=self._runner, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Stop like a crashed service: no task runs any more, open connections are cut."""
        self.stopped = True
        self._runq.put(None)
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()
        for conn in list(self.connections):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- helpers for tests ----------------------------------------------------------
    def add_endpoint(self, name: str, status: str = "online") -> str:
        eid = str(uuid.uuid4())
        self.endpoints[eid] = {
            "endpoint_id": eid, "name": name, "owner": "tester", "status": status,
            "last_heartbeat": time.time(), "created": time.time(), "backlog": 0, "metadata": {},
        }
        return eid

    def inject(self, method: str, path: str, action: str, times: int = 1) -> None:
        """action: drop_after (process, then close without answering), drop_before,
        503_after (process, then answer 503), 503_before, slow_after (answer 0.3 s late)."""
        self.faults.extend([(method, path, action)] * times)

    def finish(self, task_id: str, state: str, reason: Optional[str] = None) -> None:
        with self.lock:
            t = self.tasks[task_id]
            t.update(state=state, reason=reason)
            t["events"].append((state, time.time()))
            self.done_log.append(task_id)
            self.lock.notify_all()

    def count(self, method: str, path: str) -> int:
        return sum(1 for m, p in self.log if m == method and p == path)

    # -- task runner ----------------------------------------------------------------
    def _runner(self) -> None:
        while True:
            tid = self._runq.get()
            if tid is None:
                return
            self.gate.wait()
            if self.stopped:
                return
            with self.lock:
                t = self.tasks[tid]
                if t["state"] != "QUEUED":
                    continue
                t["state"] = "RUNNING"
                t["events"].append(("RUNNING", time.time()))
            out = self._execute(t)
            with self.lock:
                if t["state"] == "RUNNING":
                    t.update(out)
                    t["events"].append((out["state"], time.time()))
                    self.done_log.append(tid)
                    self.lock.notify_all()
                    self._finished(tid)

    def _execute(self, t: dict) -> dict[str, Any]:
        """Run one task (outside the lock): its final fields."""
        fid = t["function_id"]
        try:
            fn = self._fn_cache.get(fid)
            if fn is None:
                fn = self._fn_cache[fid] = deserialize(self.functions[fid]["function"])
            args, kwargs = unpack_args(t["payload"])
            return {"state": "SUCCEEDED", "result": serialize(fn(*args, **kwargs))}
        except Exception as exc:
            return {"state": "FAILED", "error": wrap_exception(exc)}

    def _finished(self, tid: str) -> None:
        """Called under the lock once a task's final state is stored (subclasses react)."""

    # -- routes ---------------------------------------------------------------------
    def _status_of(self, t: dict, events: bool = False) -> dict:
        st = {"task_id": t["task_id"], "state": t["state"], "result": None, "error": None,
              "reason": t.get("reason"), "retries": 0, "events": None}
        if t["state"] in FINAL:
            st["result"], st["error"] = t.get("result"), t.get("error")
        if events:
            st["events"] = list(t["events"])
        return st

    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        parts = [p for p in path.split("?")[0].split("/") if p]
        if method == "POST" and parts == ["functions"]:
            req = _validate(api.RegisterFunction, body)
            fid = str(uuid.uuid4())
            with self.lock:
                self.functions[fid] = {"function_id": fid, "owner": "tester", "created": time.time(), **req.model_dump()}
            return 201, {"function_id": fid}
        if method == "GET" and len(parts) == 2 and parts[0] == "functions":
            f = self.functions.get(parts[1])
            if f is None:
                raise ApiError(404, "not_found", f"no function {parts[1]}")
            return 200, f
        if method == "GET" and parts == ["endpoints"]:
            return 200, {"endpoints": list(self.endpoints.values())}
        if method == "GET" and len(parts) == 2 and parts[0] == "endpoints":
            e = self.endpoints.get(parts[1])
            if e is None:
                raise ApiError(404, "not_found", f"no endpoint {parts[1]}")
            return 200, e
        if method == "POST" and parts == ["tasks"]:
            return self._submit(body)
        if method == "POST" and parts == ["tasks", "status"]:
            return self._status(body)
        if method == "GET" and len(parts) == 2 and parts[0] == "tasks":
            with self.lock:
                t = self.tasks.get(parts[1])
                if t is None:
                    raise ApiError(404, "not_found", f"no task {parts[1]}")
                info = self._status_of(t, events=True)
                info.update({k: t[k] for k in ("function_id", "endpoint_id", "submission_id", "owner", "created")})
            return 200, info
        if method == "DELETE" and len(parts) == 2 and parts[0] == "tasks":
            with self.lock:
                t = self.tasks.get(parts[1])
                if t is None:
                    raise ApiError(404, "not_found", f"no task {parts[1]}")
                if t["state"] in FINAL:
                    raise ApiError(409, "conflict", f"task {parts[1]} is already {t['state']}")
                t.update(state="CANCELLED", reason="cancelled by its owner")
                t["events"].append(("CANCELLED", time.time()))
                self.done_log.append(t["task_id"])
                self.lock.notify_all()
                return 200, self._status_of(t)
        raise ApiError(404, "not_found", f"no route {method} {path}")

    def _submit(self, body: Any) -> tuple[int, Any]:
        req = _validate(api.SubmitTasks, body)
        with self.lock:
            if req.idempotency_key and req.idempotency_key in self.submissions:
                return 200, {**self.submissions[req.idempotency_key], "replayed": True}
            for tr in req.tasks:
                if tr.function_id not in self.functions:
                    raise ApiError(400, "invalid_request", f"unknown function {tr.function_id}")
                eid = tr.endpoint_id or req.endpoint_id
                if not eid:
                    raise ApiError(400, "invalid_request", "no endpoint_id for a task")
                if eid not in self.endpoints:
                    raise ApiError(400, "invalid_request", f"unknown endpoint {eid}")
            sid = str(uuid.uuid4())
            ids = []
            now = time.time()
            for tr in req.tasks:
                tid = f"t{next(self._ids):07d}-{uuid.uuid4().hex[:8]}"
                self.tasks[tid] = {
                    "task_id": tid, "state": "QUEUED", "function_id": tr.function_id, "payload": tr.payload,
                    "endpoint_id": tr.endpoint_id or req.endpoint_id, "submission_id": sid, "owner": "tester",
                    "created": now, "events": [("CREATED", now), ("QUEUED", now)],
                }
                ids.append(tid)
            answer = {"submission_id": sid, "task_ids": ids, "replayed": False}
            if req.idempotency_key:
                self.submissions[req.idempotency_key] = answer
        for tid in ids:
            self._runq.put(tid)
        return 202, answer

    def _status(self, body: Any) -> tuple[int, Any]:
        """Like the service: without a cursor every id is answered; with the cursor of a
        previous answer only the requested tasks finished since then."""
        req = _validate(api.StatusRequest, body)
        deadline = time.monotonic() + req.wait
        with self.lock:
            if req.cursor is not None:
                self.cursor_polls += 1
                since = int(req.cursor.split("-")[0])
                wanted = set(req.task_ids)
                while True:
                    changed = [i for i in self.done_log[since:] if i in wanted]
                    left = deadline - time.monotonic()
                    if changed or left <= 0:
                        break
                    self.lock.wait(left)
                return 200, {
                    "tasks": {i: self._status_of(self.tasks[i], req.include_events) for i in dict.fromkeys(changed)},
                    "unknown": [], "cursor": f"{len(self.done_log)}-0",
                }
            while True:
                cursor = f"{len(self.done_log)}-0"
                known = [self.tasks[i] for i in req.task_ids if i in self.tasks]
                if len(known) < len(req.task_ids) or any(t["state"] in FINAL for t in known):
                    break  # something to report: a final task, or an unknown id
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.lock.wait(left)
            return 200, {
                "tasks": {t["task_id"]: self._status_of(t, req.include_events) for t in known},
                "unknown": [i for i in req.task_ids if i not in self.tasks],
                "cursor": cursor,
            }


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # clients the tests cut off (stop(), dropped connections) are expected


def _validate(model, body):
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ApiError(400, "invalid_request", f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def _make_handler(service: FakeService):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # One buffered write per answer (flushed by handle_one_request) and TCP_NODELAY:
        # headers and body in separate segments would meet delayed ACKs (~40 ms each).
        wbufsize = 1 << 16
        disable_nagle_algorithm = True

        def log_message(self, *args: Any) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            service.connections.add(self.connection)

        def finish(self) -> None:
            service.connections.discard(self.connection)
            super().finish()

        def _answer(self, status: int, body: Any) -> None:
            data = orjson.dumps(body)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _drop(self) -> None:
            self.close_connection = True

        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            path = self.path.split("?")[0]
            service.log.append((method, path))
            fault = None
            for i, (m, p, action) in enumerate(service.faults):
                if m == method and p == path:
                    fault = service.faults.pop(i)[2]
                    break
            if fault == "drop_before":
                return self._drop()
            if fault == "503_before":
                return self._answer(503, {"error": "unavailable", "message": "try again"})
            if self.headers.get("Authorization") != f"Bearer {service.token}":
                return self._answer(401, {"error": "unauthorized", "message": "missing or invalid bearer token"})
            try:
                body = orjson.loads(raw) if raw else None
            except orjson.JSONDecodeError:
                return self._answer(400, {"error": "invalid_json", "message": "the body is not valid JSON"})
            try:
                status, answer = service.handle(method, path, body)
            except ApiError as exc:
                status, answer = exc.status, {"error": exc.code, "message": exc.message}
            if fault == "slow_after":
                time.sleep(0.3)
            if fault == "drop_after":
                return self._drop()
            if fault == "503_after":
                return self._answer(503, {"error": "unavailable", "message": "try again"})
            self._answer(status, answer)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

    return Handler
