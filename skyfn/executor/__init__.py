"""skyfn.executor: the ``concurrent.futures`` Executor and how its results come back.

One module per role, as Dask's ``distributed.comm`` keeps one per transport:

- ``core``: the Executor (its API, futures, the submission queue, cancels);
- ``service_path``: its one background thread, all it says to the service (submission
  batches by group commit, cancels, the long-poll of POST /tasks/status);
- ``push``: results pushed over the service's WebSocket API (the thread waits on the socket);
- ``direct``: a direct session, tasks straight to the endpoint's agent and results straight back;
- ``channel``: the small interface (``ChannelPort``) the core hands each channel: the channels
  touch nothing else of the Executor;
- ``state``: the state the core shares with its channels under one lock, and how a future
  resolves exactly once; ``progress``: the progress bar;
- ``future``: the Executor's future; ``inputs``: calls whose arguments hold futures
  (dataflow: naming their inputs, waiting for by-value ones); ``refs``: which store large
  arguments go to as refs.

    from skyfn.executor import Executor
"""
from skyfn.executor.core import Executor, SkyfnFuture

__all__ = ["Executor", "SkyfnFuture"]
