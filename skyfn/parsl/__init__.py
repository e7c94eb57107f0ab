"""skyfn.parsl: run Parsl workflows on skyfn endpoints (needs the ``parsl`` package).

- ``executor``: ``SkyfnExecutor``, the Parsl executor over skyfn's Executor;
- ``options``: a task's Parsl ``resource_specification`` -> skyfn's per-task options.

    from parsl.config import Config
    from skyfn.parsl import SkyfnExecutor

    config = Config(executors=[SkyfnExecutor(endpoint="local")])
"""
from skyfn.parsl.executor import SkyfnExecutor

__all__ = ["SkyfnExecutor"]
