"""Argument refs whose lifetime does not depend on the client (issue 23), with real processes.

The embedded runtime's endpoint has its own Redis (tests/e2e/conftest.py). A client -- a
real subprocess running an Executor, as a notebook kernel does -- submits tasks whose large
arguments become refs on that Redis, and is SIGKILLed while the tasks hold them (a kernel
restart). Then every argument key carries a TTL (none is left at -1, which would stay
forever), and once the tasks are released and finish, succeeding or failing, the worker that
ran each has evicted its arguments: the keys are gone although no client is left to evict
them. A worker SIGKILLed mid-task evicts nothing: the task, run again, still finds its
argument.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import redis

from skyfn import Executor
from skyfn.data.autoref import DEFAULT_TTL

REPO = Path(__file__).resolve().parents[2]
ARG_BYTES = 3 << 20        # each argument: 3 MiB, above the Executor's 1 MiB threshold
PREFIX = "skyfn:d:"

# The client: submits N tasks holding a large argument each, writes their ids once all are
# submitted, then waits for results it will never get (the test SIGKILLs it).
def hold(arr, started, release, fail):
    """Say it started, wait for the release file, then use the argument (or fail). The client
    script below defines it from this source, so it travels by value from its __main__."""
    import hashlib
    import os
    import time

    import numpy as np

    with open(os.path.join(started, f"{os.getpid()}-{time.time_ns()}"), "w") as f:
        f.write(str(os.getpid()))
    while not os.path.exists(release):
        time.sleep(0.02)
    a = np.asarray(arr)
    if fail:
        raise ValueError(f"refused on purpose after reading {a.nbytes} bytes")
    return hashlib.sha256(a.tobytes()).hexdigest()


# The client: submits N tasks holding a large argument each, writes their ids once all are
# submitted, then waits for results it will never get (the test SIGKILLs it).
CLIENT = r'''
import json, os, sys, time
import numpy as np
from skyfn import Executor

%(hold)s

n, started, release, ids_file, fail = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1"
ex = Executor(endpoint="local")
assert ex._arg_refs is not None, "the endpoint's store must be found (data_store='auto')"
futures = [ex.submit(hold, np.random.default_rng(seed).random(%(elems)d), started, release, fail)
           for seed in range(n)]
deadline = time.time() + 120
while any(f.task_id is None for f in futures) and time.time() < deadline:
    time.sleep(0.01)
with open(ids_file + ".tmp", "w") as f:
    json.dump([f.task_id for f in futures], f)
os.replace(ids_file + ".tmp", ids_file)
while True:  # in flight, waiting: the test kills this process here
    time.sleep(1)
''' % {"elems": ARG_BYTES // 8, "hold": inspect.getsource(hold)}


def _digest(seed: int) -> str:
    return hashlib.sha256(np.random.default_rng(seed).random(ARG_BYTES // 8).tobytes()).hexdigest()


def _redis(home) -> redis.Redis:
    doc = json.loads((home / "endpoints" / "local" / "data" / "stores.json").read_text())
    conn = doc["stores"][doc["default"]]["connector"]
    with open(conn["password_file"]) as f:
        return redis.Redis(host=conn["host"], port=conn["port"], password=f.read().strip())


def _data_keys(r: redis.Redis) -> set:
    return set(r.scan_iter(match=PREFIX + "*", count=1000))


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _started(d: Path) -> list[int]:
    return [int(p.read_text() or 0) for p in d.iterdir() if p.read_text()]


def _kill_client_in_flight(tmp_path: Path, n: int, fail: bool) -> tuple[list[str], Path, Path]:
    """Run the client, wait until its n tasks are submitted and as many run as the endpoint's
    workers allow, SIGKILL it; (task ids, started dir, release file)."""
    started, release, ids_file = tmp_path / "started", tmp_path / "release", tmp_path / "ids.json"
    started.mkdir()
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    log = open(tmp_path / "client.log", "w")
    proc = subprocess.Popen([sys.executable, str(script), str(n), str(started), str(release), str(ids_file),
                             "1" if fail else "0"], cwd=str(REPO), env=dict(os.environ), stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        _wait(lambda: ids_file.exists() or proc.poll() is not None, 180, "the client to submit its tasks")
        assert proc.poll() is None, f"the client ended early: {(tmp_path / 'client.log').read_text()}"
        ids = json.loads(ids_file.read_text())
        assert len(ids) == n and all(ids)
        _wait(lambda: len(_started(started)) >= min(n, 2), 120, "the tasks to run")  # the endpoint has 2 workers
    finally:
        proc.send_signal(signal.SIGKILL)  # a notebook kernel restarted with its tasks in flight
        assert proc.wait(30) == -signal.SIGKILL
        log.close()
    return ids, started, release


def _assert_all_expire(r: redis.Redis, keys: set, ttl: float) -> None:
    ttls = {k: r.ttl(k) for k in keys}
    assert all(t != -1 for t in ttls.values()), f"argument keys that would stay forever: {ttls}"
    assert all(ttl - 600 < t <= ttl for t in ttls.values()), ttls


def test_a_killed_clients_argument_refs_expire_and_are_evicted_by_the_agent(local_home, client, tmp_path):
    r = _redis(local_home)
    before = _data_keys(r)
    ids, started, release = _kill_client_in_flight(tmp_path, 5, fail=False)
    try:
        ours = _data_keys(r) - before
        assert len(ours) == 5  # one key per 3 MiB argument (below the connector's 8 MiB chunk size)
        _assert_all_expire(r, ours, DEFAULT_TTL)
        time.sleep(1.0)  # the client is gone: nobody evicts them meanwhile
        assert {k for k in ours if r.exists(k)} == ours
    finally:
        release.touch()
    assert [client.get_result(t, timeout=180) for t in ids] == [_digest(s) for s in range(5)]
    _wait(lambda: not (ours & _data_keys(r)), 30, "the workers to evict the arguments")
    assert _data_keys(r) & ours == set()
    assert len(_started(started)) == 5  # each task ran once


def test_a_failed_task_evicts_its_argument_refs_too(local_home, client, tmp_path):
    r = _redis(local_home)
    before = _data_keys(r)
    ids, started, release = _kill_client_in_flight(tmp_path, 2, fail=True)
    try:
        ours = _data_keys(r) - before
        assert len(ours) == 2
        _assert_all_expire(r, ours, DEFAULT_TTL)
    finally:
        release.touch()
    for t in ids:
        with pytest.raises(ValueError, match=f"refused on purpose after reading {ARG_BYTES} bytes"):
            client.get_result(t, timeout=180)
        assert client.get_task(t)["state"] == "FAILED"
    _wait(lambda: not (ours & _data_keys(r)), 30, "the workers to evict the failed tasks' arguments")
    assert _data_keys(r) & ours == set()


def test_a_task_rerun_after_its_worker_died_still_finds_its_argument(local_home, client, tmp_path):
    r = _redis(local_home)
    started, release = tmp_path / "started", tmp_path / "release"
    started.mkdir()
    before = _data_keys(r)
    arr = np.random.default_rng(11).random(ARG_BYTES // 8)
    with Executor(endpoint="local", client=client, arg_ref_ttl=900) as ex:
        fut = ex.submit(hold, arr, str(started), str(release), False)
        try:
            first = _wait(lambda: _started(started), 120, "the task to start")[0]
            ours = _data_keys(r) - before
            assert len(ours) == 1
            _assert_all_expire(r, ours, 900)  # the Executor's own arg_ref_ttl
            os.kill(first, signal.SIGKILL)  # the worker is lost mid-task: it must evict nothing
            again = _wait(lambda: [p for p in _started(started) if p != first], 120, "the task to run again")
            assert again and {k for k in ours if r.exists(k)} == ours
        finally:
            release.touch()
        assert fut.result(timeout=180) == hashlib.sha256(arr.tobytes()).hexdigest()
    _wait(lambda: not (ours & _data_keys(r)), 30, "the argument to be evicted")
