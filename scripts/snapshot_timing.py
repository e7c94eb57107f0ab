"""Times infra/local/snapshot.save (what `skyfn local down` runs before it stops moto)
against a real moto server holding a task-history-like table of N items.

    .venv/bin/python scripts/snapshot_timing.py 50000 200000

For each N: starts moto (infra.local.processes.start_moto, as `skyfn local up` does),
creates a `<p>-tasks`-shaped table (pk task_id, GSI owner-index (owner, created)),
writes N items of about 300 bytes with BatchWriteItem from a few threads, then times
save() and checks the item count it wrote. --method scan times the Scan path (the one
save() used before the export); --probe also times one 1,000-item Scan page read from
the start of the table and one read from near its end (moto's Scan walks the table up
to ExclusiveStartKey on every page: that difference is what made the Scan quadratic).
Stops only the moto it started.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.archive import PER_TASK_TABLE  # noqa: E402
from infra.local import snapshot  # noqa: E402
from infra.local.processes import start_moto  # noqa: E402


def _item(i: int) -> dict:
    return {"task_id": {"S": str(uuid.UUID(int=i * 7919 + 1))}, "owner": {"S": f"user-{i % 7}"},
            "created": {"N": str(1_700_000_000 + i / 1000)}, "status": {"S": "success"},
            "function_id": {"S": str(uuid.UUID(int=i % 13))}, "endpoint_id": {"S": str(uuid.UUID(int=i % 5))},
            "completion_time": {"N": str(1_700_000_001 + i / 1000)}, "result_ref": {"S": "r" * 80}}


def fill(ddb, table: str, n: int, threads: int = 4) -> None:
    def write(start: int) -> None:
        for lo in range(start, min(start + 10_000, n), 25):
            reqs = [{"PutRequest": {"Item": _item(i)}} for i in range(lo, min(lo + 25, n, start + 10_000))]
            while reqs:
                left = ddb.batch_write_item(RequestItems={table: reqs}).get("UnprocessedItems", {})
                reqs = left.get(table, [])

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(write, range(0, n, 10_000)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizes", nargs="+", type=int, help="numbers of items to write before saving")
    ap.add_argument("--method", choices=("export", "scan"), default="export", help="save()'s method")
    ap.add_argument("--probe", action="store_true", help="time a Scan page at the start and at the end")
    args = ap.parse_args()
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    for n in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            moto = start_moto(Path(tmp) / "moto")
            try:
                ddb, _ = snapshot._clients(moto.url)
                ddb.create_table(TableName="timing-tasks", **PER_TASK_TABLE)
                t0 = time.monotonic()
                fill(ddb, "timing-tasks", n)
                t1 = time.monotonic()
                counts = snapshot.save(moto.url, Path(tmp) / "snapshot", method=args.method)
                t2 = time.monotonic()
                assert counts["items"] == n, f"save wrote {counts['items']} items, expected {n}"
                print(f"{n:>8} items: fill {t1 - t0:6.1f} s, save ({args.method}) {t2 - t1:7.2f} s "
                      f"({(t2 - t1) / n * 1e6:6.1f} us/item)", flush=True)
                if args.probe:
                    keys = sorted(str(uuid.UUID(int=i * 7919 + 1)) for i in range(n))
                    for where, start in (("start", None), ("end", keys[-1001])):
                        kw = {"ExclusiveStartKey": {"task_id": {"S": start}}} if start else {}
                        t = time.monotonic()
                        got = len(ddb.scan(TableName="timing-tasks", Limit=1000, **kw)["Items"])
                        print(f"{'':>8}   one Scan page of {got} items from the {where}: "
                              f"{time.monotonic() - t:6.2f} s", flush=True)
            finally:
                moto.stop()


if __name__ == "__main__":
    main()
