"""The service link against a tiny HTTP server that records requests: registration
(retried while the service is down), the queues it hands back, heartbeats with the
bearer token, and tasks that keep running while heartbeats fail."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from infra.local.processes import free_port
from skyfn.protocol.api import EndpointRegistered
from skyfn.protocol.serialize import deserialize
from tests.agent import fns
from tests.agent.conftest import AgentProc


class FakeService:
    def __init__(self, port: int, queues):
        self.port = port
        self.queues = queues
        self.requests: list[tuple[str, str, dict, dict]] = []
        self.heartbeat_status = 200
        self.server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        svc = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                svc.requests.append(("POST", self.path, dict(self.headers), body))
                if self.path == "/endpoints":
                    status, answer = 201, EndpointRegistered(
                        endpoint_id="ep", name=body["name"], owner="alice", status="new", created=time.time(),
                        metadata=body["metadata"], task_queue=svc.queues.task_desc,
                        results_queue=svc.queues.results_desc,
                        control_queue=svc.queues.control_desc).model_dump(mode="json")
                elif self.path == "/endpoints/ep/heartbeat":
                    status = svc.heartbeat_status
                    answer = {"endpoint_id": "ep"} if status == 200 else {"error": "unavailable", "message": "x"}
                else:
                    status, answer = 404, {"error": "not_found", "message": self.path}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()

    def heartbeats(self) -> list:
        return [r for r in self.requests if r[1].endswith("/heartbeat")]


def _wait(pred, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_register_heartbeat_and_run(home, queues):
    port = free_port()
    svc = FakeService(port, queues)
    agent = AgentProc(home, "linked", {"workers": 1, "service_url": f"http://127.0.0.1:{port}", "token": "tok-123",
                                       "heartbeat_period": 0.2, "receive_wait": 0.5})
    try:
        agent.start()
        time.sleep(1.0)  # the service is down: registration is retried, the agent keeps trying
        assert agent.proc.poll() is None
        svc.start()
        assert _wait(lambda: len(svc.heartbeats()) >= 2), agent.tail()
        method, path, headers, body = svc.requests[0]
        assert path == "/endpoints" and body["name"] == "linked"
        assert body["metadata"]["workers"] == 1 and body["metadata"]["pid"] == agent.proc.pid
        assert all(r[2].get("Authorization") == "Bearer tok-123" for r in svc.requests)
        stats = svc.heartbeats()[-1][3]["stats"]
        assert {"in_flight", "completed", "workers", "uptime"} <= stats.keys()

        # the queues came from the registration answer
        ids = queues.push(fns.square, [(4,)])
        assert deserialize(queues.collect(ids, timeout=20)[ids[0]][0]["result"]) == 16

        # heartbeats failing: tasks keep running, heartbeats resume
        svc.heartbeat_status = 503
        n = len(svc.heartbeats())
        ids = queues.push(fns.square, [(i,) for i in range(50)], prefix="down")
        assert all(r[0]["state"] == "SUCCEEDED" for r in queues.collect(ids, timeout=20).values())
        assert _wait(lambda: len(svc.heartbeats()) > n + 1)
        svc.heartbeat_status = 200
        assert _wait(lambda: svc.heartbeats()[-1][3]["stats"]["completed"] >= 51)
        assert agent.status()["endpoint_id"] == "ep"
        assert agent.terminate() == 0
    finally:
        agent.kill()
        svc.stop()


def test_registration_refused_is_not_retried(home, queues):
    port = free_port()
    svc = FakeService(port, queues)

    svc.start()
    # a 4xx (here: 404 on a wrong base path) stops the agent with the service's reason
    agent = AgentProc(home, "refused", {"workers": 1, "service_url": f"http://127.0.0.1:{port}/wrong", "token": "t"})
    try:
        agent.start()
        assert agent.proc.wait(20) == 2
        assert "refused with 404" in agent.tail()
    finally:
        agent.kill()
        svc.stop()
