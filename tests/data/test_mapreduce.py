"""The MapReduce word count of benchmarks/mapreduce.py at a tenth of its size (16 map
tasks, 4 reduce tasks, ~100 MiB of generated text) through the real embedded runtime, with
the shuffle by reference through the endpoint's Redis, a file store on a shared directory
and the direct path: the counts equal the generator's own."""
from __future__ import annotations

import os

import pytest

from benchmarks import mapreduce


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    base = tmp_path_factory.mktemp("mapreduce")
    saved = {k: os.environ.get(k) for k in ("SKYFN_HOME", "SKYFN_RENDEZVOUS_SECRET")}
    inputs = mapreduce.generate(base / "shared" / "input", 100 << 20, 16)
    rdv = mapreduce.start(base / "home", base / "shared", workers=2)
    try:
        yield inputs
    finally:
        mapreduce.stop(base / "home", rdv)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.parametrize("store", ["redis", "shared", "direct"])
def test_word_counts_through_each_shuffle_equal_a_direct_count(job, store):
    from skyfn import Executor

    assert job["bytes"] > 95 << 20 and job["words"] > 10_000_000
    with Executor(endpoint="local") as ex:
        out = mapreduce.run_job(ex, job["paths"], store, 4)
    assert out["counts"] == job["expected"]
    assert sum(out["counts"].values()) == job["words"]


def test_the_shuffle_leaves_nothing_behind(job):
    """Every partition ref is evicted once its reducer read it: the stores are empty."""
    import json

    import redis

    home = os.environ["SKYFN_HOME"]
    doc = json.loads(open(os.path.join(home, "endpoints", "local", "data", "stores.json")).read())
    specs = {name.split("@")[0]: spec["connector"] for name, spec in doc["stores"].items()}
    r = specs["redis"]
    with open(r["password_file"]) as f:
        client = redis.Redis(host=r["host"], port=r["port"], password=f.read().strip())
    assert sum(1 for _ in client.scan_iter(match=r["prefix"] + "*")) == 0
    assert os.listdir(specs["shared"]["directory"]) == []
    assert os.listdir(specs["direct"]["directory"]) == []
