"""The light agents' execution: one thread pool for every light agent of a process.

`SharedPool(threads)` runs calls with the worker's own `run_task`
(endpoint_agent/manager/worker.py): the function deserialized from its body, the arguments
unpacked (a payload kept in S3 fetched, a dataflow envelope opened), the call, the result
serialized or the exception wrapped with its traceback -- so a result is the same string
a worker process would have sent. Around each call: the task's owner for this thread
(skyfn.data.context.set_thread_task: whose refs the task may resolve) and what it prints
captured (capture.py). Deserialized functions are kept once per process by function id
and body (an agent only runs a body its own task packs brought). `shared_pool(threads)`
is the pool of the process, made on first use; a fleet host makes its own.

Threads: a blocked or long task holds a thread of the pool, and the GIL is shared: this
is for many mostly idle endpoints with short tasks (benchmarks, fleets), not for heavy
compute -- that is what the interchange's worker processes are for.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

from endpoint_agent.light import capture
from endpoint_agent.manager.worker import _wrap, run_task
from skyfn.data.context import set_thread_task
from skyfn.protocol.serialize import deserialize

MAX_FUNCTIONS = 4096  # deserialized functions kept per process, then the cache starts again

Outcome = tuple  # (state, result, error, started, done, stdout, stderr, argument refs)


class _Functions:
    """What run_task asks for a function: the agent's body of it, deserialized once per process."""

    __slots__ = ("cache", "bodies")

    def __init__(self, cache: dict[str, tuple[str, Any]], bodies: dict[str, str]):
        self.cache, self.bodies = cache, bodies

    def get(self, function_id: str):
        body = self.bodies.get(function_id)
        if body is None:
            raise LookupError(f"function {function_id} was not delivered to this agent")
        kept = self.cache.get(function_id)
        if kept is not None and (kept[0] is body or kept[0] == body):
            fn = kept[1]
        else:
            try:
                fn = deserialize(body)
            except Exception as exc:  # DeserializationError, with the fix in its message
                fn = exc
            if len(self.cache) >= MAX_FUNCTIONS:
                self.cache.clear()
            self.cache[function_id] = (body, fn)
        if isinstance(fn, BaseException):
            raise fn
        return fn


class SharedPool:
    def __init__(self, threads: int):
        self.threads = threads
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="skyfn-inline")
        self._functions: dict[str, tuple[str, Any]] = {}
        self.calls = 0
        capture.install()

    def submit(self, done: Callable[[Outcome], None], bodies: dict[str, str], function_id: str, payload: str,
               owner: Optional[str], task_id: str, max_output: int) -> None:
        """Run the call on a thread of the pool, then `done(outcome)` on that thread."""
        self._executor.submit(self._run, done, bodies, function_id, payload, owner, task_id, max_output)

    def _run(self, done, bodies, function_id, payload, owner, task_id, max_output) -> None:
        self.calls += 1
        refs: list = []
        set_thread_task(owner, task_id)
        capture.begin(max_output)
        t0 = time.time()
        try:
            state, result, error = run_task(_Functions(self._functions, bodies), function_id, payload, refs)
        except BaseException as exc:  # noqa: BLE001 - e.g. SystemExit raised by unpickling: the task fails
            state, result, error = "FAILED", None, _wrap(exc)
        finally:
            t1 = time.time()
            out, err = capture.end()
            set_thread_task(None)
        done((state, result, error, round(t0, 6), round(t1, 6), out, err, refs))

    def shutdown(self, wait: bool = True) -> None:
        self._executor.shutdown(wait=wait, cancel_futures=not wait)


_pools: dict[int, SharedPool] = {}
_pools_lock = threading.Lock()


def shared_pool(threads: int) -> SharedPool:
    """The process's pool of `threads` threads (made on first use, kept for the process)."""
    with _pools_lock:
        pool = _pools.get(threads)
        if pool is None:
            pool = _pools[threads] = SharedPool(threads)
        return pool
