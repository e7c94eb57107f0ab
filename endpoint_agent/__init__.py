"""The skyfn endpoint agent: runs tasks from the service on this machine.

One agent process per endpoint holds the service link (registration, heartbeats), the
queue poller, the interchange and the result outbox; it starts one manager process,
which runs N worker processes. See DESIGN.md section 8 and docs/contracts.md.

Packages by role: `interchange` (the hub and its parts), `manager` (a node's manager and
its workers), `direct` (direct sessions), `data` (data plane, object server, staging),
`service` (the link to the service), `scaling`, `providers`, `containers`; the agent, its
CLI and config, and small shared modules (wire, task records, slots, paths) at the top
(endpoint_agent/README.md).

Programmatic use, without the service (queues given directly)::

    from endpoint_agent.agent import Agent
    from endpoint_agent.config import EndpointConfig
    agent = Agent("myep", EndpointConfig(workers=2), endpoint_id="ep-1",
                  task_queue=QueueDescriptor(...), results_queue=QueueDescriptor(...))
    agent.run()          # blocks until agent.stop() (any thread) or SIGTERM/SIGINT
"""
__version__ = "0.1.0"
