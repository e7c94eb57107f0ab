"""Results too large to travel inline go to S3 (skyfn.protocol.blobs): the agent uploads
them with the presigned form its task packs carry, at `results/<endpoint>/<task id>`,
and sends a reference instead. The service accepts a reference only at that key."""
from __future__ import annotations

import logging
from typing import Optional

from skyfn.protocol import blobs
from skyfn.protocol.limits import MAX_INLINE_RESULT_BYTES

log = logging.getLogger("skyfn.agent.blobs")


def offload(form: Optional[dict], task_id: str, result: str) -> tuple[bool, str]:
    """(True, reference) once stored; (False, reason) if it cannot be.
    Small results, or no form (a deployment without a bucket): (True, result) unchanged,
    up to the service's cap on inline results (MAX_INLINE_RESULT_BYTES) -- above it, without
    a form, (False, reason naming the cap), as the service would refuse it."""
    if len(result) <= blobs.INLINE_BYTES:
        return True, result
    if not form:
        if len(result) > MAX_INLINE_RESULT_BYTES:
            return False, (f"the result is {len(result)} bytes, above the cap of {MAX_INLINE_RESULT_BYTES} bytes on "
                           "inline results (MAX_INLINE_RESULT_BYTES), and this deployment has no bucket for large "
                           "results (SKYFN_BUCKET)")
        return True, result
    key = f"{form['prefix']}{task_id}"
    try:
        blobs.upload(form, result.encode("utf-8"), key=key)
    except Exception as exc:  # noqa: BLE001 - the task fails with the reason, the agent runs on
        log.warning("storing the %d-byte result of task %s in S3 failed: %s", len(result), task_id, exc)
        return False, f"the result ({len(result)} bytes) could not be stored in S3: {exc}"[:2000]
    return True, blobs.make_ref(key)
