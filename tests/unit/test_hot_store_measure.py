"""benchmarks/hot_store.py: the arithmetic of the Redis measurements (CPU per task from INFO
deltas, the queue/store split of INFO commandstats) and the key memory sum on a real
redis-server."""
from __future__ import annotations

import pytest

from benchmarks import hot_store


def test_main_thread_cpu_prefers_the_main_thread():
    assert hot_store.main_thread_cpu({"used_cpu_sys": 5, "used_cpu_user": 5}) == 10
    assert hot_store.main_thread_cpu({"used_cpu_sys": 5, "used_cpu_user": 5, "used_cpu_sys_main_thread": 1,
                                      "used_cpu_user_main_thread": 2}) == 3


def test_commandstats_delta_and_split():
    before = {"cmdstat_evalsha": {"calls": 10, "usec": 100}, "cmdstat_xadd": {"calls": 1, "usec": 5}}
    after = {"cmdstat_evalsha": {"calls": 40, "usec": 400}, "cmdstat_xadd": {"calls": 3, "usec": 15},
             "cmdstat_xreadgroup": {"calls": 2, "usec": 90}, "cmdstat_hset": {"calls": 1, "usec": 0},
             "errorstat_ERR": {"count": 1}}
    delta = hot_store.commandstats_delta(before, after)
    assert delta == {"evalsha": {"calls": 30, "usec": 300}, "xadd": {"calls": 2, "usec": 10},
                     "xreadgroup": {"calls": 2, "usec": 90}, "hset": {"calls": 1, "usec": 0}}
    split = hot_store.split_commands(delta)
    assert (split["queue_calls"], split["queue_usec"], split["store_calls"], split["store_usec"]) == (4, 100, 31, 300)
    assert split["store_share"] == pytest.approx(0.75)
    assert hot_store.split_commands({})["store_share"] == 0.0


def test_per_task_subtracts_the_idle_rate():
    out = hot_store.per_task(cpu_s=1.1, idle_cpu_per_s=0.01, seconds=10, tasks=10_000, store_share=0.5)
    assert out["redis_cpu_us_per_task"] == pytest.approx(100.0)       # (1.1 - 0.1) s / 10,000
    assert out["store_cpu_us_per_task"] == pytest.approx(50.0)
    assert out["saturation_tasks_per_s"] == 10_000 and out["saturation_tasks_per_s_store"] == 20_000


def test_memory_by_class_on_a_real_redis(redis_url):
    import redis

    r = redis.Redis.from_url(redis_url)
    r.hset("ep:x", mapping={"o": "owner", "name": "n"})
    r.xadd("tasks:x", {"b": "1"})
    m = hot_store.memory_by_class(r)
    assert m["keys"] == 2 and m["store"] == r.memory_usage("ep:x", samples=0)
    assert m["queue"] == r.memory_usage("tasks:x", samples=0)
    assert hot_store.key_class("control:x", "stream") == "queue" and hot_store.key_class("ep:x", "hash") == "store"
    r.close()
