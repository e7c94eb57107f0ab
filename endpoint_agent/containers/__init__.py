"""Containers for workers (funcX section 6.2): runtimes that wrap the worker command line
(runtime.py), the `containers:` config section (config.py), the warm pool policy of a
manager and warming-aware manager choice for the interchange (warm_pool.py), and a
process-level harness running tasks in container workers without the agent (harness.py).
"""
from endpoint_agent.containers.config import (ContainerConfig, ContainerConfigError, ContainerType,
                                              parse_container_config)
from endpoint_agent.containers.runtime import (ContainerError, Launch, Runtime, build_skeleton_rootfs,
                                               make_runtime, runtime_from_settings)

__all__ = ["ContainerConfig", "ContainerConfigError", "ContainerType", "parse_container_config",
           "ContainerError", "Launch", "Runtime", "build_skeleton_rootfs", "make_runtime",
           "runtime_from_settings"]
