"""SkyfnExecutor (skyfn/parsl) on the embedded runtime: Parsl's DataFlowKernel, apps, retries,
resource specifications and checkpointing, every task a skyfn task on the endpoint `local`."""
from __future__ import annotations

import contextlib
import time
from pathlib import Path

import parsl
import pytest
from parsl.app.app import python_app
from parsl.config import Config
from parsl.dataflow.memoization import BasicMemoizer
from parsl.executors.errors import InvalidResourceSpecification
from parsl.utils import get_all_checkpoints

from skyfn import Executor, SkyfnFuture, TaskTimedOut
from skyfn.parsl import SkyfnExecutor


@python_app
def inc(x):
    return x + 1


@python_app
def attempts(path, fail_times):
    """One line in `path` per run; the first `fail_times` runs fail."""
    with open(path, "a") as f:
        f.write("run\n")
    with open(path) as f:
        n = len(f.read().splitlines())
    if n <= fail_times:
        raise ValueError(f"run {n} fails")
    return n


@python_app
def sized(x, parsl_resource_specification={}):
    import os

    return x, os.getpid()


@python_app
def sleeper(seconds, parsl_resource_specification={}):
    import time

    time.sleep(seconds)
    return seconds


@python_app(cache=True)
def square_once(x, path):
    with open(path, "a") as f:
        f.write("run\n")
    return x * x


@contextlib.contextmanager
def loaded(run_dir: Path, **config):
    """A DataFlowKernel over one SkyfnExecutor on the endpoint `local`."""
    dfk = parsl.load(Config(executors=[SkyfnExecutor(endpoint="local")], run_dir=str(run_dir), **config))
    try:
        yield dfk
    finally:
        dfk.cleanup()


@pytest.fixture
def dfk(parsl_home, tmp_path):
    with loaded(tmp_path / "runinfo", retries=2) as d:
        yield d


def test_a_chain_of_three_apps_runs_as_skyfn_tasks(dfk):
    a = inc(1)
    b = inc(a)
    c = inc(b)
    assert c.result(timeout=60) == 4
    assert [f.result() for f in (a, b)] == [2, 3]
    for f in (a, b, c):
        exec_fu = f.task_record["exec_fu"]
        assert isinstance(exec_fu, SkyfnFuture) and exec_fu.task_id  # ran as a skyfn task
        assert f.task_record["executor"] == "skyfn"
    assert len({f.task_record["exec_fu"].task_id for f in (a, b, c)}) == 3


def test_a_failing_app_is_retried_by_parsl(dfk, tmp_path):
    always = attempts(str(tmp_path / "always"), fail_times=100)
    third_time = attempts(str(tmp_path / "third"), fail_times=2)
    with pytest.raises(ValueError, match="run 3 fails"):
        always.result(timeout=60)
    assert always.task_record["fail_count"] == 3  # the first try and retries=2
    assert (tmp_path / "always").read_text().count("run") == 3  # each try ran once: no retry of skyfn's own
    assert third_time.result(timeout=60) == 3
    assert third_time.task_record["fail_count"] == 2


def test_resource_specification_passes_through(dfk):
    sx = dfk.executors["skyfn"]
    spec = {"cores": 1, "walltime": 60, "user_config": {"account": "p1"}}
    assert sized(7, parsl_resource_specification=spec).result(timeout=60)[0] == 7
    ex = sx.executor_for(spec)
    assert ex is not sx.executor and ex.user_config == {"account": "p1"}
    assert sx.executor_for(dict(spec)) is ex  # one skyfn Executor per distinct set of options
    assert sx.executor_for({}) is sx.executor and sx.executor.user_config is None

    timed = sleeper(30, parsl_resource_specification={"walltime": 1})
    with pytest.raises(TaskTimedOut):
        timed.result(timeout=120)

    bad = sized(1, parsl_resource_specification={"cores": 1, "memory": 100})
    with pytest.raises(InvalidResourceSpecification, match="'memory'.*accepted keys are 'cores', 'gpus'"):
        bad.result(timeout=60)


def test_checkpointed_results_are_not_run_again(parsl_home, tmp_path):
    runs = tmp_path / "runs"
    first = tmp_path / "first"
    with loaded(first, memoizer=BasicMemoizer(checkpoint_mode="task_exit")):
        assert square_once(9, str(runs)).result(timeout=60) == 81
    checkpoints = get_all_checkpoints(str(first))
    assert checkpoints
    with loaded(tmp_path / "second", memoizer=BasicMemoizer(checkpoint_files=checkpoints)):
        again = square_once(9, str(runs))
        assert again.result(timeout=60) == 81
        assert again.task_record["from_memo"]
    assert runs.read_text().count("run") == 1


def test_a_given_skyfn_executor_is_used_as_is(parsl_home, tmp_path):
    ex = Executor(endpoint="local", user_config={"account": "p1"})
    with pytest.raises(ValueError, match="give endpoint to the skyfn Executor"):
        SkyfnExecutor(executor=ex, endpoint="local")
    dfk = parsl.load(Config(executors=[SkyfnExecutor(executor=ex, label="given")], run_dir=str(tmp_path / "run")))
    try:
        t0 = time.monotonic()
        assert inc(inc(40)).result(timeout=60) == 42
        sx = dfk.executors["given"]
        assert sx.executor is ex and sx.executor_for({"user_config": {"account": "p1"}}) is ex
        sibling = sx.executor_for({"cores": 1})
        assert sibling.endpoint_id == ex.endpoint_id and sibling.client is ex.client
        assert sibling.user_config == {"account": "p1"}
        assert time.monotonic() - t0 < 60
    finally:
        dfk.cleanup()
