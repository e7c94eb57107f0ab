"""SPMD step: create the group id, its rendezvous token (signed with the rendezvous
secret) and one item per rank carrying rank, world_size and the rendezvous address."""
from __future__ import annotations

from typing import Any

from lambdas.core.runs import steps


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return steps.spmd_init(event)
