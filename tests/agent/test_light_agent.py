"""The light agent (engine: inline) against a real redis-server, started through the CLI
(`skyfn-endpoint start NAME --foreground`) as any agent is: the same TaskPacks in and
ResultPacks out (validated with the protocol model) as the interchange's, with no manager or
worker process; errors, captured output, refusals, cancels and a graceful stop."""
from __future__ import annotations

import time

import pytest

from endpoint_agent.config import parse_config
from endpoint_agent.errors import ConfigError
from skyfn.protocol.remote_exception import unwrap_exception
from skyfn.protocol.serialize import deserialize
from tests.agent import fns

INLINE = {"engine": {"type": "inline", "threads": 4}}


def _one(results: dict[str, list[dict]]) -> dict[str, dict]:
    dup = {t: len(r) for t, r in results.items() if len(r) != 1}
    assert not dup, f"tasks with more than one result: {dup}"
    return {t: r[0] for t, r in results.items()}


def _running(agent):
    return agent.wait_status(lambda s: s.get("state") == "running" and s.get("pid") == agent.proc.pid)


def test_results_errors_and_output_as_the_interchange_sends_them(queues, agent_factory):
    agent = agent_factory(**INLINE).start()
    st = _running(agent)
    assert st["engine"] == "inline" and "worker_pids" not in st
    ids = queues.push(fns.square, [(i,) for i in range(300)], pack_size=100)
    exc = queues.push(fns.fail, [(7,)], prefix="exc", function_id="f-fail")
    chatty = queues.push(fns.chatty, [(1,)], prefix="chatty", function_id="f-chatty")
    bad = queues.push(None, [(1,)], prefix="bad", function_body="dill 3.11\nbm90IGEgcGlja2xl", function_id="f-bad")
    missing = queues.push(None, [(1,)], prefix="missing", functions={}, function_id="f-missing")
    box = queues.push(fns.square, [(2,)], prefix="box", function_id="f-box", container="sci")
    results = _one(queues.collect(ids + exc + chatty + bad + missing + box, timeout=45))
    for i, tid in enumerate(ids):
        r = results[tid]
        assert r["state"] == "SUCCEEDED" and deserialize(r["result"]) == i * i, r
        assert [e[0] for e in r["events"]] == ["DISPATCHED", "RUNNING", "DONE"]
    err = unwrap_exception(results[exc[0]]["error"])
    assert isinstance(err, ValueError) and "bad value 7" in str(err) and "run_task" not in err.remote_traceback
    r = results[chatty[0]]
    assert r["state"] == "SUCCEEDED" and r["stdout"] and r["stderr"]  # captured per task, not printed
    assert results[bad[0]]["state"] == "FAILED" and results[bad[0]].get("error")
    assert "was not in the task pack" in results[missing[0]]["reason"]
    assert "inline" in results[box[0]]["reason"]
    # every task message acknowledged after its results, none left leased
    deadline = time.monotonic() + 10
    while (queues.tasks.depth() or queues.leases()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert queues.tasks.depth() == 0 and queues.leases() == 0
    assert agent.terminate() == 0
    assert agent.status()["state"] == "stopped"


def test_cancel_and_graceful_stop(queues, agent_factory):
    agent = agent_factory(**INLINE, grace_period=20).start()
    _running(agent)
    slow = queues.push(fns.slow, [(i, 1.5) for i in range(2)], prefix="slow", function_id="f-slow")
    queued = queues.push(fns.slow, [(i, 4) for i in range(2)], prefix="cut", function_id="f-slow")
    queues.cancel(queued)
    # a stop while tasks run: they finish, their results leave, their messages are acknowledged
    agent.wait_status(lambda s: s.get("received_tasks", 0) >= 4)
    assert agent.terminate() == 0
    results = queues.collect(slow, timeout=20)
    assert all(r[0]["state"] == "SUCCEEDED" for r in results.values())
    queues.drain(wait=0.2)
    assert queues.tasks.depth() == 0
    assert not set(queued) & queues.by_task.keys()  # cancelled: dropped before or while running


def test_config_refuses_what_inline_cannot_do():
    assert parse_config({"engine": "inline"}).engine.inline
    assert not parse_config({}).engine.inline
    with pytest.raises(ConfigError) as info:
        parse_config({"engine": {"type": "inline"}, "containers": {"runtime": "none"}, "direct": True})
    assert "engine type inline" in str(info.value) and "containers" in str(info.value) and "direct" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config({"engine": {"type": "threads"}})
    assert "engine.type" in str(info.value) and "inline" in str(info.value)
