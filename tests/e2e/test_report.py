"""GET /tasks, Client.report() and `skyfn report` against the real embedded runtime
(issue 13): the listing carries each task's events, only its owner sees it, and the report
writes its PNGs and one self-contained HTML file."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import requests


def double(x):
    return 2 * x


def test_listing_report_and_cli(client, endpoint_id, local_home, tmp_path):
    from infra.local import runtime
    from infra.local.state import StateDir
    from skyfn import Executor

    with Executor(endpoint_id=endpoint_id, client=client) as ex:
        futures = [ex.submit(double, i) for i in range(300)]
        assert [f.result(timeout=120) for f in futures] == [2 * i for i in range(300)]
    ids = {f.task_id for f in futures}

    listed = {t["task_id"]: t for t in client.tasks(since="10m", endpoint_id=endpoint_id)}
    assert ids <= set(listed)
    one = listed[futures[0].task_id]
    assert one["state"] == "SUCCEEDED" and one["endpoint_id"] == endpoint_id
    states = [s for s, _ in one["events"]]
    assert states[:2] == ["CREATED", "QUEUED"] and "RUNNING" in states and states[-1] == "STORED"
    assert "result" not in one and "payload" not in one

    # another user sees none of them; no token sees nothing
    bob = runtime.mint_token(StateDir.at(local_home), "bob")
    r = requests.get(f"{client.service_url}/tasks?since=0", headers={"Authorization": f"Bearer {bob}"}, timeout=30)
    assert r.status_code == 200 and not ids & {t["task_id"] for t in r.json()["tasks"]}
    assert requests.get(f"{client.service_url}/tasks?since=0", timeout=30).status_code == 401
    assert requests.get(f"{client.service_url}/tasks?limit=0", headers={"Authorization": f"Bearer {bob}"},
                        timeout=30).status_code == 422

    report = client.report(since="10m", endpoint="local", html=tmp_path / "r.html", png_dir=tmp_path / "png")
    assert report.summary["tasks"] >= 300 and report.summary["states"].get("SUCCEEDED", 0) >= 300
    assert report.summary["stages_ms"]["run"]["n"] >= 300
    assert set(report.pngs) == {"throughput", "in_flight", "stages", "stages_cdf", "backlog"}
    for path in report.pngs.values():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = report.html.read_text()
    assert page.count("data:image/png;base64,") == 5 and "Little" in page and "<script" not in page

    out = subprocess.run([sys.executable, "-m", "skyfn.cli", "report", "--since", "10m", "--endpoint", "local",
                          "--html", str(tmp_path / "cli.html"), "--png", str(tmp_path / "cli")],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert f"report written to {tmp_path / 'cli.html'}" in out.stdout and "Little's law" in out.stdout
    assert len(list(Path(tmp_path / "cli").glob("*.png"))) == 5


def pause(seconds):
    import time

    time.sleep(seconds)
    return seconds


def test_the_wait_for_inputs_is_its_own_stage(client, endpoint_id, tmp_path):
    """Tasks given a future (issue 26) waited for it: the report shows that as the 'waiting'
    stage, and their 'service' stage no longer holds it."""
    import time

    from skyfn import Executor

    start = time.time()
    with Executor(endpoint_id=endpoint_id, client=client) as ex:
        first = ex.submit(pause, 2.0)
        dependents = [ex.submit(double, first) for _ in range(3)]
        assert [d.result(timeout=120) for d in dependents] == [4.0] * 3
    report = client.report(since=start, endpoint="local", html=tmp_path / "r.html")
    stages = report.summary["stages_ms"]
    assert report.summary["tasks"] == 4 and report.summary["waiting"]["tasks"] == 3
    assert stages["waiting"]["n"] == 3 and 1500 <= stages["waiting"]["p50"] < 10_000  # its input ran 2 s
    assert stages["service"]["n"] == 4 and stages["service"]["p95"] < 1000  # the 2 s wait is not the service's
    text = report.text()
    assert "3 tasks waited for their inputs" in text
    assert any(line.split()[0] == "waiting" for line in text.splitlines() if line.strip())
    assert "<th>waiting (ms)</th>" in report.html.read_text()
