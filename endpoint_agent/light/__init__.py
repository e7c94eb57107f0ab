"""The light agent: an endpoint agent whose tasks run in its own process (`engine: inline`).

Its service side is the normal agent's, part for part: the service session (registration
or its kept credential, heartbeats at `heartbeat_period`; endpoint_agent/service/), the
queue poller's long poll, the control poller, the outbox, and the interchange's own intake
and result batching, so the task and result packs, their acknowledgements, leases and the
results' seal are the same bytes. Only the execution differs: no interchange loop, manager
or worker process -- a thread pool shared by every light agent of the process
(pool.py) deserializes and calls the functions, with the worker's own code
(endpoint_agent/manager/worker.py). Parts: pool.py (the shared pool and function cache),
capture.py (stdout/stderr per task on threads), engine.py (one agent's tasks: intake,
dispatch to the pool, results, cancels, leases), agent.py (LightAgent, wiring and run).
Many of them in one process: endpoint_agent/fleet/.
"""
from endpoint_agent.light.agent import LightAgent
from endpoint_agent.light.pool import SharedPool, shared_pool

__all__ = ["LightAgent", "SharedPool", "shared_pool"]
