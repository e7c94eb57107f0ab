"""The endpoint's data side: the `data:` section of its config (config.py), the data plane
the agent runs from it (plane.py: the endpoint's Redis, stores file, object server), the
object server of the direct path (object_server.py, also `python -m
endpoint_agent.data.object_server`) and GlobusFile staging around tasks (staging.py).
Nothing is imported here, so each is loaded only when used: import the modules themselves.
"""
