"""`skyfn task watch` against the real embedded runtime (issue 13): the console script run
as a user runs it, on real batches; exact final counts, exit codes, a snapshot of a batch
still running, the failures' reasons, the results push and the long-poll, a terminal (pty),
Ctrl-C, and one-line errors for bad input."""
from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
import uuid

import pytest

SKYFN = [sys.executable, "-m", "skyfn.cli", "task", "watch"]


def odd_job(i):
    import time

    time.sleep(0.03)
    if i % 10 == 3:
        raise ValueError(f"bad input {i}")
    return i


def nap(seconds):
    import time

    time.sleep(seconds)
    return seconds


def held(gate):
    import os
    import time

    deadline = time.monotonic() + 120  # a safety net only: the test opens the gate
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    return gate


def cli(*args, stdin=None, timeout=240):
    return subprocess.run([*SKYFN, *args], input=stdin, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ))


def submit(client, endpoint_id, fn, args):
    fid = client.register_function(fn)
    batch = client.create_batch(endpoint_id)
    for a in args:
        batch.add(fid, a)
    return client.batch_run(batch)


def once_json(*args):
    out = cli(*args, "--once", "--json")
    return out.returncode, (json.loads(out.stdout) if out.stdout.strip() else None), out


def test_a_batch_with_failures_ends_with_exact_counts_reasons_and_exit_1(client, endpoint_id, tmp_path):
    ids = submit(client, endpoint_id, odd_job, range(200))  # 20 of them raise
    path = tmp_path / "ids.txt"
    path.write_text("# the batch\n" + "\n".join(ids) + "\n")

    out = cli("--file", str(path))  # live while it runs; stdout is a pipe: plain lines

    assert out.returncode == 1, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1].startswith("200 tasks, 20 did not succeed: 180 SUCCEEDED, 20 FAILED (")
    assert "last failures:" in lines
    failures = [ln for ln in lines if ln.startswith("  FAILED ")]
    assert len(failures) == 5 and all(" on local: ValueError: bad input " in ln for ln in failures)
    assert any(" finished (" in ln and "tasks/s" in ln for ln in lines)  # the periodic plain lines
    assert out.stderr == ""

    code, snap, _ = once_json("--file", str(path))
    assert code == 1
    assert (snap["total"], snap["succeeded"], snap["failed"], snap["remaining"]) == (200, 180, 20, 0)
    assert snap["states"]["SUCCEEDED"] == 180 and snap["states"]["FAILED"] == 20 and snap["done"] is True
    assert snap["endpoints"] == {"local": {"SUCCEEDED": 180, "FAILED": 20}}
    assert {f["reason"] for f in snap["failures"]} <= {f"ValueError: bad input {i}" for i in range(3, 200, 10)}
    assert snap["eta_seconds"] == 0


@pytest.mark.parametrize("how", ["push", "poll"])
def test_all_succeeded_exits_0_with_ids_from_stdin(client, endpoint_id, how):
    ids = submit(client, endpoint_id, nap, [0.05] * 60)
    out = cli("-f", "-", *(["--no-push"] if how == "poll" else []), stdin="\n".join(ids))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == ("watching 60 tasks on 1 endpoint (results pushed)" if how == "push" else
                        "watching 60 tasks on 1 endpoint (polling, 1 s apart at least)")
    assert lines[-1].startswith("60 tasks, all succeeded: 60 SUCCEEDED (")
    assert "last failures" not in out.stdout


def test_once_json_while_the_batch_runs_then_watch_to_the_end(client, endpoint_id):
    ids = submit(client, endpoint_id, nap, [1.0] * 12)  # 2 workers: about 6 s

    code, snap, out = once_json(*ids)

    assert code == 3, out.stderr  # not final yet
    assert snap["total"] == 12 and not snap["done"] and 0 < snap["remaining"] <= 12
    assert sum(snap["states"].values()) == 12 and snap["failed"] == 0
    assert snap["states"]["RUNNING"] <= 2 + 2  # two workers (a next task may be prefetched)
    assert snap["finished"] == snap["states"]["SUCCEEDED"]
    assert snap["endpoints"]["local"] == {s: n for s, n in snap["states"].items() if n}

    out = cli(*ids[:6], "--file", "-", stdin="\n".join(ids[6:]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1].startswith("12 tasks, all succeeded: 12 SUCCEEDED (")

    code, snap, _ = once_json(*ids)
    assert code == 0 and snap["succeeded"] == 12 and snap["done"]
    out = cli(*ids)  # nothing left to wait for
    assert out.returncode == 0 and out.stdout.splitlines()[0] == "watching 12 tasks on 1 endpoint (all final already)"


def explode(x):
    raise KeyError(f"no {x}")


@pytest.mark.parametrize("how", ["push", "poll"])
def test_a_graph_shows_its_waiting_tasks_and_how_long_they_waited(client, endpoint_id, how):
    """Tasks given futures (issue 26) are WAITING while their input runs (their own count and
    column), and once released the time they waited is shown; a dependent of a failed input
    ends FAILED with DependencyFailed and never counts as released."""
    from skyfn import Executor

    with Executor(endpoint_id=endpoint_id, client=client) as ex:
        first = ex.submit(nap, 3.0)
        waiters = [ex.submit(nap, first), ex.submit(nap, first)]
        doomed = ex.submit(nap, ex.submit(explode, 1))
        futures = [first, *waiters, doomed]
        deadline = time.monotonic() + 30
        while any(f.task_id is None for f in futures) and time.monotonic() < deadline:
            time.sleep(0.05)
        ids = [f.task_id for f in futures]
        assert all(ids)
        code, snap, out = once_json(*ids)
        assert code in (1, 3) and not snap["done"], out.stderr  # 1 once the doomed one failed
        assert snap["states"]["WAITING"] == 2 and snap["endpoints"]["local"]["WAITING"] == 2, snap
        assert snap["waits"]["tasks"] == 2 and snap["waits"]["max_seconds"] < 3.0  # still waiting: so far

        out = cli(*ids, *(["--no-push"] if how == "poll" else []))
        assert [w.result(timeout=60) for w in waiters] == [3.0, 3.0]
    assert out.returncode == 1, out.stderr  # the doomed one failed
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("4 tasks, 1 did not succeed: 3 SUCCEEDED, 1 FAILED (") and \
        "; waited for inputs: 2 tasks, mean " in last, out.stdout

    code, snap, _ = once_json(*ids)
    assert code == 1 and snap["states"]["WAITING"] == 0
    assert snap["waits"]["tasks"] == 2 and 2.5 <= snap["waits"]["mean_seconds"] <= snap["waits"]["max_seconds"] < 30
    (failure,) = snap["failures"]
    assert failure["task_id"] == doomed.task_id and failure["reason"].startswith("DependencyFailed: input task "), \
        failure


def test_since_and_endpoint_select_exactly_the_new_tasks(client, endpoint_id):
    start = time.time() - 0.01
    ids = submit(client, endpoint_id, odd_job, range(30))  # 3 raise
    out = cli("--since", f"{start:.3f}", "--endpoint", "local")
    assert out.returncode == 1, out.stderr
    assert out.stdout.strip().splitlines()[-1].startswith("30 tasks, 3 did not succeed: 27 SUCCEEDED, 3 FAILED (")
    code, snap, _ = once_json("--since", f"{start:.3f}", "--endpoint", endpoint_id)
    assert code == 1 and (snap["total"], snap["succeeded"], snap["failed"]) == (30, 27, 3)
    assert sorted(f["reason"] for f in snap["failures"]) == ["ValueError: bad input 13", "ValueError: bad input 23",
                                                             "ValueError: bad input 3"]
    assert {t["task_id"] for t in client.tasks(since=start)} == set(ids)


def test_cancelled_tasks_exit_1(client, endpoint_id):
    ids = submit(client, endpoint_id, nap, [0.5] * 10)
    cancelled = sum(client.cancel(tid) for tid in ids[5:])
    out = cli(*ids)
    assert out.returncode == 1, out.stderr
    assert out.stdout.strip().splitlines()[-1].startswith(f"10 tasks, {cancelled} did not succeed: "
                                                          f"{10 - cancelled} SUCCEEDED, {cancelled} CANCELLED (")
    assert cancelled >= 1 and "CANCELLED " in out.stdout and ": cancelled" in out.stdout


def test_the_long_poll_does_not_hammer_the_api(client, endpoint_id):
    """In process with the real Client, counting its status calls: calls at least
    --interval apart while tasks finish, long-polls while none do."""
    import io

    from skyfn import Client
    from skyfn.watch import watch

    class Counting(Client):
        calls = 0

        def status(self, *args, **kwargs):
            Counting.calls += 1
            return super().status(*args, **kwargs)

    ids = submit(client, endpoint_id, nap, [0.02] * 100 + [4.0, 4.0])  # a busy second, then 4 s of quiet
    with Counting() as counting:
        buf = io.StringIO()
        t0 = time.monotonic()
        code = watch(counting, ids, interval=1.0, push=False, out=buf, tty=False)
        took = time.monotonic() - t0
    assert code == 0, buf.getvalue()
    assert "102 tasks, all succeeded" in buf.getvalue()
    # the first read, then at most one call a second (the full reads every 5 s included)
    assert Counting.calls <= 2 + took / 1.0, (Counting.calls, took)


def test_a_lost_push_connection_falls_back_to_the_long_poll(client, endpoint_id):
    """The feed itself, in process: its WebSocket connection dropped mid-batch (as a network
    fault does), it long-polls from where the pushes got to and misses nothing."""
    from skyfn.watch.feed import Feed, apply
    from skyfn.watch.selection import select as select_tasks
    from skyfn.watch.tally import Tally

    ids = submit(client, endpoint_id, odd_job, range(150))  # 15 raise; about 2.5 s on 2 workers
    sel = select_tasks(client, ids, None, None)
    tally = Tally(sel.endpoints, sel.origin)
    apply(tally, sel.statuses, None)
    feed = Feed(client, tally, sel.cursor, interval=0.5)
    assert feed.mode == "push" and not tally.done
    feed.channel.kill()
    deadline = time.monotonic() + 120
    while not tally.done and time.monotonic() < deadline:
        feed.wait(1.0)
    feed.close()
    snap = tally.snapshot(time.time())
    assert feed.mode == "poll"
    assert (snap["succeeded"], snap["failed"], snap["done"]) == (135, 15, True)


def sized(i):
    import time

    time.sleep(0.02)
    return "x" * 20_000 if i % 8 == 0 else i  # 20 kB: too large to travel inside a push


@pytest.mark.parametrize("push", [True, False])
def test_watching_consumes_no_result(client, endpoint_id, hot_store, push):
    """The watch peeks, without results, and its push subscription is a peek one: the results
    stay unread (purged 7 days after they finished, not 600 s after the watch saw them) and
    its answers carry none, while a real read afterwards gets every one."""
    import io

    from skyfn import Client
    from skyfn.watch import watch

    answers = []

    class Recording(Client):
        def status(self, *args, **kwargs):
            answer = super().status(*args, **kwargs)
            answers.append(answer)
            return answer

    ids = submit(client, endpoint_id, sized, range(40))
    with Recording() as recording:
        buf = io.StringIO()
        code = watch(recording, ids, interval=0.5, push=push, out=buf, tty=False)
    assert code == 0, buf.getvalue()
    assert buf.getvalue().splitlines()[0].endswith("(results pushed)" if push else "(polling, 0.5 s apart at least)")
    assert "40 tasks, all succeeded" in buf.getvalue()
    statuses = [st for a in answers for st in (a.get("tasks") or {}).values()]
    assert statuses and not [st for st in statuses if {"result", "result_url", "stdout", "stderr"} & set(st)]
    assert hot_store.consumed(ids) == []

    code, snap, out = once_json(*ids)  # the CLI's first read peeks too
    assert code == 0 and snap["succeeded"] == 40, out.stderr
    assert hot_store.consumed(ids) == []
    got = client.get_batch_result(ids)
    assert [got[t]["result"] for t in ids] == ["x" * 20_000 if i % 8 == 0 else i for i in range(40)]
    assert hot_store.consumed(ids) == ids


def test_a_terminal_gets_the_live_board(client, endpoint_id):
    ids = submit(client, endpoint_id, odd_job, range(40))
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI on a terminal
        os.environ["COLUMNS"], os.environ["LINES"] = "120", "40"
        os.execv(sys.executable, [*SKYFN, *ids])
    chunks = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 1.0)[0]:
            try:
                data = os.read(fd, 65536)
            except OSError:  # the child is gone
                break
            if not data:
                break
            chunks.append(data)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    screen = b"".join(chunks).decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 1, screen
    assert "skyfn task watch: 40 tasks" in screen and "last failures" in screen and "local" in screen
    assert "ValueError: bad input" in screen and "40/40 (100%)" in screen
    assert "40 tasks, 4 did not succeed: 36 SUCCEEDED, 4 FAILED" in screen


def test_ctrl_c_stops_cleanly(client, endpoint_id, tmp_path):
    # The tasks run until the test opens the gate, after the Ctrl-C: on a loaded machine the
    # CLI can take longer to start than a batch of timed naps takes to finish, and a watch of
    # a finished batch rightly ends 0 before the SIGINT reaches it.
    gate = tmp_path / "gate"
    ids = submit(client, endpoint_id, held, [str(gate)] * 6)
    # Ctrl-C as in a terminal: a suite started as a background job of a non-interactive shell
    # (`make test &`) inherits SIGINT ignored, and so would the CLI, which Ctrl-C never reaches
    proc = subprocess.Popen([*SKYFN, *ids], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.readline().startswith("watching 6 tasks on 1 endpoint (")
        first = proc.stdout.readline()  # the first progress line: the watch is under way
        assert " finished (" in first, proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=60)
    finally:
        gate.touch()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert rest.strip().splitlines()[-1].startswith("interrupted: 6 tasks, ")
    assert "Traceback" not in err
    for tid in ids:
        client.cancel(tid)


def test_bad_input_gets_one_clear_line(client, endpoint_id, tmp_path):
    known = submit(client, endpoint_id, nap, [0.0])[0]
    stranger = str(uuid.uuid4())
    cases = [
        ((stranger,), f"error: unknown task id: {stranger} (no task of yours has this id: check the ids, "
                      "or select with --since 10m)"),
        ((known, stranger, "nonsense"), f"error: unknown task ids: {stranger}, nonsense (no task of yours "
                                        "has these ids"),
        (("--since", "yesterday"), "error: --since 'yesterday': use an age like 90s, 10m, 2h, 1d, epoch seconds "
                                   "or an ISO 8601 time"),
        ((), "error: nothing to watch: give task ids, --file FILE"),
        ((known, "--json"), "error: --json prints one snapshot: add --once"),
        (("--file", str(tmp_path / "nope.txt")), f"error: --file {tmp_path / 'nope.txt'}: no such file"),
        ((known, "--endpoint", "elsewhere"), "error: --endpoint elsewhere: no endpoint named 'elsewhere'"),
        (("--since", "1s", "--endpoint", "local"), "error: no tasks of yours created since --since 1s on "
                                                   "endpoint local: widen --since"),
    ]
    for args, message in cases:
        if args[:2] == ("--since", "1s"):
            time.sleep(1.5)  # nothing created in the last second
        out = cli(*args)
        assert out.returncode == 1, (args, out.stdout, out.stderr)
        assert out.stderr.startswith(message), (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and out.stdout == "", (args, out.stderr)
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text(known + "\n")
    out = cli(str(ids_file))
    assert out.returncode == 1 and f"it is a file; pass it as --file {ids_file}" in out.stderr
