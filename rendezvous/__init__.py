"""The rendezvous server (DESIGN.md section 7, wire contract in docs/comm.md): peers of a
group join with an HMAC token, get ranks assigned atomically and the public address of
every other peer, meet at bootstrap barriers, and relay through the server when they
cannot punch through their NATs.

    make_token(secret, group, ttl_s=3600) -> str      tokens.py
    serve_in_thread(host, port, secret) -> handle     runner.py (.port, .stop())
    serve_in_process(host, port, secret) -> handle    runner.py (a `python -m rendezvous` child)
    rendezvous.client                                 reference client: join / barrier / relay
    rendezvous.bench.pairings_per_second(...)         pairing throughput

Run a server with `skyfn rendezvous --host H --port P --secret S` or `python -m rendezvous`.
"""
from .runner import serve_in_process, serve_in_thread
from .server import Limits, RendezvousServer
from .tokens import TokenError, make_token, verify_token

__all__ = ["make_token", "verify_token", "TokenError", "serve_in_thread", "serve_in_process",
           "RendezvousServer", "Limits"]
