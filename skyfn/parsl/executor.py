"""``SkyfnExecutor``: a Parsl executor whose tasks run on a skyfn endpoint.

A thin wrapper over skyfn's ``concurrent.futures`` Executor (skyfn.executor), as Parsl's own
``GlobusComputeExecutor`` wraps Globus Compute's: Parsl's DataFlowKernel keeps doing what it
does (apps, dependencies, retries, checkpointing, memoization, staging), and every task it
launches becomes one skyfn task; ``submit`` returns skyfn's future.

    from parsl.config import Config
    from skyfn.parsl import SkyfnExecutor

    config = Config(executors=[SkyfnExecutor(endpoint="cluster")])

Per-task options come from Parsl's ``parsl_resource_specification`` (skyfn/parsl/options.py):
``cores``, ``gpus``, ``walltime`` and a multi-user endpoint's ``user_config``. A skyfn Executor
applies its options to every task it submits, so tasks whose options differ from the default
go through a sibling Executor made for those options, on the same client and endpoint (one
per distinct set of options, made on first use).
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import Any, Callable, Dict, List, Optional

from parsl.executors.base import ParslExecutor
from parsl.monitoring.radios.base import RadioConfig
from parsl.utils import RepresentationMixin

from skyfn.client import Client
from skyfn.executor import Executor
from skyfn.parsl.options import TaskOptions, split

log = logging.getLogger("skyfn.parsl")

# Keywords of skyfn's Executor that SkyfnExecutor sets itself (the rest go in executor_options).
_OWN = ("endpoint", "endpoint_id", "client", "batch_size", "resource_specification", "walltime", "user_config")


class SkyfnExecutor(ParslExecutor, RepresentationMixin):
    """Run Parsl apps on a skyfn endpoint.

    Give either ``executor``, a skyfn ``Executor`` made as you like (its own options apply to
    tasks without a resource specification; other tasks go through siblings made with its
    endpoint or group, client, batching, container, tag and memoize settings), or the
    arguments to make one when Parsl starts this executor:

    ``endpoint`` / ``endpoint_id``: the endpoint, by name (default "local") or id;
    ``user_config``: the multi-user endpoint's template variables for every task;
    ``resource_specification``: the default for tasks without one (``cores``, ``gpus``,
    ``walltime``; a task's own specification replaces it, as with GlobusComputeExecutor);
    ``batch_size``: tasks per submission request; ``executor_options``: any other keyword of
    skyfn's Executor (``group``, ``container``, ``memoize``, ``data_store``, ``direct``, ...).

    ``storage_access`` and ``working_dir`` are Parsl's file staging settings;
    ``remote_monitoring_radio`` is the radio Parsl's monitoring wrapper uses from the workers
    (e.g. ``UDPRadio(address=...)`` reachable from the endpoint), needed only with resource
    monitoring on.
    """

    def __init__(
        self,
        executor: Optional[Executor] = None,
        label: str = "skyfn",
        endpoint: Optional[str] = None,
        endpoint_id: Optional[str] = None,
        user_config: Optional[dict] = None,
        resource_specification: Optional[dict] = None,
        batch_size: int = 1000,
        executor_options: Optional[Dict[str, Any]] = None,
        storage_access: Optional[List[Any]] = None,
        working_dir: Optional[str] = None,
        remote_monitoring_radio: Optional[RadioConfig] = None,
    ):
        super().__init__()
        if executor is not None:
            if not isinstance(executor, Executor):
                raise TypeError(f"executor must be a skyfn.executor.Executor, not {type(executor).__name__}")
            given = [name for name, value in (("endpoint", endpoint), ("endpoint_id", endpoint_id),
                                              ("user_config", user_config),
                                              ("resource_specification", resource_specification),
                                              ("executor_options", executor_options)) if value]
            if given:
                raise ValueError(f"give {', '.join(given)} to the skyfn Executor you pass, not to SkyfnExecutor")
        clash = sorted(set(executor_options or ()) & set(_OWN))
        if clash:
            raise ValueError(f"executor_options may not set {clash}: they are SkyfnExecutor's own arguments")
        self.executor = executor
        self._given = executor is not None
        self.label = label
        self.endpoint = endpoint
        self.endpoint_id = endpoint_id
        self.user_config = user_config
        self.resource_specification = resource_specification
        self.batch_size = batch_size
        self.executor_options = executor_options
        self.storage_access = storage_access
        self.working_dir = working_dir
        self.remote_monitoring_radio = remote_monitoring_radio
        # the default options, checked now so that a bad config fails at load, not per task
        self._default = split(resource_specification, user_config)
        self._default_key = self._default.key()
        self._client: Optional[Client] = None
        self._own_client = False
        self._siblings: dict[str, Executor] = {}
        self._lock = threading.Lock()

    # -- Parsl's executor interface ---------------------------------------------------
    def start(self) -> None:
        """Make the skyfn Executor (unless one was given): resolves the endpoint."""
        if self._given:
            assert self.executor is not None
            self._client = self.executor.client
            self._default = TaskOptions(user_config=self.executor.user_config)
            self._default_key = self._default.key()
            return
        self._client = Client()
        self._own_client = True
        try:
            self.executor = self._make(self._default)
        except BaseException:
            self._client.close()
            raise

    def submit(self, func: Callable, resource_specification: Dict[str, Any], *args: Any, **kwargs: Any) -> Future:
        """Submit ``func(*args, **kwargs)`` as a skyfn task; returns its skyfn future.
        A bad ``resource_specification`` raises InvalidResourceSpecification naming the key."""
        return self.executor_for(resource_specification).submit(func, *args, **kwargs)

    def shutdown(self) -> None:
        """Cancel what is still pending (Parsl waited for its tasks before) and stop every
        skyfn Executor this one used; close the client it made."""
        with self._lock:
            executors = list(self._siblings.values())
            self._siblings.clear()
        if self.executor is not None:
            executors.append(self.executor)
        for ex in executors:
            try:
                ex.shutdown(wait=True, cancel_futures=True)
            except Exception:
                log.exception("shutting down a skyfn Executor of %s", self.label)
        if self._own_client and self._client is not None:
            self._client.close()
        super().shutdown()

    # -- options -> skyfn Executors ----------------------------------------------------
    def executor_for(self, resource_specification: Optional[Dict[str, Any]] = None) -> Executor:
        """The skyfn Executor that runs tasks with this resource specification: the default
        one for none (or one with the default's options), else the sibling for its options."""
        if self.executor is None:
            raise RuntimeError(f"SkyfnExecutor {self.label!r} was not started (Parsl starts it in parsl.load)")
        opts = split(resource_specification, self._default.user_config) if resource_specification else self._default
        key = opts.key()
        if key == self._default_key:
            return self.executor
        ex = self._siblings.get(key)
        if ex is None:
            with self._lock:
                ex = self._siblings.get(key)
                if ex is None:
                    ex = self._siblings[key] = self._make(opts)
        return ex

    def _make(self, opts: TaskOptions) -> Executor:
        """A skyfn Executor applying `opts` to its tasks, otherwise as configured."""
        if self._given:
            base = self.executor  # given: its public settings
            assert base is not None
            kwargs: dict[str, Any] = dict(endpoint_id=base.endpoint_id, group=base.group_id, batch_size=base.batch_size,
                                          batch_interval=base.batch_interval, poll_wait=base.poll_wait,
                                          max_poll_failures=base.max_poll_failures, container=base.container,
                                          tag=base.tag, memoize=base.memoize)
        else:
            kwargs = dict(self.executor_options or {}, endpoint_id=self.endpoint_id,
                          endpoint=self.endpoint or "local", batch_size=self.batch_size)
        return Executor(client=self._client, **kwargs, **opts.executor_kwargs())
