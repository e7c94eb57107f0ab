"""The object channel's wire contract: what the direct connector (the consumer,
skyfn/data/connectors/direct.py) and an endpoint's object server (the producer's agent,
endpoint_agent/data/object_server.py) say to each other (DESIGN.md section 6).

Both reach the rendezvous server with a group token: minted from the rendezvous secret in
SECRET_ENV when a process has it (it admits any name), else a token made for one listener
name, in TOKEN_ENV. The object server LISTENs under its name; a consumer CALLs that name and
both join the fresh 2-rank group the server makes, punched through their NATs (or relayed).

Channel protocol (comm tags; rank 0 the object server, rank 1 the consumer):
  tag 1  consumer -> server  JSON {"v": 1, "op": "get"|"exists"|"evict", "store", "key", "cap", "user", "evict"}
  tag 2  server -> consumer  JSON {"ok": true, "size": n} | {"ok": true, "exists": bool} | {"ok": true, "evicted": bool}
                                  | {"ok": false, "code": "denied"|"missing"|"invalid"|"busy", "reason": ...}
  tag 3  server -> consumer  the object's bytes (after an ok reply to "get")

A request whose "v" is not PROTOCOL_VERSION is answered "invalid". The server closes a
channel idle for its timeout (120 s by default) and answers "busy", then closes the channel,
when it already serves as many consumers as it may.
"""
from __future__ import annotations

TOKEN_ENV = "SKYFN_DIRECT_TOKEN"             # a rendezvous token for one listener name
SECRET_ENV = "SKYFN_RENDEZVOUS_SECRET"       # the rendezvous server's secret (mints a token for any name)
TAG_REQUEST, TAG_REPLY, TAG_DATA = 1, 2, 3   # comm tags of the request, the reply, the object's bytes
PROTOCOL_VERSION = 1                         # "v" of every request

OPS = ("get", "exists", "evict")
ERROR_CODES = ("denied", "missing", "invalid", "busy")

__all__ = ["TOKEN_ENV", "SECRET_ENV", "TAG_REQUEST", "TAG_REPLY", "TAG_DATA", "PROTOCOL_VERSION", "OPS",
           "ERROR_CODES"]
