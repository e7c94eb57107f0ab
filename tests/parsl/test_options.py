"""A Parsl resource specification -> skyfn's per-task options (skyfn/parsl/options.py), and
SkyfnExecutor's checks of its own arguments; nothing here talks to a service."""
from __future__ import annotations

import pytest
from parsl.executors.errors import InvalidResourceSpecification

from skyfn.parsl import SkyfnExecutor
from skyfn.parsl.options import TaskOptions, split


def test_accepted_keys_map_onto_skyfn_task_options():
    opts = split({"cores": 2, "gpus": 1, "walltime": 30, "user_config": {"account": "p1"}})
    assert opts == TaskOptions(resources={"cores": 2, "gpus": 1}, walltime=30.0, user_config={"account": "p1"})
    assert opts.executor_kwargs() == {"resource_specification": {"cores": 2, "gpus": 1}, "walltime": 30.0,
                                      "user_config": {"account": "p1"}}


def test_user_config_defaults_to_the_executors_and_a_task_may_replace_it():
    assert split({}, {"account": "p1"}).user_config == {"account": "p1"}
    assert split({"cores": 1}, {"account": "p1"}).user_config == {"account": "p1"}
    assert split({"user_config": {"account": "p2"}}, {"account": "p1"}).user_config == {"account": "p2"}


def test_an_unknown_key_is_named_with_the_accepted_ones():
    with pytest.raises(InvalidResourceSpecification) as err:
        split({"cores": 1, "memory": 1000, "disk": 1})
    assert err.value.invalid_keys == {"memory", "disk"}
    text = str(err.value)
    assert "'disk', 'memory'" in text
    assert "'cores', 'gpus', 'walltime', 'user_config'" in text


@pytest.mark.parametrize("spec", [{"cores": -1}, {"gpus": 1.5}, {"cores": True}, {"walltime": 0},
                                  {"walltime": "1h"}, {"user_config": "account=p1"}])
def test_bad_values_are_refused(spec):
    with pytest.raises(InvalidResourceSpecification) as err:
        split(spec)
    assert err.value.invalid_keys == set(spec)


def test_equal_options_share_a_key():
    assert split({"cores": 1, "walltime": 5}).key() == split({"walltime": 5.0, "cores": 1}).key()
    assert split({"cores": 1}).key() != split({"cores": 2}).key()


def test_skyfn_executor_checks_its_arguments_before_starting():
    with pytest.raises(InvalidResourceSpecification):
        SkyfnExecutor(resource_specification={"priority": 1})
    with pytest.raises(ValueError, match="executor_options may not set"):
        SkyfnExecutor(executor_options={"walltime": 5})
    with pytest.raises(TypeError, match="skyfn.executor.Executor"):
        SkyfnExecutor(executor=object())  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="not started"):
        SkyfnExecutor().submit(print, {})
