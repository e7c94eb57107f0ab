"""The interchange: the agent's hub between the service's queues and its managers.

`Interchange` (interchange.py) owns the sockets and the loop; its parts, one job each,
share its state (`IxState`, state.py): the intake of task packs and cancels (intake.py),
the manager registry and supervision (managers.py), dispatch to managers (dispatch.py),
result batching to the outbox (results.py), and, with a `placement_policy`, manager
placement by an aAPP policy (placement.py). This package exports what the rest of the
agent uses.
"""
from endpoint_agent.interchange.interchange import Interchange, ensure_server_keys
from endpoint_agent.interchange.intake import EARLY_CANCEL_TTL_S
from endpoint_agent.interchange.state import LOCAL_BLOCK, PLAIN, IxState, ManagerHandle

__all__ = ["Interchange", "ensure_server_keys", "IxState", "ManagerHandle", "LOCAL_BLOCK", "PLAIN",
           "EARLY_CANCEL_TTL_S"]
