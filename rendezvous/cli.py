"""Command line of the rendezvous server: `python -m rendezvous --host H --port P --secret S`.

The secret may come from SKYFN_RENDEZVOUS_SECRET instead of --secret (which other users
of the machine can see in the process list). Neither the secret nor tokens are logged.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import List, Optional

from .runner import SECRET_ENV, run
from .server import Limits


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rendezvous",
                                description="skyfn rendezvous server: ranks, peer addresses, barriers "
                                            "and relays for NAT-punched communicator groups.")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=7300, help="TCP port (default 7300; 0 = any free port)")
    p.add_argument("--secret", default=None, help=f"token signing secret (default: ${SECRET_ENV})")
    p.add_argument("--join-timeout", type=float, default=60.0,
                   help="seconds a group (or a relay half) may wait for its peers (default 60)")
    p.add_argument("--max-connections", type=int, default=16000, help="open connections at most")
    p.add_argument("--max-groups", type=int, default=8000, help="groups still filling at once at most")
    p.add_argument("--loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                   help="event loop (auto: uvloop when installed)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--port-file", default=None, help="write the bound port to this file once listening")
    return p


def run_server(host: str, port: int, secret: Optional[str], join_timeout: float = 60.0,
               max_connections: int = 16000, max_groups: int = 8000, loop: str = "auto",
               log_level: str = "info", port_file: Optional[str] = None) -> None:
    """Validate the arguments, configure logging and serve until SIGINT/SIGTERM."""
    secret = secret or os.environ.get(SECRET_ENV)
    if not secret:
        raise ValueError(f"no secret: pass --secret S or set {SECRET_ENV}")
    if not 0 <= port <= 65535:
        raise ValueError(f"--port {port} is not a TCP port (0-65535)")
    if join_timeout <= 0 or max_connections < 1 or max_groups < 1:
        raise ValueError("--join-timeout, --max-connections and --max-groups must be positive")
    logging.basicConfig(level=getattr(logging, log_level.upper()),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    limits = Limits(max_connections=max_connections, max_groups=max_groups, join_timeout_s=join_timeout,
                    first_line_timeout_s=min(10.0, join_timeout))
    run(host, port, secret, limits, loop=loop, port_file=port_file)


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        run_server(args.host, args.port, args.secret, args.join_timeout, args.max_connections,
                   args.max_groups, args.loop, args.log_level, args.port_file)
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
