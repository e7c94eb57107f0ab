"""The receipt of a direct session's pack: what the interchange keeps instead of a queue
message's receipt (in `IxState.direct_packs`, endpoint_agent/interchange/state.py) so
that the pack's results go back to the SDK on the direct socket (server.py)."""
from __future__ import annotations


class DirectReceipt:
    """The receipt of a pack from a direct session (server.py): there is no queue message
    to acknowledge or lease; its results go back to `identity` on the direct socket too."""

    __slots__ = ("identity", "session", "functions")

    def __init__(self, identity: bytes, session: str, functions: dict[str, str]):
        self.identity = identity    # the SDK's routing identity on the direct socket
        self.session = session      # the session id (the token's sid)
        self.functions = functions  # task id -> function id (what the service records)
