"""Garbage-collector settings for skyfn's own long-running processes: the endpoint agent,
and the embedded runtime's gateway and Lambda workers. Never a user's process (the SDK)
nor a worker that runs user code.

CPython's cyclic collector walks every tracked object of the oldest generation on a full
collection. A process that imported boto3, pydantic and the handlers holds hundreds of
thousands of them, all made at start-up and alive until exit, so a full collection stalled
all its threads for 20-540 ms, every few seconds under load (measured during
`benchmarks/soak.py`; the agent's collected nothing). `settle()` moves what start-up made
out of the collector's sight (`gc.freeze`) and raises the first threshold, so the
short-lived objects of a task die before they are promoted. Reference cycles made later
are still collected.
"""
from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000  # allocations between young collections (CPython's default: 700)


def settle() -> None:
    """Call once start-up is done, before serving."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
