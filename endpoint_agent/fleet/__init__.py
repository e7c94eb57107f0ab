"""A fleet host: one process running many light agents (endpoint_agent/light/), each a real
endpoint of the service -- its own registration and credential, heartbeats, queue long
polls and sealed result packs -- sharing one thread pool for their tasks. For benchmarks
and tests that need hundreds or thousands of endpoints on a few cores (issue 39).

`FleetHost` (host.py) is the Python API; `python -m endpoint_agent.fleet` (__main__.py)
runs one from the command line, with per-agent stop and start on its stdin.
"""
from endpoint_agent.fleet.host import FleetHost

__all__ = ["FleetHost"]
