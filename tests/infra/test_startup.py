"""Start-up of the embedded runtime (issue 37): `skyfn local up --timings` through the real CLI
(fresh home and restart: the steps, their numbers, phases adding up to the total, the same in
runtime.json and the service's log), the timer and the readiness pipe it rests on, the state
machines' ARNs named before they are deployed (against a real moto), and the Lambda
environments forked from the fork server (real processes). No timing thresholds: how long
each step takes is for docs/benchmarks.md, not for a test on a shared machine."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from infra.local.startup import StartFailed, StepTimer, format_table, summary_line, wait_report

REPO = Path(__file__).resolve().parents[2]

_missing = [m for m in ("lambdas.api", "lambdas.results", "lambdas.bootstrap", "endpoint_agent.cli")
            if importlib.util.find_spec(m) is None]
needs_runtime = pytest.mark.skipif(bool(_missing), reason=f"service or agent modules missing: {_missing}")


def skyfn(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, SKYFN_HOME=str(home), PYTHONPATH=str(REPO))
    env.pop("AWS_ENDPOINT_URL", None)
    return subprocess.run([sys.executable, "-m", "skyfn.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


ROW = re.compile(r"^(?P<indent>\s*)(?P<name>\S.*?)\s{2,}(?P<start>-?\d+)\s+(?P<took>\d+)$")


def parse_table(stdout: str) -> tuple[list[tuple[str, float, float]], list[tuple[str, float, float]], float]:
    """(phases, other processes' steps, total) from the table `--timings` prints."""
    lines = stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("step ") and "took ms" in line)
    phases, details, total = [], [], None
    for line in lines[head + 1:]:
        if line.startswith("total"):
            total = float(line.split()[-1])
            break
        m = ROW.match(line)
        assert m, f"not a step row: {line!r}"
        row = (m["name"].strip(), float(m["start"]), float(m["took"]))
        (details if m["indent"] else phases).append(row)
    assert total is not None, stdout
    return phases, details, total


@needs_runtime
def test_up_timings_fresh_and_restart(tmp_path):
    home = tmp_path / "home"
    try:
        for run in ("fresh", "restart"):
            r = skyfn(home, "local", "up", "--detach", "--timings")
            assert r.returncode == 0, r.stderr + r.stdout
            assert "online" in r.stdout
            phases, details, total = parse_table(r.stdout)
            names = [p[0] for p in phases]
            assert names[0] == "start the command (python, imports)" and names[-1] == "endpoint agent online", names
            for expected in ("spawn moto", "moto listens", "service serves"):
                assert expected in names, names
            assert all(took >= 0 for _, _, took in phases + details)
            # the phases are back to back: they add up to the total (each printed rounded to 1 ms)
            assert abs(sum(p[2] for p in phases) - total) <= len(phases), (phases, total)
            for (_, start, took), (_, nxt, _) in zip(phases, phases[1:]):
                assert abs(start + took - nxt) <= 1.5
            steps = {d[0] for d in details}
            for expected in ("service: start python, import the service", "service: create tables and queues",
                             "service: deploy state machines", "service: start gateway (API environments)",
                             "service: start schedules (reaper, history environments)"):
                assert expected in steps, steps
            if run == "restart":
                assert "service: restore moto's DynamoDB and S3" in steps, steps
                assert "restored " in r.stdout and "DynamoDB items" in r.stdout

            # the same figures in runtime.json and one line in the runtime's log
            record = json.loads((home / "local" / "runtime.json").read_text())["startup"]
            assert abs(record["total_ms"] - total) <= 1
            assert [s["name"] for s in record["steps"] if not s["detail"]] == names
            log = (home / "local" / "service.log").read_text()
            assert log.count("skyfn local up took ") == (1 if run == "fresh" else 2)
            assert "start-up step deploy state machines: " in log
            # moto stands aside for the task path once the runtime is up (nice +10)
            moto = psutil.Process(int((home / "local" / "moto.pid").read_text().split()[0]))
            redis = psutil.Process(int((home / "local" / "redis.pid").read_text().split()[0]))
            assert moto.nice() == redis.nice() + 10
            assert {t.id for t in moto.threads()} and all(
                os.getpriority(os.PRIO_PROCESS, t.id) == redis.nice() + 10 for t in moto.threads())

            down = skyfn(home, "local", "down")
            assert down.returncode == 0, down.stderr
    finally:
        skyfn(home, "local", "down")


@needs_runtime
def test_a_service_that_cannot_start_fails_up_with_its_reason(tmp_path):
    """The service reports its failure on the ready pipe: `up` names it and stops what it
    started. Here the AWS endpoint it is given answers nothing (the service cannot name its
    state machines' account)."""
    import socket

    home = tmp_path / "home"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: refused
        try:
            r = skyfn(home, "local", "up", "--detach", "--no-endpoint", "--aws-endpoint", dead)
            assert r.returncode == 1, r.stdout + r.stderr
            assert "the service failed to start: " in r.stderr and "Could not connect" in r.stderr, r.stderr
            assert len(r.stderr.strip().splitlines()) == 1
            assert not list((home / "local").glob("*.pid"))
            assert "starting the service failed" in (home / "local" / "service.log").read_text()
        finally:
            skyfn(home, "local", "down")


def test_phases_add_up_and_other_steps_are_shown_under_them():
    t = StepTimer(origin_ms=1000.0)
    t._phase_start_ms = 1000.0
    t.steps = []
    from infra.local.startup import Step

    t.steps += [Step("a", 0.0, 100.0), Step("b", 100.0, 250.0)]
    t.add("service: x", 1050.0, 1300.0)
    t.add("service: y", 1020.0, 1060.0)
    timings = t.as_dict()
    assert timings["total_ms"] == 350.0
    table = format_table(timings)
    lines = table.splitlines()
    assert lines[1].startswith("a ") and lines[2].strip().startswith("service: y")  # ended during a
    assert lines[3].startswith("b ") and lines[4].strip().startswith("service: x")  # ended during b
    assert lines[5].split() == ["total", "350"]
    assert summary_line(timings) == "skyfn local up took 350 ms: a 100 ms, b 250 ms"


def test_step_measures_back_to_back_phases():
    t = StepTimer()
    with t.step("one"):
        pass
    with t.step("two"):
        pass
    one, two = t.steps
    assert one.start_ms >= 0 and two.start_ms == pytest.approx(one.start_ms + one.took_ms)
    assert t.total_ms() == pytest.approx(two.start_ms + two.took_ms)


def test_wait_report_returns_the_word_or_fails_on_exit():
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", "import os, sys; os.write(int(sys.argv[1]), b'{\"ready\": true}\\n')",
                             str(w)], pass_fds=(w,))
    os.close(w)
    assert wait_report(r, 30) == {"ready": True}
    proc.wait(10)

    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], pass_fds=(w,))
    os.close(w)
    with pytest.raises(StartFailed, match="exited before it was ready"):
        wait_report(r, 30)
    assert proc.wait(10) == 3


def test_the_default_account_is_motos():
    from moto.core.models import DEFAULT_ACCOUNT_ID

    from infra.local.processes import MOTO_DEFAULT_ACCOUNT, moto_account

    assert MOTO_DEFAULT_ACCOUNT == DEFAULT_ACCOUNT_ID
    assert moto_account({}) == DEFAULT_ACCOUNT_ID and moto_account({"MOTO_ACCOUNT_ID": "210987654321"}) == "210987654321"


def test_state_machines_are_deployed_as_named_in_advance(moto_server, monkeypatch):
    """The API's environments start with the planned ARNs while deploy() runs: the real
    deployment into moto has exactly those names (and a different plan is refused)."""
    from infra.local.processes import moto_account
    from infra.local.standins.sfn.deploy import api_env, check, deploy, planned

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "skyfn-local")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "skyfn-local")
    monkeypatch.delenv("MOTO_ACCOUNT_ID", raising=False)
    dep = deploy({}, prefix="plan37", bucket="plan37-payloads", endpoint_url=moto_server.url)
    plan = planned(prefix="plan37", bucket="plan37-payloads", region="us-east-1", account=moto_account())
    assert api_env(dep) == api_env(plan)
    check(dep, plan)
    with pytest.raises(RuntimeError, match="not named as planned"):
        check(dep, planned(prefix="plan37", bucket="plan37-payloads", region="us-east-1", account="210987654321"))


def test_environments_are_forks_of_the_fork_server_when_their_variables_are_ours(tmp_path, monkeypatch):
    """Same variables as this process: a fork of the fork server (which imported the
    libraries), with the pool's niceness; other variables: a fresh interpreter. Both run the
    handler; both end when the pool closes, and the fork's exit reaches the pool."""
    from infra.local.standins import lambda_forkserver
    from infra.local.standins.lambda_pool import LambdaPool, child_env

    if not lambda_forkserver.enabled():
        pytest.skip("the fork server is Linux only")
    forked = LambdaPool("tests.infra.sample_handlers:environment", min_workers=2, max_workers=2, nice=3).start()
    other = LambdaPool("tests.infra.sample_handlers:environment", min_workers=1, max_workers=1,
                       env={"SKYFN_TEST_OTHER": "1"}).start()
    try:
        server = lambda_forkserver.shared(child_env(), str(REPO))
        assert server is not None and server.serves(child_env())
        for pid in forked.pids():
            proc = psutil.Process(pid)
            assert proc.ppid() == server.proc.pid and proc.nice() == psutil.Process().nice() + 3
        assert psutil.Process(other.pids()[0]).ppid() == os.getpid()
        assert forked.invoke({"names": ["PYTHONPATH"]}, "f", 10, "r1") == {"PYTHONPATH": child_env()["PYTHONPATH"]}
        assert other.invoke({"names": ["SKYFN_TEST_OTHER"]}, "f", 10, "r2") == {"SKYFN_TEST_OTHER": "1"}
        workers = list(forked._all)
    finally:
        forked.close()
        other.close()
    assert all(w.proc.wait(10) == 0 for w in workers)  # the exit status came from the fork server


def test_an_idle_fork_server_for_old_variables_is_replaced_and_a_busy_one_kept(monkeypatch):
    """The process's variables change after the fork server started (a test session, a
    runtime started again in-process): once no fork of the old server runs, the next pool
    gets a server for the new variables; while one runs, other variables get a fresh
    interpreter and the old server stays (its forks' exits come from it)."""
    from infra.local.standins import lambda_forkserver
    from infra.local.standins.lambda_pool import LambdaPool, child_env

    if not lambda_forkserver.enabled():
        pytest.skip("the fork server is Linux only")
    monkeypatch.setenv("SKYFN_TEST_GENERATION", "1")
    first = LambdaPool("tests.infra.sample_handlers:environment", min_workers=1, max_workers=1).start()
    old = lambda_forkserver.shared(child_env(), str(REPO))
    assert old is not None and psutil.Process(first.pids()[0]).ppid() == old.proc.pid

    monkeypatch.setenv("SKYFN_TEST_GENERATION", "2")  # the old server's forks still run: it stays
    assert lambda_forkserver.shared(child_env(), str(REPO)) is None and not old._closed
    second = LambdaPool("tests.infra.sample_handlers:environment", min_workers=1, max_workers=1).start()
    try:
        assert psutil.Process(second.pids()[0]).ppid() == os.getpid()
        assert second.invoke({"names": ["SKYFN_TEST_GENERATION"]}, "f", 10, "r1") == {"SKYFN_TEST_GENERATION": "2"}
    finally:
        second.close()
    workers = list(first._all)
    first.close()
    assert all(w.proc.wait(10) == 0 for w in workers)

    third = LambdaPool("tests.infra.sample_handlers:environment", min_workers=1, max_workers=1).start()
    try:
        new = lambda_forkserver.shared(child_env(), str(REPO))
        assert new is not None and new is not old and old._closed and old.proc.poll() is not None
        assert psutil.Process(third.pids()[0]).ppid() == new.proc.pid
        assert third.invoke({"names": ["SKYFN_TEST_GENERATION"]}, "f", 10, "r2") == {"SKYFN_TEST_GENERATION": "2"}
    finally:
        third.close()


def test_the_moto_bridge_gives_every_botocore_session_one_data_loader():
    """moto makes botocore sessions of its own as it builds services; each used to parse
    botocore's endpoint and model JSON again. In the bridge's process they share one loader
    (and its cache); a plain process keeps one per session."""
    probe = ("import botocore.session as s; a, b = s.Session(), s.Session(); "
             "print(a.get_component('data_loader') is b.get_component('data_loader'))")
    shared = "from infra.local.standins.sfn.moto_bridge import share_botocore_data; share_botocore_data(); "
    outs = [subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
            for code in (probe, shared + probe)]
    assert [o.stdout.strip() for o in outs] == ["False", "True"], [o.stderr[-500:] for o in outs]
