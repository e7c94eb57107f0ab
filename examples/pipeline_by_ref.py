"""A two-task pipeline passing a 100 MiB array by reference (README, "Data by reference").

`python -m examples.pipeline_by_ref` against a running embedded runtime (`skyfn local up
--detach`): task A makes the array on the endpoint and returns a Ref to it in the
endpoint's Redis; task B gets the Ref, resolves it there and summarises it. Only a few
hundred bytes travel through the service.
"""
from __future__ import annotations

import pickle

import numpy as np

from skyfn import Executor
from skyfn.data import ref_info


def simulate(n, seed):
    import numpy as np

    from skyfn.data import default_store

    field = np.random.default_rng(seed).random((n, n))
    return default_store().ref(field, ttl=3600)


def analyse(field):
    import numpy as np

    a = np.asarray(field)  # resolved here, from the endpoint's Redis
    return {"mean": float(a.mean()), "max": float(a.max()), "shape": list(a.shape)}


def main() -> None:
    with Executor(endpoint="local") as ex:
        ref = ex.submit(simulate, 3_620, 7).result(timeout=300)
        info = ref_info(ref)
        print(f"A returned a ref of {len(pickle.dumps(ref))} bytes to {info.size / 2**20:.0f} MiB in {info.store}")
        print("B:", ex.submit(analyse, ref).result(timeout=300))
        big = np.ones((2_000, 2_000))  # 30 MiB argument: the Executor makes it a ref itself
        print("B on a 30 MiB argument:", ex.submit(analyse, big).result(timeout=300))


if __name__ == "__main__":
    main()
