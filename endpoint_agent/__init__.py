"""The skyfn endpoint agent: runs tasks from the service on this machine.

One agent process per endpoint holds the service link (registration, heartbeats), the
queue poller, the interchange and the result outbox; it starts one manager process,
which runs N worker processes. See DESIGN.md section 8 and docs/contracts.md.

Programmatic use, without the service (queues given directly)::

    from endpoint_agent.agent import Agent
    from endpoint_agent.config import EndpointConfig
    agent = Agent("myep", EndpointConfig(workers=2), endpoint_id="ep-1",
                  task_queue=QueueDescriptor(...), results_queue=QueueDescriptor(...))
    agent.run()          # blocks until agent.stop() (any thread) or SIGTERM/SIGINT
"""
__version__ = "0.1.0"
