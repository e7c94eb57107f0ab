"""The embedded single-machine deployment: redis-server, moto in server mode, and a
local gateway that serves the Lambda handlers in process.

This package holds the runtime's life (up, down, status, recover, snapshot of moto's
state, the processes and files it starts and keeps, the agent, the service process);
the stand-ins of the cloud services it runs the handlers on are infra/local/standins.
"""
