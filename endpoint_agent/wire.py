"""The agent's internal wire: frames between interchange, manager and workers.

Every message is ZeroMQ multipart ``[op, body]`` (after the routing identity on ROUTER
sockets); bodies are orjson. Tasks are addressed by an integer *key* the interchange
assigns on receipt, so a task id that arrives twice (a redelivered pack) never clashes.

interchange -> manager
  TASKS   {"f": {function_id: body}, "t": [[key, function_id, payload, walltime], ...]}
          function bodies are sent once per manager, the first time one of its tasks goes
  STOP    finish nothing more: stop workers and exit
manager -> interchange
  REG     {"pid", "workers", "capacity"}         first message of a manager
  REQ     n                                        credit: send me up to n more tasks
  RES     [[key, state, result, error, start, done], ...]
  RUN     [[key, start_ts], ...]                   running for a while without a result
  LOST    [[key, kind, reason], ...]              kind "died" | "timeout"
  HB      {"workers": [pid, ...], "backlog": n, "running": n}
manager -> worker:   TASKS (same body, functions the worker has not seen), STOP
worker  -> manager:  READY {"pid"}; RES (as above, in the order tasks were given)
"""
from __future__ import annotations

import orjson

TASKS = b"T"
STOP = b"S"
REG = b"G"
REQ = b"Q"
RES = b"R"
RUN = b"U"
LOST = b"L"
HB = b"H"
READY = b"Y"

dumps = orjson.dumps
loads = orjson.loads
