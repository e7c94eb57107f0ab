"""The funcX paper's data experiment: a MapReduce word count whose shuffle goes by reference.

    python -m benchmarks.mapreduce [--json] [--mib 1024] [--maps 16] [--reducers 4]
                                   [--stores redis,file,direct] [--workers 2]

Runs through the real embedded runtime (`skyfn local up --detach` in a private SKYFN_HOME)
with one endpoint whose config.yaml has a `data:` section: its own Redis (`redis@<ep>`,
started by the agent with a password), a `file` store on a shared directory
(`shared@<ep>`), and the direct path (`direct@<ep>`: the endpoint's object server, with a
rendezvous server started here). Input: `--mib` of generated text (Zipf-distributed words
from a 20,000-word vocabulary) in `--maps` files on the shared directory, written before
the clock starts. Map task i reads its file and emits, per reducer, the words whose first
letter hashes to it (no combiner: the shuffle moves the whole text, about `--mib`), each
partition as a ref (evict once read) on the store under test. Reduce task r resolves its
`--maps` refs and counts. The word counts are checked against the counts the generator
drew. Times: whole job (first map submitted -> last reduce result), map phase, reduce
phase. Stores are run in turn, twice, in alternating order.

Inside one endpoint the direct connector reads the object server's directory itself (the
producer's endpoint keeps the bytes; memory-backed under /dev/shm); pulls over a punched
channel between endpoints are measured in benchmarks/data.py ("direct").
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import yaml

SPACE = 32


# --- the tasks (serialized by source: self-contained) -----------------------------------

def map_words(path, store_prefix, n_reduce):
    """Read one input file; return one ref per reducer holding the words routed to it
    (first byte % n_reduce), each followed by its space."""
    import numpy as np

    from skyfn.data import endpoint_stores

    store = next(s for name, s in endpoint_stores().items() if name.split("@")[0] == store_prefix)
    with open(path, "rb") as f:
        data = f.read()
    parts = [[] for _ in range(n_reduce)]
    step, pos = 8 << 20, 0
    while pos < len(data):  # slices ending at a space keep the temporaries small
        end = min(len(data), pos + step)
        if end < len(data):
            end = data.index(b" ", end) + 1
        arr = np.frombuffer(data, dtype=np.uint8, count=end - pos, offset=pos)
        space = arr == 32
        word = np.cumsum(space, dtype=np.int32) - space  # a word's id; its trailing space shares it
        starts = np.concatenate(([0], np.flatnonzero(space[:-1]) + 1))
        route = (arr[starts] % n_reduce).astype(np.uint8)[word]
        for r in range(n_reduce):
            parts[r].append(arr[route == r].tobytes())
        pos = end
    return [store.ref(b"".join(p), ttl=3600, evict=True) for p in parts]


def reduce_words(refs):
    """Resolve each map's partition for this reducer and count its words."""
    from collections import Counter

    counts = Counter()
    for i in range(len(refs)):
        counts.update(bytes(refs[i]).split())
        refs[i] = None  # the resolved partition goes now, not with the list
    return {w.decode(): n for w, n in counts.items()}


def warm(x):
    return x


# --- input ------------------------------------------------------------------------------

def generate(directory: Path, total_bytes: int, n_files: int, vocab_size: int = 20_000, seed: int = 12) -> dict:
    """Write n_files of space-separated words (about total_bytes in all); return the counts drawn."""
    import operator

    import numpy as np

    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    vocab, seen = [], set()
    while len(vocab) < vocab_size:  # distinct words of 3 to 10 letters
        w = letters[rng.integers(0, 26, int(rng.integers(3, 11)))].tobytes()
        if w not in seen:
            seen.add(w)
            vocab.append(w)
    lengths = np.array([len(w) for w in vocab])
    weights = 1.0 / np.arange(1, vocab_size + 1) ** 1.05  # Zipf-like, as text is
    weights /= weights.sum()
    mean_len = float((weights * (lengths + 1)).sum())
    counts = np.zeros(vocab_size, dtype=np.int64)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n_files):
        n_words = int(total_bytes / n_files / mean_len)
        idx = rng.choice(vocab_size, size=n_words, p=weights)
        counts += np.bincount(idx, minlength=vocab_size)
        path = directory / f"input-{i:03d}.txt"
        path.write_bytes(b" ".join(operator.itemgetter(*idx)(vocab)))
        paths.append(str(path))
    expected = {vocab[i].decode(): int(c) for i, c in enumerate(counts) if c}
    return {"paths": paths, "expected": expected, "bytes": sum(os.path.getsize(p) for p in paths),
            "words": int(counts.sum())}


# --- the runtime ---------------------------------------------------------------------------

def endpoint_config(shared: Path, rendezvous: str, workers: int) -> dict:
    return {"workers": workers,
            "data": {"default": "redis", "redis": {"start": True},
                     "stores": {"shared": {"connector": "file", "directory": str(shared / "objects")}},
                     "direct": {"rendezvous": rendezvous}}}


def start(home: Path, shared: Path, workers: int):
    """(rendezvous server, ) after the embedded runtime is up with the data endpoint."""
    import secrets

    from infra.local import runtime
    from rendezvous import serve_in_process

    secret = secrets.token_hex(16)
    os.environ["SKYFN_RENDEZVOUS_SECRET"] = secret  # the agent (and its object server) inherit it
    rdv = serve_in_process("127.0.0.1", 0, secret)
    (home / "endpoints" / "local").mkdir(parents=True, exist_ok=True)
    (home / "endpoints" / "local" / "config.yaml").write_text(yaml.safe_dump(endpoint_config(shared, rdv.address,
                                                                                            workers)))
    os.environ["SKYFN_HOME"] = str(home)
    runtime.up(home, detach=True, echo=lambda *_: None)
    return rdv


def stop(home: Path, rdv) -> None:
    from infra.local import runtime

    try:
        runtime.down(home, echo=lambda *_: None)
    finally:
        rdv.stop()


def run_job(ex, paths: list, store: str, n_reduce: int) -> dict:
    """One word count with the shuffle through `store`; the merged counts and the times."""
    t0 = time.perf_counter()
    maps = [ex.submit(map_words, p, store, n_reduce) for p in paths]
    outs = [f.result(timeout=3600) for f in maps]
    t1 = time.perf_counter()
    reduces = [ex.submit(reduce_words, [o[r] for o in outs]) for r in range(n_reduce)]
    parts = [f.result(timeout=3600) for f in reduces]
    t2 = time.perf_counter()
    counts: dict = {}
    for p in parts:
        for w, n in p.items():
            if w in counts:
                raise AssertionError(f"word {w!r} reached two reducers")
            counts[w] = n
    return {"counts": counts, "job_s": t2 - t0, "map_s": t1 - t0, "reduce_s": t2 - t1}


def main() -> None:
    parser = argparse.ArgumentParser(description="MapReduce word count with the shuffle by reference")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--mib", type=int, default=1024, help="generated text, MiB")
    parser.add_argument("--maps", type=int, default=16)
    parser.add_argument("--reducers", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--stores", default="redis,shared,direct")
    parser.add_argument("--rounds", type=int, default=2, help="each store this many times, order alternating")
    args = parser.parse_args()

    from skyfn import Executor

    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    base = Path(tempfile.mkdtemp(prefix="skyfn-bench-mapreduce-"))
    home, shared = base / "home", base / "shared"
    t = time.perf_counter()
    inputs = generate(shared / "input", args.mib << 20, args.maps)
    gen_s = time.perf_counter() - t
    print(f"input: {inputs['bytes'] / 2**20:.0f} MiB, {inputs['words']:,} words in {args.maps} files "
          f"({gen_s:.1f} s to generate)", flush=True)
    stores = [s for s in args.stores.split(",") if s]
    rows: dict[str, list] = {s: [] for s in stores}
    rdv = start(home, shared, args.workers)
    try:
        with Executor(endpoint="local") as ex:
            ex.submit(warm, 1).result(timeout=120)
            for rnd in range(args.rounds):
                for store in (stores if rnd % 2 == 0 else stores[::-1]):
                    out = run_job(ex, inputs["paths"], store, args.reducers)
                    ok = out.pop("counts") == inputs["expected"]
                    if not ok:
                        raise AssertionError(f"word counts through {store} differ from the generator's")
                    rows[store].append(out)
                    print(f"  {store:<8} round {rnd + 1}: job {out['job_s']:7.2f} s  map {out['map_s']:7.2f} s  "
                          f"reduce {out['reduce_s']:7.2f} s  counts correct", flush=True)
    finally:
        stop(home, rdv)
        shutil.rmtree(base, ignore_errors=True)

    def best(store):  # the fastest run of a store, all its figures from that run
        return min(rows[store], key=lambda r: r["job_s"])

    summary = {"input_mib": round(inputs["bytes"] / 2**20, 1), "words": inputs["words"], "maps": args.maps,
               "reducers": args.reducers, "workers": args.workers, "runtime": "embedded (skyfn local up)",
               "load_average_start": load_start, "load_average_end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
               "counts_correct": True, "results": {}}
    print(f"\n{'shuffle':<8} {'job s':>8} {'map s':>8} {'reduce s':>9}   (fastest of {args.rounds} runs)")
    for s in stores:
        b = best(s)
        summary["results"][s] = {**{k: round(v, 2) for k, v in b.items()},
                                 "runs": [{k: round(v, 2) for k, v in r.items()} for r in rows[s]]}
        print(f"{s:<8} {b['job_s']:>8.2f} {b['map_s']:>8.2f} {b['reduce_s']:>9.2f}")
    if "redis" in rows:
        for s in stores:
            if s != "redis":
                summary[f"{s}_over_redis_job"] = round(best(s)["job_s"] / best("redis")["job_s"], 3)
    print("ratios:", {k: v for k, v in summary.items() if "_over_" in k})
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
