"""The history archive's capacity (issue 24): one drainer (lambdas/history.py) archiving
finished no-op tasks from a real redis-server into moto's DynamoDB as pages, against the
path it replaced in the same run: one DynamoDB item per task (BatchWriteItem of 25, with
the owner-index GSI the old tasks table had).

    .venv/bin/python benchmarks/archive.py --json [--tasks 40000]

Prints tasks/s of each path and their ratio, seconds per 2,000-task drain batch (the
figure infra/aws/sizing.py sizes the AWS app with), CPU per task of the drainer and of
moto, compressed page bytes per task, and the hot store's bytes per finished record before
and after archival."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.local.processes import start_moto, start_redis  # noqa: E402

OWNER = "u-0f3b8d5e-1c2a-4b7e-9d21-5a6c7e8f9a0b"

# The task table before issue 24: one item per task, keyed by its id, with an owner-index
# (also what scripts/snapshot_timing.py fills to time snapshots of a large table).
PER_TASK_TABLE = dict(
    BillingMode="PAY_PER_REQUEST",
    AttributeDefinitions=[{"AttributeName": "task_id", "AttributeType": "S"},
                          {"AttributeName": "owner", "AttributeType": "S"},
                          {"AttributeName": "created", "AttributeType": "N"}],
    KeySchema=[{"AttributeName": "task_id", "KeyType": "HASH"}],
    GlobalSecondaryIndexes=[{"IndexName": "owner-index", "Projection": {"ProjectionType": "ALL"},
                             "KeySchema": [{"AttributeName": "owner", "KeyType": "HASH"},
                                           {"AttributeName": "created", "KeyType": "RANGE"}]}])


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def _finished_tasks(store, n: int) -> list[str]:
    """n no-op tasks through the store's own scripts: created, finished, read by a push."""
    from lambdas.adapters.redis_store.lua_rows import CreateRow, FinishRow
    from skyfn.protocol.ids import uuid7s

    ids_all: list[str] = []
    for _ in range(0, n, 2000):
        ids = uuid7s(2000)
        now = time.time()
        store.create(OWNER, uuid7s(1)[0], [CreateRow(task_id=t, function_id="f" * 36, endpoint_id="e" * 36,
                                                     max_retries=0) for t in ids], now, now)
        ran = f"DISPATCHED@{now + 0.001:.6f};RUNNING@{now + 0.002:.6f};"
        store.finish([FinishRow(task_id=t, state="SUCCEEDED", result="json 3.11\n1", events=ran) for t in ids])
        store.mark_retrieved(ids)
        ids_all += ids
    return ids_all


def _per_item_peer(url: str, items: list[dict]) -> dict[str, float]:
    """The old path: one item per task in a table keyed by task id with the owner-index GSI."""
    import boto3

    from lambdas.adapters.dynamodb import _dynamo

    ddb = boto3.resource("dynamodb", endpoint_url=url)
    ddb.meta.client.create_table(TableName="peer-tasks", **PER_TASK_TABLE)
    table = ddb.Table("peer-tasks")
    started = time.perf_counter()
    with table.batch_writer(overwrite_by_pkeys=["task_id"]) as batch:
        for item in items:
            batch.put_item(Item=_dynamo(item))
    return {"seconds": time.perf_counter() - started}


def run(tasks: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="skyfn-archive-"))
    redis_srv = start_redis(work / "redis", appendonly=False)
    moto = start_moto(work / "moto")
    try:
        os.environ.update(SKYFN_REDIS_URL=redis_srv.url, SKYFN_TABLE_PREFIX="bench", SKYFN_QUEUE_KIND="redis",
                          AWS_ENDPOINT_URL=moto.url, SKYFN_AUTH_SECRET="bench", AWS_ACCESS_KEY_ID="bench",
                          AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1", SKYFN_HISTORY_BATCH="2000")
        from lambdas import history
        from lambdas.bootstrap import ensure_resources
        from lambdas.core import deps

        deps.reset()
        ensure_resources()
        store = deps.store()
        base = store.r.info("memory")["used_memory"]
        ids = _finished_tasks(store, tasks)
        before = (store.r.info("memory")["used_memory"] - base) / tasks
        records = store.records(ids)  # what the peer writes: the same items
        items = [history._task_item(r) for r in records]

        me, moto_p = psutil.Process(), psutil.Process(moto.proc.pid)
        cpu_me, cpu_moto = _cpu(me), _cpu(moto_p)
        started = time.perf_counter()
        drained = history.drain(3600)
        seconds = time.perf_counter() - started
        cpu_me, cpu_moto = _cpu(me) - cpu_me, _cpu(moto_p) - cpu_moto
        after = (store.r.info("memory")["used_memory"] - base) / tasks
        pages = [i for i in deps.dynamo().history_table.scan()["Items"] if i["k"].startswith("p#")]
        page_bytes = sum(len(i["body"].value) for i in pages) / max(1, sum(int(i["n"]) for i in pages))

        peer_cpu = _cpu(moto_p)
        peer = _per_item_peer(moto.url, items)
        peer_cpu = _cpu(moto_p) - peer_cpu
        pages_rate = drained["tasks"] / seconds
        peer_rate = len(items) / peer["seconds"]
        return {
            "tasks": tasks, "archived": drained["tasks"], "batches": drained["batches"], "pages": drained["pages"],
            "pages_tasks_per_s": round(pages_rate), "seconds_per_batch": round(seconds / drained["batches"], 4),
            "drainer_cpu_us_per_task": round(cpu_me / tasks * 1e6, 1),
            "moto_cpu_us_per_task": round(cpu_moto / tasks * 1e6, 1),
            "page_bytes_per_task": round(page_bytes, 1),
            "redis_bytes_per_task_before_archive": round(before), "redis_bytes_per_task_after_archive": round(after),
            "peer_per_item": {"tasks_per_s": round(peer_rate), "moto_cpu_us_per_task": round(peer_cpu / len(items) * 1e6, 1)},
            "pages_over_per_item": round(pages_rate / peer_rate, 2),
        }
    finally:
        moto.proc.kill()
        redis_srv.proc.kill()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=40_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = run(args.tasks - args.tasks % 2000 or 2000)
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
