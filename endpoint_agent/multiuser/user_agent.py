"""A user agent: the process a multi-user endpoint starts as a mapped account.

    python -m endpoint_agent.multiuser.user_agent      (as the account; config on stdin)

It is an ordinary skyfn agent (endpoint_agent.agent.Agent) whose queues are not the
service's: the privileged process writes one JSON document on its stdin, `{"name": ...,
"config": {...}}`, the user's rendered config with the queues the router made for this
user agent (task, results and control streams in the router's Redis, reached with this
agent's own ACL user) and its endpoint id, then closes it. Nothing reaches the process
through its command line or a file the privileged process wrote (the queue password is a
secret). With a lane (skyfn.protocol.lanes) the document also holds `lane`: the agent's task
and results queues are then the service's lane queue and results queue, its results go
sealed, and audit copies go to its stream in the router's Redis (multiuser/lane.py). The
agent's directory is `$SKYFN_HOME/endpoints/<name>/`, under the account's
working directory: its data Redis, stores file and secrets are the account's own (0600
files in 0700 directories). It logs to stderr, which the privileged process keeps.
SIGTERM stops it gracefully, as any agent.
"""
from __future__ import annotations

import json
import logging
import sys

from endpoint_agent.agent import Agent
from endpoint_agent.config import parse_config
from endpoint_agent.errors import ConfigError
from endpoint_agent.paths import EndpointPaths


def lane_wrapper(lane: dict, lease_seconds: float):
    """The queue wrapper of a user agent with a lane (endpoint_agent/multiuser/lane.py)."""
    from endpoint_agent.multiuser.lane import LaneAcks, LaneControl, LaneResults, LaneTasks, Ledger, SeenMark
    from skyfn.protocol.api import QueueDescriptor
    from skyfn.protocol.queues import open_queue

    ledger = Ledger()
    audit_desc = QueueDescriptor.model_validate(lane["audit_queue"])

    def audit_queue():
        return open_queue(audit_desc, consumer="user-agent", visibility_timeout=lease_seconds)

    def wrap(kind: str, queue):
        seen = SeenMark(audit_desc.url, lane["seen_key"]) if lane.get("seen_key") and kind in ("tasks", "acks") \
            else None
        if kind == "tasks":
            return LaneTasks(queue, ledger, seen)
        if kind == "acks":  # what the outbox deletes with: only what the endpoint has read
            return LaneAcks(queue, seen)
        if kind == "results":
            return LaneResults(queue, lane=lane["lane"], mac_key=lane["mac_key"], endpoint_id=lane["endpoint_id"],
                               ledger=ledger, audit=audit_queue())
        if kind == "control":
            return LaneControl(queue, ledger=ledger, audit=audit_queue())
        return queue

    return wrap


def main() -> int:
    try:
        doc = json.loads(sys.stdin.read())
        name, data, lane = doc["name"], doc["config"], doc.get("lane")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        print(f"user agent: expected {{\"name\", \"config\"}} as JSON on stdin ({exc})", file=sys.stderr)
        return 2
    try:
        config = parse_config(data, f"the user config of {name}")
    except ConfigError as exc:
        print(f"user agent {name}: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.log_level, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s {name} %(name)s[%(process)d]: %(message)s")
    paths = EndpointPaths(name).ensure()
    wrapper = lane_wrapper(lane, config.lease_seconds) if lane else None
    return Agent(name, config, paths=paths, queue_wrapper=wrapper).run()


if __name__ == "__main__":
    sys.exit(main())
