"""Server settings of the hot store, the same for the embedded runtime's redis-server
(infra/local/processes.py) and the ElastiCache parameter group (infra/aws/stacks/data.py).

A finished task's hash holds its events string (seven or more 'STATE@ts;' stamps, about
180 bytes) and its result. Redis's default keeps a hash compact (a listpack) only while
every value is at most 64 bytes, so each task became a hash table when it finished: about
1.6 KiB per task instead of 0.9 KiB. 512 bytes keeps ordinary tasks compact; a large result
still turns its own hash into a table.

maxmemory-policy noeviction: a full store refuses writes (the service answers 429 backlog
well before, lambdas/core/tasks/backlog.py) instead of evicting keys, which would silently
drop accepted tasks and their results. The embedded runtime's maxmemory comes from
SKYFN_REDIS_MAXMEMORY (unset: no limit, infra/local/processes.py); ElastiCache's is the
node's memory."""
from __future__ import annotations

PARAMETERS = {
    "hash-max-listpack-value": "512",
    "maxmemory-policy": "noeviction",
}


def server_args() -> list[str]:
    """The parameters as redis-server command-line options."""
    return [arg for name, value in PARAMETERS.items() for arg in (f"--{name}", value)]
