"""Large arguments and results through S3 instead of inline (no 10 MB ceiling).

A buffer larger than INLINE_BYTES travels as a *reference*: the text "blob 1\\n" followed
by where the bytes are -- an object key while it moves through the service, a presigned
URL when it is handed to whoever must read it. Nobody but the service signs anything:

- arguments: the SDK asks the service for an upload form (POST /blobs: a presigned S3 POST
  for one key under the caller's prefix, with the size it declared as a ceiling), uploads,
  and submits the reference; the service checks the key is the caller's and gives the
  agent a presigned GET URL in the task spec (TaskSpec.payload_url);
- results: each task pack carries a presigned POST for the endpoint's result prefix
  (TaskPack.result_upload); the agent uploads a large result there and sends the
  reference; the service accepts only the key of that task under that endpoint's prefix
  and hands the submitter a presigned GET URL with the status (TaskStatus.result_url).

The bytes move through the presigned transfers below (`upload_with_form`, `download_url`:
plain HTTPS, no AWS credentials needed on either side, requests imported only when one
runs), which skyfn.data.connectors.s3 offers as its presigned mode; the service presigns
with that module's S3Connector (lambdas/core/tasks/blobs.py). Workers use these helpers.
The API bodies are in skyfn.protocol.security.
"""
from __future__ import annotations

from typing import Any, Optional

HEADER = "blob 1\n"
INLINE_BYTES = 256 << 10          # above this a buffer goes through S3
MAX_BLOB_BYTES = 5 << 30          # S3's single-PUT/POST ceiling
TIMEOUT = 300.0


def is_ref(buffer: Any) -> bool:
    return isinstance(buffer, str) and buffer.startswith(HEADER)


def make_ref(target: str) -> str:
    return HEADER + target


def target(buffer: str) -> str:
    return buffer[len(HEADER):]


def upload(form: dict, data: bytes, key: Optional[str] = None, timeout: float = TIMEOUT) -> str:
    """POST `data` with a presigned form (url, fields); returns the key it was stored at.
    A form for a prefix (fields key '<prefix>/${filename}') stores at `key`."""
    return upload_with_form(form, data, key=key, timeout=timeout)


def download(url: str, timeout: float = TIMEOUT) -> str:
    return download_url(url, timeout=timeout).decode("utf-8")


# --- presigned transfers: no credentials, no boto3 ---------------------------------------

def upload_with_form(form: dict, data: Any, key: Optional[str] = None, timeout: float = TIMEOUT) -> str:
    """POST `data` (bytes-like, or a sequence of frames) with a presigned form {url, fields};
    returns the key it was stored at. A form for a prefix (fields key '<prefix>${filename}')
    stores at `key`. S3 enforces the form's conditions (size range, key prefix, expiry)."""
    import requests

    fields = dict(form["fields"])
    if key is not None:
        fields["key"] = key
    if isinstance(data, (list, tuple)):
        data = b"".join(data)
    resp = requests.post(form["url"], data=fields, files={"file": ("blob", data)}, timeout=timeout)
    if resp.status_code >= 300:
        raise OSError(f"upload to S3 refused with {resp.status_code}: {resp.text[:300]}")
    return fields["key"]


def download_url(url: str, timeout: float = TIMEOUT) -> bytes:
    """The bytes behind a presigned GET URL."""
    import requests

    resp = requests.get(url, timeout=timeout)
    if resp.status_code != 200:
        raise OSError(f"download from S3 refused with {resp.status_code}: {resp.text[:300]}")
    return resp.content
