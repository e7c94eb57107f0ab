"""For benchmarks: the producer's side of a loopback direct data path, with its own rendezvous
server and object server (child processes), stopped by PID at the end.

    conn = benchmark_connector("bench-direct", SECRET)       # benchmarks/data.py, benchmarks/data_direct.py
    Store("bench-direct", conn, secret=SECRET)
    ...
    stop_benchmark()                                          # also at exit

It starts the agent's object server (endpoint_agent/data/object_server.py), so it lives
here, above the SDK and the agent, not in the SDK's direct connector.
"""
from __future__ import annotations

import atexit
import os
import secrets
import shutil
from typing import Optional

from skyfn.data import context
from skyfn.data.connectors.direct import DirectConnector, close_channels, default_directory
from skyfn.protocol.objects import SECRET_ENV

_bench_processes: list = []


def benchmark_connector(store: str, secret, *, directory: Optional[str] = None) -> DirectConnector:
    """The producer's connector of a loopback direct path, for benchmarks (benchmarks/data.py):
    starts a rendezvous server and the object server of `store` (secret: hex or bytes, the
    Store's) as child processes on 127.0.0.1, sets a fresh SKYFN_RENDEZVOUS_SECRET and
    SKYFN_ENDPOINT_ID=bench-consumer in this process's environment (spawned consumers
    inherit them: they are "another endpoint"), and returns a connector that is local here
    (`local=True`) while consumers rebuilt from its `config()` in other processes pull
    through the object server over a punched channel. `stop_benchmark()` (also at exit)
    stops both servers by PID and removes the directory."""
    from endpoint_agent.data.object_server import STORE_SECRET_ENV, start_process
    from rendezvous import serve_in_process

    rdv_secret = secrets.token_hex(16)
    os.environ[SECRET_ENV] = rdv_secret
    os.environ[context.ENDPOINT_ENV] = "bench-consumer"
    rdv = serve_in_process("127.0.0.1", 0, rdv_secret)
    _bench_processes.append(rdv)
    name = f"objects.bench-{os.getpid()}-{len(_bench_processes)}"
    directory = directory or default_directory(name)
    secret_hex = secret.hex() if isinstance(secret, (bytes, bytearray)) else str(secret)
    server = start_process(["--rendezvous", rdv.address, "--name", name, "--store", store, "--directory", directory,
                            "--endpoint-id", "bench-producer", "--log-level", "warning"],
                           env={SECRET_ENV: rdv_secret, STORE_SECRET_ENV: secret_hex})
    _bench_processes.append(server)
    _bench_processes.append(lambda: shutil.rmtree(directory, ignore_errors=True))
    return DirectConnector(rdv.address, name, directory, endpoint_id="bench-producer", local=True)


@atexit.register
def stop_benchmark() -> None:
    """Stop what benchmark_connector started (in reverse order), by PID."""
    close_channels()
    while _bench_processes:
        item = _bench_processes.pop()
        item() if callable(item) else item.stop()
