"""A ``concurrent.futures.Executor`` that runs functions on a skyfn endpoint.

Threading model
---------------
* The caller's thread, in ``submit``/``map``: registers each distinct function once
  (cached by the function object), serializes the arguments (so serialization errors
  raise right there), creates the future and appends it to the submission queue.
* ONE background thread (``skyfn-executor``, skyfn/executor/service_path.py), started on
  first use (and again after it ended, idle), does all the I/O with the service: submission
  batches by group commit, cancels, results pushed over the service's WebSocket API
  (``push``, on unless SKYFN_EXECUTOR_PUSH=0) or long-polled. The progress bar, if any, is
  driven from this thread only (from the direct channel's thread instead, when the
  executor has one).
* With ``direct=True`` a second thread (``skyfn-direct``, skyfn/executor/direct.py) takes
  the submissions instead: it sends them to the endpoint's agent in a direct session the
  service authorized, and resolves futures from the agent's answers. What it cannot run
  that way (no session offered, a refusal, the agent lost) it hands back to the queue
  above, and the service path takes it.
* Futures are never left hanging (service_path.py says how).

The state both threads share lives in one ``State`` (skyfn/executor/state.py) under one lock;
each channel reaches it only through the ``ChannelPort`` this core hands it
(skyfn/executor/channel.py).
"""
from __future__ import annotations

import logging
import sys
import threading
import time
from concurrent.futures import Executor as _BaseExecutor
from concurrent.futures import TimeoutError as FuturesTimeoutError
from typing import Any, Callable, Iterable, Iterator, Optional, TextIO, Union

from skyfn.client import Client
from skyfn.submission import check_user_config, task_options
from skyfn.dataflow import find_inputs
from skyfn.executor import service_path
from skyfn.executor.channel import ChannelPort
from skyfn.executor.future import SkyfnFuture
from skyfn.executor.inputs import Deferred
from skyfn.executor.refs import argument_refs
from skyfn.executor.progress import ProgressBar
from skyfn.executor.service_path import ServicePath
from skyfn.executor.state import State
from skyfn.protocol.serialize import pack_args

log = logging.getLogger("skyfn.executor")


class Executor(_BaseExecutor):
    """Run Python functions on a skyfn endpoint with the ``concurrent.futures`` API.

    >>> with Executor(endpoint="local") as ex:
    ...     print(sum(ex.map(pow, range(10), itertools.repeat(2))))

    ``user_config``: your variables for a multi-user endpoint's user config template (a JSON
    object of at most 16 KiB, nested at most 8 deep; DESIGN.md section 12), e.g.
    ``Executor(endpoint="cluster", user_config={"account": "proj1", "partition": "gpu"})``.
    It is sent with every batch the executor submits through the service, which hands it
    with your identity to the endpoint; ordinary endpoints ignore it. The direct-session
    path (``direct=True``) does not carry it: a multi-user endpoint takes tasks through the
    service, so pass ``direct=False`` (the default) to one.

    Dataflow: a future (of this Executor or another) or a ``skyfn.TaskRef`` among the
    arguments of ``submit``/``map`` -- also inside lists, tuples, dicts and sets -- stands
    for that task's result: the call is submitted at once and waits at the service until
    its inputs SUCCEEDED (``DependencyFailed`` when one did not), with no client in the
    loop. Such calls go through the service even with ``direct=True``; the future of a task
    that went through the direct session has no id the service knows, so a call taking it
    waits here for its value and passes it inline (skyfn/executor/inputs.py).

    ``direct_via``: how a direct session reaches the agent -- ``"auto"`` (the default, or
    $SKYFN_DIRECT_VIA): its advertised address when a TCP connection to it can be made,
    else through the rendezvous server, punched or relayed (an agent behind a NAT or a
    site firewall: docs/direct-from-a-laptop.md); ``"address"``; ``"rendezvous"`` (always).
    ``direct_path`` says which path the session took: tcp, punched or relayed.
    """

    def __init__(
        self,
        endpoint_id: Optional[str] = None,
        endpoint: str = "local",
        client: Optional[Client] = None,
        batch_size: int = 1000,
        batch_interval: float = 0.0,
        progress: Union[bool, TextIO] = False,
        *,
        poll_wait: float = 1.0,
        max_poll_failures: int = 3,
        container: Optional[str] = None,
        tag: Optional[str] = None,
        resource_specification: Optional[dict] = None,
        walltime: Optional[float] = None,
        group: Optional[str] = None,
        memoize: Optional[bool] = None,
        push: Optional[bool] = None,
        data_store: Any = "auto",
        ref_threshold: int = 1 << 20,
        evict_refs: bool = False,
        arg_ref_ttl: Optional[float] = None,
        direct: Optional[bool] = None,
        direct_timeout: float = 5.0,
        direct_via: Optional[str] = None,
        user_config: Optional[dict] = None,
    ):
        self.user_config = check_user_config(user_config)  # ValueError before anything starts
        self._own_client = client is None
        self.client = client if client is not None else Client()
        # group: an endpoint group's id (Client.create_group): its policy places each task
        self.group_id = group
        self.endpoint_id = None if group else (endpoint_id or self.client.endpoint_id(endpoint))
        self.batch_size = max(1, min(int(batch_size), 5_000))
        self.batch_interval = max(0.0, float(batch_interval))
        self.poll_wait = max(0.0, float(poll_wait))
        self.max_poll_failures = max(0, int(max_poll_failures))
        self.container = container
        self.tag = tag
        # Applied to every task: {"cores": n, "gpus": n}; walltime in seconds (TIMED_OUT past it).
        self._task_options = task_options(resource_specification, walltime)
        # memoize: True answers calls already made on the same arguments from the service's
        # cache (no dispatch); False runs them all; None: each function's own setting.
        self.memoize = memoize
        # Arguments above ref_threshold bytes travel as refs (skyfn.data): on data_store (a
        # Store or its name), or with "auto" the endpoint's default store when its agent runs
        # on this machine; None/False: inline or through the service's S3 path as before.
        # Refs made here are evicted when their tasks finish -- by the worker that ran the task,
        # and by this Executor -- and expire arg_ref_ttl seconds after they were put whatever
        # happens to this process (None: SKYFN_ARG_REF_TTL, else 24 h; skyfn/data/autoref.py);
        # evict_refs: the user's refs are evicted here too, once their tasks finish.
        self._arg_refs = argument_refs(self.client, data_store, endpoint if not (endpoint_id or group) else None,
                                        ref_threshold, evict_refs, arg_ref_ttl)

        # shared with the channels, under one lock (skyfn/executor/state.py)
        self._state = st = State()
        self._cv = st.cv
        self._fn_lock = threading.Lock()
        self._fn_ids: dict[Any, str] = {}
        self._deferred = Deferred(st, self, self._pack, lambda items: self._enqueue(items, flush=True, via_service=True))
        self._bar = ProgressBar(progress, st, lambda: self._direct)
        # results push (skyfn/executor/push.py); the wake-up pipe interrupts its select
        self._wake_r, self._wake_w = (-1, -1)
        self._pushed = None
        self._direct = None
        import os

        if push is None:  # the default: on; SKYFN_EXECUTOR_PUSH=0 long-polls only
            push = os.environ.get("SKYFN_EXECUTOR_PUSH", "1") != "0"
        if push:
            from skyfn.executor.push import PushedResults
            from skyfn.push import ws_url

            self._wake_r, self._wake_w = os.pipe()
            os.set_blocking(self._wake_r, False)
            os.set_blocking(self._wake_w, False)
            self._pushed = PushedResults(self._port("executor"),
                                         os.environ.get("SKYFN_WS_URL") or ws_url(self.client.service_url),
                                         self.client.config.token)
        # direct: tasks straight to the agent and back (skyfn/executor/direct.py) when it
        # offers a session; the service still authorizes and records them. Off by default
        # (SKYFN_EXECUTOR_DIRECT=1 turns it on); groups and memoized calls need the service.
        self.direct_why_not: Optional[str] = None
        if direct is None:
            direct = os.environ.get("SKYFN_EXECUTOR_DIRECT", "0") == "1"
        if direct:
            self.direct_why_not = ("an endpoint group's policy places tasks at the service" if group else
                                   "memoized calls are answered from the service's cache" if memoize else None)
            if self.direct_why_not is None:
                from skyfn.executor.direct import DirectChannel

                self._direct = DirectChannel(self._port("direct"), self.endpoint_id, direct_timeout, via=direct_via)
                self.direct_why_not = self._direct.why_not
                if self.direct_why_not is not None:  # pyzmq missing: the service path, as without direct
                    self._direct = None
        self._service = ServicePath(st, self.client, endpoint_id=self.endpoint_id, group_id=self.group_id,
                                    memoize=self.memoize, user_config=self.user_config,
                                    task_options=lambda: self._task_options, batch_size=self.batch_size,
                                    batch_interval=self.batch_interval, poll_wait=self.poll_wait,
                                    max_poll_failures=self.max_poll_failures, bar=self._bar, pushed=self._pushed,
                                    wake_r=self._wake_r, direct=self._direct is not None)

    @property
    def _thread(self):
        """The background thread while it runs (service_path.py), else None."""
        return self._service.thread

    def _port(self, owner: str) -> ChannelPort:
        """What a channel may use of this executor (skyfn/executor/channel.py)."""
        return ChannelPort(self._state, self.client, batch_size=self.batch_size, idle_exit=service_path._IDLE_EXIT,
                           task_options=lambda: self._task_options,
                           to_service=lambda items: self._enqueue(items, flush=True, via_service=True),
                           bar=self._bar, owner=owner)

    # -- public API -----------------------------------------------------------------
    def submit(self, fn: Union[Callable[..., Any], str], /, *args: Any, **kwargs: Any) -> SkyfnFuture:
        """Schedule ``fn(*args, **kwargs)`` on the endpoint; ``fn`` may also be a function id."""
        fid = self._function_id(fn)
        fut = SkyfnFuture()
        item = self._item(fut, fid, args, kwargs)
        if item is not None:
            self._enqueue([item], flush=False)
        return fut

    def _item(self, fut: SkyfnFuture, fid: str, args: tuple, kwargs: dict) -> Optional[tuple]:
        """The queue item of a call; None when it waits for by-value inputs (skyfn/executor/inputs.py)."""
        args, kwargs, found = find_inputs(args, kwargs)
        if found:
            return self._deferred.item(fut, fid, args, kwargs, found)
        return fut, fid, self._pack(fut, args, kwargs)

    def _pack(self, fut: SkyfnFuture, args: tuple, kwargs: dict) -> str:
        refs = self._arg_refs
        if refs is None:
            payload = pack_args(args, kwargs)
        else:
            payload, made = refs.pack(args, kwargs)
            refs.track(fut, made)
        if self.group_id and ("skyfn.data.ref" in sys.modules):  # where its refs live: the group's policy may
            from skyfn.data.autoref import data_locations      # prefer that endpoint (data_local, affinity data)

            fut.data_locations = data_locations(args, kwargs) or None
        return payload

    def map(
        self, fn: Union[Callable[..., Any], str], *iterables: Iterable[Any], timeout: Optional[float] = None, chunksize: int = 1
    ) -> Iterator[Any]:
        """Like ``concurrent.futures.Executor.map``; every call is submitted at once (in
        batches of ``batch_size``), results are yielded in order. ``chunksize`` is
        accepted for compatibility; batching is the executor's own."""
        end_time = None if timeout is None else timeout + time.monotonic()
        fid = self._function_id(fn)
        fs: list[SkyfnFuture] = []
        pending: list[tuple[SkyfnFuture, str, str]] = []
        for args in zip(*iterables):
            fut = SkyfnFuture()
            item = self._item(fut, fid, args, {})
            if item is not None:
                pending.append(item)
            fs.append(fut)
            if len(pending) >= self.batch_size:
                self._enqueue(pending, flush=True)
                pending = []
        if pending:
            self._enqueue(pending, flush=True)

        def result_iterator() -> Iterator[Any]:
            try:
                fs.reverse()
                while fs:
                    if end_time is None:
                        yield fs.pop().result()
                    else:
                        yield fs.pop().result(end_time - time.monotonic())
            except FuturesTimeoutError:
                raise
            finally:
                for f in fs:
                    f.cancel()

        return result_iterator()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop accepting work. With ``cancel_futures``, cancel every future not done yet
        (queued ones locally, submitted ones also remotely; a direct task only locally).
        With ``wait``, return once every future is done."""
        st = self._state
        if self._direct is not None:
            if cancel_futures:
                for fut in self._direct.futures():
                    fut.cancel()
            # first: what the direct path gives up on goes through the service, below
            self._direct.close(wait=wait and self._direct.is_alive())
        with self._cv:
            st.shutdown = True
            if cancel_futures:
                queued, st.queue = st.queue, []
                st.n_submitted -= len(queued)
                for fut, _, _ in queued:
                    fut.cancel()
                for fut in st.inflight + list(st.outstanding.values()) + list(st.deferred):
                    fut.cancel()  # submitted: -> _request_cancel; in flight: seen by _send_batch
            self._cv.notify_all()
            self._wake()
            while wait and st.deferring():  # queued once their inputs are done
                self._cv.wait(0.1)
            thread = self._thread
        if wait:
            if thread is not None:
                thread.join()
            self._close_client()
            if self._wake_r >= 0:
                import os

                for fd in (self._wake_r, self._wake_w):
                    os.close(fd)
                self._wake_r = self._wake_w = -1

    @property
    def outstanding(self) -> int:
        """Tasks submitted by this executor whose results have not arrived yet."""
        st = self._state
        with self._cv:
            n = len(st.queue) + len(st.inflight) + len(st.outstanding) + len(st.deferred)
        return n + (self._direct.pending() if self._direct is not None else 0)

    @property
    def direct_stats(self) -> dict:
        """Counters of the direct session (sessions, packs, tasks, results, refused, lost,
        to_service, peak_in_flight: the most tasks the agent held at once) and whether it is
        in use; {} when the executor was made without it."""
        return self._direct.snapshot() if self._direct is not None else {}

    @property
    def direct_path(self) -> Optional[str]:
        """How the direct session reaches the agent now: "tcp" (its address), "punched" or
        "relayed" (through the rendezvous server); None without a connection."""
        return self._direct.path if self._direct is not None else None

    # -- caller side ----------------------------------------------------------------
    def _function_id(self, fn: Union[Callable[..., Any], str]) -> str:
        if isinstance(fn, str):
            return fn
        fid = self._fn_ids.get(fn)
        if fid is None:
            with self._fn_lock:
                fid = self._fn_ids.get(fn)
                if fid is None:
                    fid = self._fn_ids[fn] = self.client.register_function(fn, tag=self.tag, container=self.container)
        return fid

    def _enqueue(self, items: list[tuple[SkyfnFuture, str, str]], flush: bool, via_service: bool = False) -> None:
        """Queue submissions; `via_service`: handed back by the direct channel (already counted)."""
        st = self._state
        direct = self._direct
        with self._cv:
            if st.broken is not None:
                raise RuntimeError(f"this skyfn Executor stopped after an internal error: {st.broken!r}")
            if st.shutdown and not via_service:
                raise RuntimeError("cannot schedule new futures after shutdown")
            for item in items:
                item[0]._executor = self
            if st.deferred:
                st.deferred.difference_update(item[0] for item in items)
            if direct is not None and not via_service and direct.usable:
                plain = [item for item in items if not item[0].inputs]  # with inputs: the service holds them
                for item in plain:
                    item[0].by_value = True  # its id will not be the service's
                if plain:
                    st.n_submitted += len(plain)
                    direct.submit(plain)
                    if direct.ident is None:
                        direct.start()
                items = [item for item in items if item[0].inputs] if len(plain) < len(items) else []
                if not items:
                    return
            if via_service:
                st.n_submitted -= len(items)  # counted again below
                for item in items:  # the service gives it its id now
                    item[0].by_value = False
                    item[0].task_id = None
            now = time.monotonic()
            if not st.queue:
                st.first_enqueued = now
            st.last_enqueued = now
            st.queue.extend(items)
            st.n_submitted += len(items)
            if flush:
                st.flush_now = True
            if self._service.thread is None:
                self._service.start()
            self._cv.notify_all()
            self._wake()

    def _wake(self) -> None:
        """Interrupt the thread's select on the push socket (call with _cv held)."""
        if self._state.selecting:
            try:
                import os

                os.write(self._wake_w, b"x")
            except (BlockingIOError, OSError):
                pass

    @property
    def push_stats(self) -> dict:
        """Counters of the results push (connects, disconnects, pushes, gaps, ...); {} without it."""
        return dict(self._pushed.stats, connected=self._pushed.connected) if self._pushed is not None else {}

    def _request_cancel(self, task_id: str) -> None:
        st = self._state
        with self._cv:
            if task_id in st.outstanding:
                st.to_cancel.add(task_id)
                self._cv.notify_all()
                self._wake()

    def _close_client(self) -> None:
        if self._own_client:
            self.client.close()

