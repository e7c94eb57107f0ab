"""How the status page (/ui) reads task events, in real headless Chromium against a stub of
the two REST calls it makes (GET /endpoints, GET /tasks) with fixed answers, so every
rendered number is known: a task that waited for its inputs shows WAITING (counted, in its
own colour) and the time it waited as its own stage, which is not in "service"; a task
without inputs shows no waiting stage. The same files as the real page (lambdas.ui_assets
serves them); tests/e2e/test_status_page.py follows real tasks through the embedded runtime."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from lambdas import ui_assets
from tests.e2e.test_status_page import ARTIFACTS, browser, sign_in, wait  # noqa: F401 - browser: the fixture

NOW = time.time()
EP = "11111111-2222-3333-4444-555555555555"


def events(*pairs):
    return [[state, NOW - 60 + offset] for state, offset in pairs]


TASKS = [
    # no inputs: service 1 ms, queue 10, dispatch 2, run 100, return 3
    {"task_id": "plain-000-task", "endpoint_id": EP, "state": "SUCCEEDED", "created": NOW - 60,
     "events": events(("CREATED", 0), ("QUEUED", 0.001), ("DISPATCHED", 0.011), ("RUNNING", 0.013), ("DONE", 0.113),
                      ("SUCCEEDED", 0.116), ("STORED", 0.116))},
    # inputs: stored WAITING, released 2.5 s later; then as above
    {"task_id": "waited-00-task", "endpoint_id": EP, "state": "SUCCEEDED", "created": NOW - 59,
     "events": events(("CREATED", 1), ("WAITING", 1), ("QUEUED", 3.5), ("DISPATCHED", 3.51), ("RUNNING", 3.512),
                      ("DONE", 3.612), ("SUCCEEDED", 3.615), ("STORED", 3.615))},
    {"task_id": "waiting-1-task", "endpoint_id": EP, "state": "WAITING", "created": NOW - 58,
     "events": events(("CREATED", 2), ("WAITING", 2))},
    {"task_id": "waiting-2-task", "endpoint_id": EP, "state": "WAITING", "created": NOW - 57,
     "events": events(("CREATED", 3), ("WAITING", 3))},
    # an input failed: never released
    {"task_id": "depfail-0-task", "endpoint_id": EP, "state": "FAILED", "created": NOW - 56,
     "reason": "DependencyFailed: input task waited-00-task ended FAILED",
     "events": events(("CREATED", 4), ("WAITING", 4), ("FAILED", 5), ("STORED", 5))},
]
ENDPOINTS = [{"endpoint_id": EP, "name": "local", "status": "online", "metadata": {"workers": 2},
              "stats": {"manager_count": 1, "workers": 2}, "backlog": 0, "last_heartbeat": NOW}]


class Stub(BaseHTTPRequestHandler):
    config = ui_assets.PageConfig(api_url="/", ws_url=None)

    def do_GET(self):  # noqa: N802 - the http.server name
        path = urlsplit(self.path).path
        if path.startswith("/ui"):
            answer = ui_assets.serve(path, self.config)
            return self._send(answer.status, answer.headers, answer.body)
        if not self.headers.get("Authorization", "").startswith("Bearer "):
            return self._send(401, {"Content-Type": "application/json"}, b"{}")
        body = {"/endpoints": {"endpoints": ENDPOINTS}, "/tasks": {"tasks": TASKS}}.get(path)
        if body is None:
            return self._send(404, {"Content-Type": "application/json"}, b"{}")
        return self._send(200, {"Content-Type": "application/json"}, json.dumps(body).encode())

    def _send(self, status, headers, body):
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def stub_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_waiting_tasks_and_the_waiting_stage(browser, stub_url):  # noqa: F811
    sign_in(browser, stub_url, "any-token")
    wait(browser, "return document.querySelectorAll('#tasks tbody tr').length === 5", 30, "the tasks")
    browser.save_screenshot(str(ARTIFACTS / "stages-waiting.png"))
    heads = browser.execute_script("return [...document.querySelectorAll('#tasks thead th')].map(h => h.textContent)")
    assert heads == ["task", "endpoint", "state", "created", "service", "waiting", "queue", "dispatch", "run",
                     "return", "total"]
    rows = browser.execute_script(
        "const out = {}; for (const r of document.querySelectorAll('#tasks tbody tr'))"
        " out[r.dataset.task] = {state: r.dataset.state, cells: [...r.cells].slice(4).map(c => c.textContent),"
        " colour: getComputedStyle(r.cells[2]).color, endpoint: r.cells[1].textContent}; return out")
    assert rows["plain-000-task"]["cells"] == ["1.0", "", "10.0", "2.0", "100.0", "3.0", "116.0"]
    # the wait is its own stage, and what it leaves of CREATED -> QUEUED is the service's (0 here)
    assert rows["waited-00-task"]["cells"] == ["0.0", "2500.0", "10.0", "2.0", "100.0", "3.0", "2615.0"]
    for tid in ("waiting-1-task", "waiting-2-task"):
        assert rows[tid]["state"] == "WAITING" and rows[tid]["cells"] == [""] * 7
        assert rows[tid]["colour"] == "rgb(138, 90, 0)"  # .state-WAITING: a colour of its own
    assert rows["depfail-0-task"]["cells"] == [""] * 6 + ["1000.0"]  # never released: no waiting stage
    assert rows["plain-000-task"]["colour"] != rows["waiting-1-task"]["colour"]
    assert {r["endpoint"] for r in rows.values()} == {"local"}
    counts = browser.execute_script(
        "return [...document.querySelectorAll('#state-counts span')].map(s => [s.dataset.state, s.dataset.count,"
        " s.textContent])")
    assert counts == [["WAITING", "2", "WAITING 2"], ["SUCCEEDED", "2", "SUCCEEDED 2"], ["FAILED", "1", "FAILED 1"]]
    assert browser.execute_script("return document.querySelector('#tasks tr[data-task=\"waited-00-task\"]')"
                                  ".cells[5].className") == "stage-waiting"
