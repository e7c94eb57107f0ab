"""The start-up probe of the benchmark gate (benchmarks/gate.py): the embedded runtime's start
as a user runs it, and a bare redis-server's start beside it.

    python -m benchmarks.gate_start [--json]

`skyfn local up --detach` in a fresh SKYFN_HOME (a new user's first start), `skyfn local
down`, then `skyfn local up --detach` again on the same home (a restart: the append-only file
replayed, the endpoint registered already), each timed from the command's start to its exit
(it returns once the service answers and the endpoint is online). The bare redis-server's
start to its first PING is printed as the floor no start can beat (not a gate figure: a few
milliseconds, too noisy to divide by). The home is removed at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SKYFN = str(Path(sys.executable).with_name("skyfn"))


def _timed(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return took


def redis_start_s() -> float:
    """A bare redis-server (no persistence) from exec to its first PONG."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return time.perf_counter() - t0
            except OSError:
                if time.perf_counter() - t0 > 10:
                    raise RuntimeError("redis-server did not answer within 10 s") from None
                time.sleep(0.001)
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="skyfn-gate-start-"))
    env = dict(os.environ, SKYFN_HOME=str(home))
    out: dict = {}
    try:
        out["fresh_s"] = round(_timed([SKYFN, "local", "up", "--detach"], env), 3)
        _timed([SKYFN, "local", "down"], env)
        out["restart_s"] = round(_timed([SKYFN, "local", "up", "--detach"], env), 3)
    finally:
        subprocess.run([SKYFN, "local", "down"], env=env, capture_output=True, timeout=60)
        shutil.rmtree(home, ignore_errors=True)
    out["redis_server_start_s"] = round(redis_start_s(), 4)
    print(f"skyfn local up --detach: fresh home {out['fresh_s']:.2f} s, restart {out['restart_s']:.2f} s; "
          f"a bare redis-server answers PING {out['redis_server_start_s'] * 1000:.1f} ms after exec")
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
