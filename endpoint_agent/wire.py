"""The agent's internal wire: frames between interchange, manager and workers.

Every message is ZeroMQ multipart ``[op, body]`` (after the routing identity on ROUTER
sockets); bodies are orjson. Tasks are addressed by an integer *key* the interchange
assigns on receipt, so a task id that arrives twice (a redelivered pack) never clashes;
keys start from a per-interchange epoch, so a stale manager's key never names a new task.

The manager command line (stable: providers and launchers run exactly this on nodes)
----------------------------------------------------------------------------------
    python -m endpoint_agent.manager --interchange tcp://HOST:PORT --block BLOCK_ID --workers N
        [--server-key Z85]        interchange's CurveZMQ public key (or env SKYFN_SERVER_KEY);
                                  required when the interchange encrypts (non-loopback default)
        [--identity ID]           default: <hostname>-<pid>-<random>
        [--prefetch P]            tasks held beyond the workers (default 2 * N)
        [--heartbeat S]           heartbeat period in seconds (default 2; the interchange's
                                  manager_heartbeat_period is what it expects)
        [--cores C]               cores of this node to share out (default max(CPUs, N))
        [--accelerators 0,1,...]  accelerator ids (default: CUDA_VISIBLE_DEVICES, else none)
        [--containers JSON]       container settings (endpoint_agent.containers), optional
        [--max-output BYTES]      stdout/stderr capture cap per stream (default 65536)
        [--parent PID]            die with this process (local managers of the agent)
        [--log-level LEVEL]
The manager exits when told to (STOP/DRAIN), when its parent dies (with --parent), or
when the interchange has been silent for max(10 s, 5 heartbeat periods).

interchange -> manager
  TASKS   {"f": {function_id: body}, "t": [task, ...]}
          task = [key, function_id, payload, walltime, container|None, cores, gpus]
          function bodies are sent once per manager, the first time one of its tasks goes
  CANCEL  [key, ...]     drop if queued, kill the worker if running (no result is sent)
  DRAIN   b""            take nothing more, give back the unstarted, finish, say BYE, exit
  STOP    b""            stop workers and exit now
  HB      b""            answer to a manager's heartbeat (the manager's liveness check)
manager -> interchange
  REG     {"pid", "hostname", "block", "workers", "capacity", "cores", "accelerators",
           "warm": {type: idle}, "containers": {type: n}, "cold_starts"}   first message
  REQ     n                                        credit: send me up to n more tasks
  RES     [[key, state, result, error, start, done, stdout, stderr], ...]
  RUN     [[key, start_ts], ...]                   running for a while without a result
  LOST    [[key, kind, reason], ...]   kind "died" | "timeout" | "fail" (final, no retry)
  BACK    [key, ...]                   given back unstarted (draining): re-dispatch, no charge
  HB      {"running": [key, ...], "free": n, "backlog": n, "warm": {...}, "containers": {...},
           "cold_starts": n, "workers": [pid, ...]}       every heartbeat period and on change
  BYE     b""                          drained: nothing held, exiting
manager -> worker:   TASKS {"f": ..., "t": [[key, function_id, payload, walltime, env], ...]}
                     (env: None or {"CUDA_VISIBLE_DEVICES": ..., "OMP_NUM_THREADS": ...}), STOP
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
CANCEL = b"C"
DRAIN = b"D"
BACK = b"B"
BYE = b"X"

# task fields on the interchange -> manager wire
K_KEY, K_FN, K_PAYLOAD, K_WALL, K_CONTAINER, K_CORES, K_GPUS = range(7)

NO_CONTAINER = "none"

dumps = orjson.dumps
loads = orjson.loads
