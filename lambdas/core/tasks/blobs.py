"""The service's side of large arguments and results in S3 (skyfn.protocol.blobs).

Keys: `args/<namespace of the user>/<uuid>` for arguments a user uploaded,
`results/<endpoint id>/<task id>` for results an agent uploaded. Forms and URLs are
presigned with the service's own credentials; clients and agents hold none.
- POST /blobs gives a user a presigned POST for one new key under their prefix, capped at
  the size they declared (S3 refuses more: content-length-range);
- a submission may reference only keys under the caller's own prefix;
- each task pack carries a presigned POST for its endpoint's result prefix (cached per
  endpoint for a while, presigning costs a few hundred microseconds), and results that are
  references are accepted only at their own task's key under that endpoint's prefix;
- references are turned into presigned GET URLs when handed to the agent (payload) or to
  the submitter (result).
Presigning goes through skyfn.data.connectors.s3.S3Connector, the one S3 implementation
(the bytes themselves move through the same module's presigned mode, skyfn.protocol.blobs).
"""
from __future__ import annotations

import functools
import hashlib
import re
import threading
import time
import uuid
from typing import Any, Optional

from lambdas.config import settings
from lambdas.core.errors import Invalid
from skyfn.protocol import blobs

GET_SECONDS = 24 * 3600    # an argument may wait this long in a queue before the agent fetches it
RESULT_FORM_SECONDS = 24 * 3600
FORM_REUSE_SECONDS = 3600  # a cached result form is handed out while it has >= 23 h left
UPLOAD_SECONDS = 3600
_ARG_KEY = re.compile(r"^args/[0-9a-f]{16}/[0-9a-f-]{36}$")


class InvalidBlob(Invalid):
    code = "invalid_blob"


class BlobsDisabled(Invalid):
    code = "blobs_disabled"


def enabled() -> bool:
    return bool(settings().bucket)


@functools.lru_cache(maxsize=4)
def _connector(bucket: str):
    """The payload bucket through skyfn's one S3 implementation (skyfn.data.connectors.s3),
    keys at the bucket's root (args/..., results/...); it presigns with signature v4."""
    from skyfn.data.connectors.s3 import S3Connector

    return S3Connector(bucket, prefix="")


def _s3():
    return _connector(settings().bucket)


def namespace(user: str) -> str:
    return hashlib.sha256(user.encode()).hexdigest()[:16]


def create_upload(user: str, size: int) -> dict[str, Any]:
    if not enabled():
        raise BlobsDisabled(f"this deployment keeps no large data (SKYFN_BUCKET is not set): send at most "
                            f"{blobs.INLINE_BYTES} bytes inline, or ask its operator")
    key = f"args/{namespace(user)}/{uuid.uuid4()}"
    form = _s3().presign_upload(key, size, UPLOAD_SECONDS)
    return {"key": key, "url": form["url"], "fields": form["fields"], "max_bytes": size,
            "expires": time.time() + UPLOAD_SECONDS}


def check_payloads(user: str, tasks: list) -> None:
    """References in a submission must be keys the caller uploaded."""
    mine = f"args/{namespace(user)}/"
    for i, t in enumerate(tasks):
        if blobs.is_ref(t.payload):
            if not enabled():
                raise BlobsDisabled(f"tasks[{i}].payload is an S3 reference but this deployment keeps no large "
                                    "data (SKYFN_BUCKET is not set)")
            key = blobs.target(t.payload)
            if not _ARG_KEY.match(key) or not key.startswith(mine):
                raise InvalidBlob(f"tasks[{i}].payload references {key[:100]!r}, which is not an upload of yours: "
                                  "get an upload form from POST /blobs (the SDK does this by itself)")


def put_payload(user: str, text: str) -> str:
    """A payload the service made (a released dependent's arguments with its inputs' results,
    lambdas/core/tasks/dataflow.py) stored under the user's prefix; its reference."""
    key = f"args/{namespace(user)}/{uuid.uuid4()}"
    _s3().put(key, [text.encode()])
    return blobs.make_ref(key)


def input_url(result: Optional[str]) -> Optional[str]:
    """A presigned GET of a result in S3 that a dependent takes as input: it may wait in its
    endpoint's queue as long as an argument may."""
    if not blobs.is_ref(result) or not enabled():
        return None
    return _s3().presign_download(blobs.target(result), GET_SECONDS)


def payload_url(payload: str) -> Optional[str]:
    if not blobs.is_ref(payload):
        return None
    return _s3().presign_download(blobs.target(payload), GET_SECONDS)


_forms: dict[str, tuple[float, dict]] = {}
_forms_lock = threading.Lock()


def result_upload(endpoint_id: str) -> Optional[dict]:
    """A presigned POST for any key under results/<endpoint>/, or None without a bucket."""
    if not enabled():
        return None
    now = time.time()
    with _forms_lock:
        cached = _forms.get(endpoint_id)
        if cached and now - cached[0] < FORM_REUSE_SECONDS:
            return cached[1]
    prefix = f"results/{endpoint_id}/"
    form = _s3().presign_prefix_upload(prefix, blobs.MAX_BLOB_BYTES, RESULT_FORM_SECONDS)
    form = {"url": form["url"], "fields": form["fields"], "prefix": prefix}
    with _forms_lock:
        _forms[endpoint_id] = (now, form)
    return form


def bad_result(endpoint_id: str, task_id: str, result: Optional[str]) -> Optional[str]:
    """Why a result reference is refused (None if the result is inline or in its place)."""
    if not blobs.is_ref(result):
        return None
    key = blobs.target(result)
    if key != f"results/{endpoint_id}/{task_id}":
        return (f"the endpoint's agent sent a result stored at {key[:100]!r}, not at this task's place "
                f"results/{endpoint_id}/{task_id}: result refused")
    return None


def result_url(result: Optional[str]) -> Optional[str]:
    if not blobs.is_ref(result) or not enabled():
        return None
    return _s3().presign_download(blobs.target(result), UPLOAD_SECONDS)
