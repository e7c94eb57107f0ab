"""One communicator rank for the NAT tests, run inside a peer namespace.

    python -m tests.comm.nat_peer RENDEZVOUS GROUP SIZE RANK|-1 NBYTES [KEEPALIVE_S TIMEOUT_S]

Token from $SKYFN_TEST_TOKEN. Protocol with the test, one JSON line per phase on stdout:

1. join; send every other rank NBYTES of random bytes and receive theirs; an allreduce;
   print {"phase": "joined", "rank", "stats", "sent": {dest: sha256}, "received":
   {source: sha256}, "allreduce": [...]}.
2. wait for a line on stdin (the test may stop the rendezvous server meanwhile);
   exchange again, allreduce, barrier, allgather; print {"phase": "after", ...} and close.

Any exception is printed as {"phase": "error", "error": "..."} and exits non-zero.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import traceback

import numpy as np

from comm import Communicator


def _stats(c) -> dict:
    """stats() as {peer_rank: {...}} whatever container the binding returns."""
    raw = c.stats()
    if isinstance(raw, dict):
        return {str(k): dict(v) for k, v in raw.items()}
    return {str(s["rank"]): dict(s) for s in raw}


def _exchange(c, nbytes: int, tag: int) -> tuple[dict, dict]:
    """Every rank sends every other rank fresh random bytes; returns sha256 sent/received."""
    sent, received, reqs = {}, {}, []
    payloads = {}
    for dest in range(c.size):
        if dest != c.rank:
            payloads[dest] = os.urandom(nbytes)
            sent[str(dest)] = hashlib.sha256(payloads[dest]).hexdigest()
            reqs.append(c.isend(payloads[dest], dest, tag=tag))
    for src in range(c.size):
        if src != c.rank:
            data = c.recv(src, tag=tag)
            received[str(src)] = hashlib.sha256(memoryview(data)).hexdigest()
    for r in reqs:
        r.wait()
    return sent, received


def _collectives(c) -> dict:
    mine = np.arange(4, dtype=np.int64) + 100 * c.rank
    total = c.allreduce(mine, op="sum")
    c.barrier()
    gathered = c.allgather(np.array([c.rank], dtype=np.int32).tobytes())
    return {"allreduce": np.asarray(total).tolist(),
            "allgather": [int(np.frombuffer(memoryview(g), dtype=np.int32)[0]) for g in gathered]}


def main(argv: list[str]) -> int:
    rendezvous, group, size, rank, nbytes = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    keepalive, timeout = (float(argv[5]), float(argv[6])) if len(argv) > 6 else (15.0, 30.0)
    try:
        c = Communicator.join(group, rendezvous=rendezvous, token=os.environ["SKYFN_TEST_TOKEN"], size=size,
                              rank=None if rank < 0 else rank, timeout=timeout, keepalive=keepalive)
        sent, received = _exchange(c, nbytes, tag=1)
        print(json.dumps({"phase": "joined", "rank": c.rank, "size": c.size, "stats": _stats(c),
                          "sent": sent, "received": received, **_collectives(c)}), flush=True)
        sys.stdin.readline()
        sent, received = _exchange(c, nbytes, tag=2)
        print(json.dumps({"phase": "after", "rank": c.rank, "stats": _stats(c),
                          "sent": sent, "received": received, **_collectives(c)}), flush=True)
        c.close()
    except Exception as exc:  # reported to the test, which prints it on failure
        print(json.dumps({"phase": "error", "error": f"{type(exc).__name__}: {exc}",
                          "trace": traceback.format_exc()}), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
