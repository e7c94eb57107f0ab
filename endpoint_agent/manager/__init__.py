"""The manager and its workers: the processes that run tasks on a node.

A manager (`python -m endpoint_agent.manager`, manager.py) connects to the interchange,
takes tasks by credit and runs them in a pool of worker processes (`python -m
endpoint_agent.manager.worker`, worker.py), optionally in containers. Its parts share its
state (`ManagerState`, state.py): worker supervision (workers.py), dispatch inside the node
(dispatch.py), result sending (results.py) and the container settings (containers.py).
Nothing is imported here, so that a worker process starts without loading the manager:
import the modules themselves.
"""
