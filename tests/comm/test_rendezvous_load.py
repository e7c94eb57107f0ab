"""The rendezvous server under load and as a program: thousands of concurrent peers, the
`python -m rendezvous` and `skyfn rendezvous` commands, and the pairing benchmark.

The server runs in a child process (as in production); peers are asyncio clients.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import defaultdict

import pytest

import rendezvous
from rendezvous import client, make_token
from rendezvous.bench import pairings_per_second, relay_bytes_per_second
from rendezvous.client import RendezvousError
from rendezvous.runner import raise_fd_limit

SECRET = "load-secret"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def server_proc():
    raise_fd_limit()
    handle = rendezvous.serve_in_process("127.0.0.1", 0, SECRET, log_level="warning")
    yield handle
    handle.stop()


async def _join_all(address, peers):
    """peers: list of (group, token, size, rank); returns results (AsyncSession or exception)."""
    return await asyncio.gather(*(client.join_async(address, g, t, n, r, timeout=60) for g, t, n, r in peers),
                                return_exceptions=True)


def join_all(address, peers):
    """_join_all on a fresh loop; sessions are closed before the loop is (their tables are kept)."""
    async def go():
        results = await _join_all(address, peers)
        for res in results:
            if not isinstance(res, BaseException):
                res.close()
        return results
    return asyncio.run(go())


def _check_groups(peers, results):
    by_group = defaultdict(list)
    for (g, _, size, _), res in zip(peers, results):
        assert not isinstance(res, BaseException), f"group {g}: {res!r}"
        by_group[g].append(res)
    for g, sessions in by_group.items():
        size = sessions[0].size
        assert sorted(s.rank for s in sessions) == list(range(size)), g
        table = sessions[0].peers
        assert all(s.peers == table for s in sessions), g
        for s in sessions:
            assert table[s.rank] == s.local_address
    return by_group


def test_1200_peers_of_600_groups_join_at_once(server_proc, unique):
    peers = []
    for i in range(600):
        g = f"flood-{unique}-{i}"
        t = make_token(SECRET, g)
        peers += [(g, t, 2, -1), (g, t, 2, -1)]
    results = join_all(server_proc.address, peers)
    by_group = _check_groups(peers, results)
    assert len(by_group) == 600


def test_concurrent_rank_assignment_in_groups_of_8_with_intruders(server_proc, unique):
    peers, intruders = [], []
    for i in range(40):
        g = f"eight-{unique}-{i}"
        t = make_token(SECRET, g)
        peers += [(g, t, 8, -1)] * 8
        intruders.append((g, make_token("not-the-secret", g), 8, -1))
    results = join_all(server_proc.address, peers + intruders)
    by_group = _check_groups(peers, results[:len(peers)])
    assert len(by_group) == 40
    for res in results[len(peers):]:
        assert isinstance(res, RendezvousError) and res.code == "bad_token"


def test_flood_of_garbage_does_not_disturb_groups(server_proc, unique):
    """500 hostile connections (binary junk, endless lines) at once with 100 real pairs."""
    host, port = server_proc.host, server_proc.port

    async def hostile(i):
        reader, writer = await asyncio.open_connection(host, port)
        junk = os.urandom(200).replace(b"\n", b"") + b"\n" if i % 2 else b"JOIN " + b"x" * 3000
        writer.write(junk)
        answer = await asyncio.wait_for(reader.read(), 60)     # until the server closes
        writer.close()
        return answer

    async def go():
        peers = []
        for i in range(100):
            g = f"amid-{unique}-{i}"
            t = make_token(SECRET, g)
            peers += [(g, t, 2, -1)] * 2
        results = await asyncio.gather(*(hostile(i) for i in range(500)), _join_all(server_proc.address, peers))
        sessions = results[-1]
        for res in sessions:
            if not isinstance(res, BaseException):
                res.close()
        return peers, results[:-1], sessions
    peers, answers, sessions = asyncio.run(go())
    assert all(a.startswith(b"ERROR malformed ") and a.count(b"\n") == 1 for a in answers)
    assert len(_check_groups(peers, sessions)) == 100


def test_barriers_of_many_groups_concurrently(server_proc, unique):
    async def go():
        peers = []
        for i in range(50):
            g = f"bar-{unique}-{i}"
            t = make_token(SECRET, g)
            peers += [(g, t, 4, -1)] * 4
        sessions = await _join_all(server_proc.address, peers)
        for epoch in range(3):
            assert await asyncio.gather(*(s.barrier() for s in sessions)) == [epoch] * len(sessions)
        for s in sessions:
            s.close()
    asyncio.run(go())


def test_python_m_rendezvous_answers_and_never_logs_secrets(tmp_path, unique):
    log = tmp_path / "server.log"
    g = f"cli-{unique}"
    t = make_token(SECRET, g)
    with open(log, "wb") as err:
        with rendezvous.serve_in_process("127.0.0.1", 0, SECRET, log_level="info", stderr=err) as h:
            with client.connect(h.address, g, t, 2) as a:
                with pytest.raises(RendezvousError):
                    client.connect(h.address, g, make_token("wrong", g), 2)
                with client.join(h.address, g, t, 2) as b:
                    assert a.wait_peers(10) == b.peers
    text = log.read_text()
    assert f"join group {g} rank 0/2" in text and f"join group {g} rank 1/2" in text
    assert "error bad_token" in text
    assert SECRET not in text and t not in text and t.split(".")[1] not in text


def test_skyfn_rendezvous_command(tmp_path, unique):
    port_file = tmp_path / "port"
    env = dict(os.environ, SKYFN_RENDEZVOUS_SECRET=SECRET)
    proc = subprocess.Popen([sys.executable, "-m", "skyfn.cli", "rendezvous", "--host", "127.0.0.1", "--port", "0",
                             "--port-file", str(port_file), "--log-level", "warning"],
                            env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "skyfn rendezvous did not listen"
            time.sleep(0.05)
        address = f"127.0.0.1:{int(port_file.read_text())}"
        g = f"skyfn-{unique}"
        with client.join(address, g, make_token(SECRET, g), 1) as s:
            assert (s.rank, s.size) == (0, 1)
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.returncode == 0


def test_skyfn_rendezvous_without_secret_fails_clearly():
    env = {k: v for k, v in os.environ.items() if k != "SKYFN_RENDEZVOUS_SECRET"}
    done = subprocess.run([sys.executable, "-m", "skyfn.cli", "rendezvous", "--port", "0"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "no secret: pass --secret S or set SKYFN_RENDEZVOUS_SECRET" in done.stderr
    done = subprocess.run([sys.executable, "-m", "rendezvous", "--port", "0"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "no secret" in done.stderr


def test_pairing_benchmark_counts_pairings(server_proc):
    rate = pairings_per_second(server_proc.host, server_proc.port, SECRET, seconds=0.5, processes=1,
                               concurrency=8)
    assert rate > 0


def test_relay_benchmark_moves_every_byte(server_proc):
    assert relay_bytes_per_second(server_proc.host, server_proc.port, SECRET, nbytes=(16 << 20) + 3) > 0
