"""Batch fan-out step: route and enqueue one staged chunk of a batch (the Distributed
Map's item processor). Raises EndpointOffline / NotFound for a chunk that cannot be
routed; the state machine's Catch then records it (batch_progress, action chunk_failed)."""
from __future__ import annotations

from typing import Any

from lambdas.core.runs import batches


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return batches.route_chunk(event)
