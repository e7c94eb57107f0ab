"""Parsl as the benchmarks run it beside skyfn: a DataFlowKernel over a HighThroughputExecutor
on this machine (LocalProvider, one block of `workers` workers), its logging quiet."""
from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path


def load(workers: int, run_prefix: str):
    """The loaded DataFlowKernel, or None when Parsl is not installed. The caller ends it
    with dfk.cleanup() and parsl.clear()."""
    try:
        import parsl
        from parsl.config import Config
        from parsl.executors import HighThroughputExecutor
        from parsl.providers import LocalProvider
    except ImportError:
        return None
    logging.getLogger("parsl").setLevel(logging.WARNING)
    # HTEX starts interchange.py and process_worker_pool.py from PATH: the venv's bin.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    config = Config(executors=[HighThroughputExecutor(label="htex", max_workers_per_node=workers, cores_per_worker=1,
                                                      provider=LocalProvider(init_blocks=1, max_blocks=1))],
                    run_dir=tempfile.mkdtemp(prefix=run_prefix), initialize_logging=False)
    return parsl.load(config)
