"""MapReduce with futures as arguments and data by reference (issue 26).

    skyfn local up --detach
    python -m examples.mapreduce_futures --shards 16 --reducers 4

Each mapper counts the words of one synthetic text shard and keeps its counts on the
endpoint (skyfn.data: one Ref per reducer's partition of the words, in the endpoint's
Redis); each reducer takes every mapper's future, resolves its own partition of each where
the data is, and merges them; a final task takes the reducers' futures. The client submits
all of it at once and only reads the end: the counts never travel through the service or
the client (a mapper's result is a list of small Refs).
"""
from __future__ import annotations

import argparse
import json
import sys

def mapper(shard: int, words: int, reducers: int, seed: int):
    """Count the words of one shard; the counts of each reducer's partition kept by reference."""
    import random
    import zlib
    from collections import Counter

    from skyfn.data import default_store

    vocabulary = ("photon", "lattice", "crystal", "beam", "detector", "spot", "cell", "index", "merge", "flux",
                  "sample", "angle", "phase", "shell", "frame", "pixel")
    rng = random.Random(seed * 7919 + shard)
    counts = Counter(rng.choice(vocabulary) for _ in range(words))
    parts = [{w: n for w, n in counts.items() if zlib.crc32(w.encode()) % reducers == r} for r in range(reducers)]
    store = default_store()
    return [store.ref(p, ttl=3600) for p in parts]


def reducer(r: int, *mapped):
    """Merge partition `r` of every mapper's counts (each resolved on this endpoint)."""
    from collections import Counter

    total = Counter()
    for refs in mapped:
        total.update(dict(refs[r]))
    return dict(total)


def combine(*partitions):
    out = {}
    for p in partitions:
        out.update(p)
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def submit(ex, shards: int, reducers: int, words: int, seed: int):
    mapped = [ex.submit(mapper, s, words, reducers, seed) for s in range(shards)]
    reduced = [ex.submit(reducer, r, *mapped) for r in range(reducers)]
    return ex.submit(combine, *reduced)


VOCABULARY = ("photon", "lattice", "crystal", "beam", "detector", "spot", "cell", "index", "merge", "flux",
              "sample", "angle", "phase", "shell", "frame", "pixel")  # the mapper's own copy: it runs remotely


def expected(shards: int, words: int, seed: int) -> dict:
    """The same counts computed here, to check the graph's answer."""
    import random
    from collections import Counter

    total = Counter()
    for shard in range(shards):
        rng = random.Random(seed * 7919 + shard)
        total.update(rng.choice(VOCABULARY) for _ in range(words))
    return dict(total)


def main(argv: list[str] | None = None) -> int:
    from skyfn import Executor

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", default="local")
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--reducers", type=int, default=4)
    ap.add_argument("--words", type=int, default=100_000, help="words per shard")
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args(argv)
    with Executor(endpoint=args.endpoint) as ex:
        counts = submit(ex, args.shards, args.reducers, args.words, args.seed).result(timeout=600)
    ok = counts == expected(args.shards, args.words, args.seed)
    print(json.dumps({"words": sum(counts.values()), "distinct": len(counts), "top": list(counts.items())[:5],
                      "matches_local_count": ok}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
