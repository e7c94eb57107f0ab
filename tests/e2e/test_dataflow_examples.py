"""The dataflow examples (issue 26) on the embedded runtime: the serial crystallography
pipeline written with futures, and a MapReduce whose reducers take the mappers' futures
with the counts kept on the endpoint as Refs."""
from __future__ import annotations

import json
from pathlib import Path

from skyfn import Executor


def test_crystallography_with_futures(client, tmp_path):
    from examples import crystallography_futures as ssx

    params = dict(ssx.INPUT, images=6, workdir=str(tmp_path))
    with Executor(endpoint="local") as ex:
        futures = ssx.submit(ex, params)
        metadata, plot = futures["metadata"].result(timeout=300), futures["plot"].result(timeout=300)
    record = json.loads(Path(metadata["metadata"]).read_text())
    assert record["images"] == 6 and record["indexed"] == 6 and record["indexing_rate"] == 1.0
    assert abs(record["cell"] - params["cell"]) < 0.3
    assert Path(plot["plot"]).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert sorted(p.name for p in tmp_path.glob("still_*.npy")) == [f"still_{i:04d}.npy" for i in range(6)]
    solve = client.get_task(futures["solution"].task_id)
    assert [e[0] for e in solve["events"]][:2] == ["CREATED", "WAITING"]


def test_mapreduce_with_futures_keeps_the_counts_on_the_endpoint(client):
    from examples import mapreduce_futures as mr

    with Executor(endpoint="local") as ex:
        final = mr.submit(ex, shards=6, reducers=3, words=5_000, seed=5)
        counts = final.result(timeout=300)
    assert counts == mr.expected(6, 5_000, 5) and sum(counts.values()) == 30_000
