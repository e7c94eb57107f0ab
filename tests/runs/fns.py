"""Functions the workflow tests register (serialized by source, run on the endpoint)."""


def square(x):
    return x * x


def square_or_fail(x):
    if x % 10 == 0:
        raise ValueError(f"no multiples of ten: {x}")
    return x * x


def upto(n):
    return list(range(n))


def total(values):
    return sum(values)


def largest(values):
    return max(values)


def always_fails(value):
    raise ValueError(f"this step always fails (input {value!r})")


def fails_first_time(spec):
    """Fails on its first call (counted in a file), succeeds on the second."""
    import os

    path = spec["counter"]
    calls = int(open(path).read()) + 1 if os.path.exists(path) else 1
    with open(path, "w") as f:
        f.write(str(calls))
    if calls < 2:
        raise RuntimeError(f"transient failure on call {calls}")
    return {"calls": calls}


def recover(error):
    return {"recovered_from": error["Error"], "cause_mentions_input": "always fails" in error["Cause"]}


def check_rank(rank, world_size, rendezvous, tag):
    """An SPMD rank that checks what it was handed."""
    import socket

    with socket.create_connection((rendezvous["host"], rendezvous["port"]), timeout=5):
        pass  # the rendezvous address is reachable from the endpoint
    return {"rank": rank, "world_size": world_size, "group": rendezvous["group"], "tag": tag,
            "token_ok": rendezvous["token"].count(".") == 1}


def allreduce_rank(rank, world_size, rendezvous):
    """An SPMD rank that joins its group through the rendezvous server and allreduces."""
    import numpy as np

    from comm import Communicator

    address = f"{rendezvous['host']}:{rendezvous['port']}"
    with Communicator.join(rendezvous["group"], address, rendezvous["token"], world_size, rank=rank,
                           timeout=30.0) as comm:
        mine = np.arange(4, dtype=np.int64) + 10 * rank
        total = comm.allreduce(mine, "sum")
        return {"rank": comm.rank, "size": comm.size, "sum": total.tolist()}


def fails_on_rank_one(rank, world_size, rendezvous):
    if rank == 1:
        raise RuntimeError(f"rank {rank} of {world_size} gives up")
    return rank
