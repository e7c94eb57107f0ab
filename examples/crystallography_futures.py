"""Serial crystallography with futures as arguments (issue 26): the funcX paper's SSX
pipeline as a task graph the service and the endpoint finish on their own.

    skyfn local up --detach
    python -m examples.crystallography_futures              # waits, prints the summary
    python -m examples.crystallography_futures --detach     # submits, prints the ids, exits

Each still is acquired by a task of its own, each processed (spot finding and indexing)
by a task that takes the acquisition's future, `solve` takes the list of all processed
futures, and metadata and plot both take solve's future. The client submits the whole
graph at once and may close: no result travels through it until the end. The scientific
functions are those of examples/crystallography_flow.py (the same pipeline as a flow).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from examples.crystallography_flow import INPUT, acquire, extract_metadata, plot, process_image, solve


def acquire_still(params, i):
    """Still number i (its own seed), rendered as `acquire` renders them, saved as
    <workdir>/still_<i>.npy."""
    import os

    workdir = os.path.expanduser(params.get("workdir", "~/.skyfn/ssx"))
    scratch = os.path.join(workdir, f".still-{i:04d}")
    seed = int(params.get("seed", 7)) * 100_003 + i
    (record,) = acquire({**params, "images": 1, "seed": seed, "workdir": scratch})
    path = os.path.join(workdir, f"still_{i:04d}.npy")
    os.replace(record["path"], path)
    os.rmdir(scratch)
    return {**record, "index": i, "path": path}


def submit(ex, params: dict) -> dict:
    """The whole graph, submitted at once; the futures of its last tasks."""
    stills = [ex.submit(acquire_still, params, i) for i in range(int(params["images"]))]
    processed = [ex.submit(process_image, s) for s in stills]
    solution = ex.submit(solve, processed)
    return {"solution": solution, "metadata": ex.submit(extract_metadata, solution), "plot": ex.submit(plot, solution)}


def main(argv: list[str] | None = None) -> int:
    from skyfn import Executor
    from skyfn.dataflow import wait_for_id

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", default="local")
    ap.add_argument("--input", default="{}", help="JSON parameters over the defaults, e.g. '{\"images\": 16}'")
    ap.add_argument("--detach", action="store_true", help="print the final tasks' ids and exit at once")
    args = ap.parse_args(argv)
    params = dict(INPUT, **json.loads(args.input))
    with Executor(endpoint=args.endpoint) as ex:
        futures = submit(ex, params)
        if args.detach:  # once sent, the graph is the service's: nothing of it needs this process
            print(json.dumps({k: wait_for_id(f, 60) for k, f in futures.items()}))
            print("read them later: skyfn task result <id>", file=sys.stderr)
            sys.stdout.flush()
            os._exit(0)  # not the Executor's exit, which would wait for the results
        out = {k: f.result(timeout=600) for k, f in futures.items()}
    summary = {k: v for k, v in out["solution"].items() if k != "per_image"}
    print(json.dumps({"solution": summary, "metadata": out["metadata"], "plot": out["plot"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
