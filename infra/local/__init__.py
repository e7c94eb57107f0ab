"""The embedded single-machine deployment: redis-server, moto in server mode, and a
local gateway that serves the Lambda handlers in process."""
