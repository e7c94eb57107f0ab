"""The batch fan-out path measured once at scale: N no-op tasks (default 100,000) as one
POST /batches on the embedded runtime (Step Functions under moto through the Lambda
bridge: Distributed Map over the S3 manifest, the RouteChunk step per chunk of 1,000,
then the polling loop), against the same N tasks submitted directly (POST /tasks in
requests of 5,000), in the same run on the same runtime.

    python -m benchmarks.fanout [--tasks 100000] [--json]

Starts everything in a private SKYFN_HOME (endpoint 'local', 2 workers) and stops it.
Reported for each path: submit time (the API calls), time until every task is routed
(batch only), time until every task has a result, and tasks/s end to end.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml


def noop(x):
    return x


def _direct(client, fid: str, endpoint: str, n: int) -> dict:
    from skyfn.protocol.api import MAX_STATUS_IDS
    from skyfn.protocol.serialize import pack_args

    t0 = time.perf_counter()
    ids = client.submit_tasks([{"function_id": fid, "payload": pack_args((i,), {})} for i in range(n)], endpoint,
                              max_retries=0)
    submitted = time.perf_counter() - t0
    outstanding = set(ids)
    while outstanding:
        chunk = list(outstanding)[:MAX_STATUS_IDS]
        answer = client.status(chunk, wait=2.0)
        done = {tid for tid, st in answer["tasks"].items()
                if st["state"] in ("SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED")}
        outstanding -= done
    total = time.perf_counter() - t0
    return {"submit_s": round(submitted, 2), "complete_s": round(total, 2), "tasks_per_s": round(n / total, 1)}


def _batch(client, fid: str, n: int) -> dict:
    from skyfn.runs import submit_batch

    t0 = time.perf_counter()
    batch = submit_batch(client, fid, [(i,) for i in range(n)], "local", max_retries=0, poll_seconds=2)
    submitted = time.perf_counter() - t0
    routed_at = None
    while True:
        report = batch.progress()
        if routed_at is None and report["state"] != "ROUTING":
            routed_at = time.perf_counter() - t0
        if report["run_state"] != "RUNNING":
            break
        time.sleep(0.5)
    total = time.perf_counter() - t0
    return {"submit_s": round(submitted, 2), "routed_s": round(routed_at, 2), "complete_s": round(total, 2),
            "tasks_per_s": round(n / total, 1), "chunks": batch.chunks, "run_state": report["run_state"],
            "state": report["state"], "counts": report["counts"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fanout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)

    from infra.local import runtime
    from skyfn import Client

    home = Path(tempfile.mkdtemp(prefix="skyfn-fanout-"))
    cfg = home / "endpoints" / "local"
    cfg.mkdir(parents=True)
    (cfg / "config.yaml").write_text(yaml.safe_dump({"workers": 2}))
    os.environ["SKYFN_HOME"] = str(home)
    os.environ.pop("AWS_ENDPOINT_URL", None)
    runtime.up(home, detach=True, echo=lambda *_: None)
    try:
        with Client() as client:
            endpoint = client.endpoint_id("local")
            fid = client.register_function(noop)
            client.get_result(client.run(fid, 0, endpoint_id=endpoint), timeout=60)  # warm
            batch = _batch(client, fid, args.tasks)
            print(f"batch fan-out: {batch}", file=sys.stderr)
            direct = _direct(client, fid, endpoint, args.tasks)
            print(f"direct POST /tasks: {direct}", file=sys.stderr)
    finally:
        runtime.down(home, echo=lambda *_: None)
    out = {"tasks": args.tasks, "batch": batch, "direct": direct,
           "batch_vs_direct_time": round(batch["complete_s"] / direct["complete_s"], 2)}
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0 if batch["state"] == "COMPLETE" else 1


if __name__ == "__main__":
    sys.exit(main())
