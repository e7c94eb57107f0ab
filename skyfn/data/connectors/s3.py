"""S3 as a store, and the one implementation of moving bytes to and from S3 in skyfn.

Two ways in, one module:

- **credentialed** (`S3Connector`): boto3 with the caller's AWS credentials. `put/get/
  exists/evict` under `<prefix><key>` in `bucket`; objects above `multipart_bytes` go up
  and come down through boto3's transfer manager (multipart, `max_concurrency` parts in
  flight), smaller ones in a single request. The endpoint comes from `endpoint_url`, else
  the environment (`AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`: moto, MinIO), the region
  from `region`, else the environment. The service also presigns with it
  (`presign_upload`, `presign_prefix_upload`, `presign_download`).
- **presigned** (`upload_with_form`, `download_url`, defined in skyfn.protocol.blobs beside
  the blob references they move, which the wire contract must not import this package
  for): plain HTTPS with a presigned POST form or GET URL, no AWS credentials, no boto3 --
  what the SDK and the endpoint's workers use for large arguments and results.

Lifetimes: `put(..., ttl=)` stores the expiry (epoch seconds) in the object's metadata
(`x-amz-meta-skyfn-expires`); `get` and `exists` treat an object past it as gone and delete
it. Objects nobody reads again are removed by S3 itself through the lifecycle rules of
`lifecycle_rules()` (applied with `apply_lifecycle()`, or put the same rules in the bucket's
infrastructure code): each object with a TTL is tagged `skyfn-ttl-days=<d>`, d the smallest
of TTL_DAY_CLASSES (1, 7, 30) covering its TTL, and the rule for class d expires tagged
objects under the prefix d days after they were written; a last rule aborts incomplete
multipart uploads after a day. TTLs above 30 days get no tag (only the metadata check).

Nothing heavy is imported with this module: boto3 loads when an S3Connector is made,
requests when a presigned transfer runs.
"""
from __future__ import annotations

import io
import os
import time
from typing import Any, ClassVar, Optional, Sequence

from skyfn.protocol.blobs import download_url, upload_with_form

DEFAULT_PREFIX = "skyfn/d/"
MULTIPART_BYTES = 64 << 20     # above this: multipart upload, ranged parallel download
PART_BYTES = 16 << 20
EXPIRES_META = "skyfn-expires"  # x-amz-meta-skyfn-expires: epoch seconds
TTL_TAG = "skyfn-ttl-days"
TTL_DAY_CLASSES = (1, 7, 30)


# --- helpers for the credentialed connector ------------------------------------------------

class _Positioned(io.RawIOBase):
    """A seekable file of `size` bytes at `pos` (never before the start)."""

    size = pos = 0

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos


class _FramesReader(_Positioned):
    """A seekable read-only file over a list of buffers, so a multipart upload reads each
    part straight from the encoder's frames (no joined copy of the whole object)."""

    def __init__(self, frames: Sequence):
        self.views = [memoryview(f).cast("B") for f in frames]
        self.starts, pos = [], 0
        for v in self.views:
            self.starts.append(pos)
            pos += v.nbytes
        self.size, self.pos = pos, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        out = memoryview(b).cast("B")
        n = 0
        for start, v in zip(self.starts, self.views):
            end = start + v.nbytes
            if end <= self.pos or n >= out.nbytes:
                continue
            off = self.pos - start
            take = min(v.nbytes - off, out.nbytes - n)
            out[n:n + take] = v[off:off + take]
            n += take
            self.pos += take
        return n


class _BufferWriter(_Positioned):
    """A seekable write-only file over a preallocated bytearray (ranged parts land in place)."""

    def __init__(self, size: int):
        self.buf = bytearray(size)
        self.view = memoryview(self.buf)
        self.size, self.pos = size, 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        data = memoryview(b).cast("B")
        self.view[self.pos:self.pos + data.nbytes] = data
        self.pos += data.nbytes
        return data.nbytes


def ttl_days_class(ttl: float) -> Optional[int]:
    """The lifecycle class (days) covering a TTL in seconds, or None above the largest."""
    days = ttl / 86400.0
    for d in TTL_DAY_CLASSES:
        if days <= d:
            return d
    return None


class S3Connector:
    """A bucket (and key prefix) as a store; see the module docstring."""

    kind: ClassVar[str] = "s3"

    def __init__(self, bucket: str, prefix: str = DEFAULT_PREFIX, *, endpoint_url: Optional[str] = None,
                 region: Optional[str] = None, multipart_bytes: int = MULTIPART_BYTES, part_bytes: int = PART_BYTES,
                 max_concurrency: int = 8):
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        if not bucket:
            from skyfn.data.errors import DataConfigError

            raise DataConfigError("the s3 connector needs a bucket name (bucket: ...)")
        self.bucket, self.prefix = bucket, prefix or ""
        self.endpoint_url = endpoint_url
        self.region = region
        self.multipart_bytes, self.part_bytes = int(multipart_bytes), max(5 << 20, int(part_bytes))
        self.max_concurrency = int(max_concurrency)
        endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
        # Signature version 4: what every region accepts for forms and URLs.
        self.client = boto3.client(
            "s3", endpoint_url=endpoint, region_name=region,
            config=Config(signature_version="s3v4", retries={"max_attempts": 5, "mode": "standard"},
                          max_pool_connections=max(10, self.max_concurrency + 2)))
        self.transfer = TransferConfig(multipart_threshold=self.multipart_bytes, multipart_chunksize=self.part_bytes,
                                       max_concurrency=self.max_concurrency, use_threads=self.max_concurrency > 1)

    def _k(self, key: str) -> str:
        return self.prefix + key

    # --- the Connector protocol ---------------------------------------------------------
    def put(self, key: str, frames: Sequence, ttl: Optional[float] = None) -> None:
        extra: dict[str, Any] = {}
        if ttl is not None:
            extra["Metadata"] = {EXPIRES_META: f"{time.time() + ttl:.3f}"}
            days = ttl_days_class(ttl)
            if days is not None:
                extra["Tagging"] = f"{TTL_TAG}={days}"
        reader = _FramesReader(frames)
        if reader.size <= self.multipart_bytes:
            body = bytes(reader.views[0]) if len(reader.views) == 1 else b"".join(reader.views)
            self.client.put_object(Bucket=self.bucket, Key=self._k(key), Body=body, **extra)
        else:
            self.client.upload_fileobj(reader, self.bucket, self._k(key), ExtraArgs=extra or None,
                                       Config=self.transfer)

    def _expired(self, meta: dict) -> bool:
        stamp = (meta or {}).get(EXPIRES_META)
        return stamp is not None and time.time() > float(stamp)

    def get(self, key: str):
        k = self._k(key)
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=k)
        except self.client.exceptions.NoSuchKey:
            return None
        if self._expired(resp.get("Metadata")):
            resp["Body"].close()
            self.evict(key)
            return None
        size = resp["ContentLength"]
        if size <= self.multipart_bytes:
            with resp["Body"] as body:  # botocore's stream (it checks the checksum S3 sent)
                return body.read()
        resp["Body"].close()  # large: ranged parts in parallel, each written in place
        out = _BufferWriter(size)
        self.client.download_fileobj(self.bucket, k, out, Config=self.transfer)
        return out.buf

    def exists(self, key: str) -> bool:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._k(key))
        except self.client.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        if self._expired(head.get("Metadata")):
            self.evict(key)
            return False
        return True

    def evict(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._k(key))  # S3: deleting a missing key succeeds

    def config(self) -> dict:
        cfg = {"kind": self.kind, "bucket": self.bucket, "prefix": self.prefix,
               "multipart_bytes": self.multipart_bytes, "part_bytes": self.part_bytes,
               "max_concurrency": self.max_concurrency}
        if self.endpoint_url:
            cfg["endpoint_url"] = self.endpoint_url
        if self.region:
            cfg["region"] = self.region
        return cfg

    @classmethod
    def from_config(cls, config: dict) -> "S3Connector":
        return cls(**config)

    def close(self) -> None:
        self.client.close()

    # --- lifetimes --------------------------------------------------------------------------
    def lifecycle_rules(self) -> list[dict]:
        """S3 lifecycle rules that remove expired objects nobody reads (see the module doc)."""
        rules = [{"ID": f"skyfn-ttl-{d}d", "Status": "Enabled", "Expiration": {"Days": d},
                  "Filter": {"And": {"Prefix": self.prefix, "Tags": [{"Key": TTL_TAG, "Value": str(d)}]}}}
                 for d in TTL_DAY_CLASSES]
        rules.append({"ID": "skyfn-abort-incomplete-multipart", "Status": "Enabled",
                      "Filter": {"Prefix": self.prefix}, "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}})
        return rules

    def apply_lifecycle(self) -> None:
        """Merge lifecycle_rules() into the bucket's lifecycle configuration (rules with other IDs kept)."""
        try:
            current = self.client.get_bucket_lifecycle_configuration(Bucket=self.bucket).get("Rules", [])
        except self.client.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "NoSuchLifecycleConfiguration":
                raise
            current = []
        ours = self.lifecycle_rules()
        ids = {r["ID"] for r in ours}
        rules = [r for r in current if r.get("ID") not in ids] + ours
        self.client.put_bucket_lifecycle_configuration(Bucket=self.bucket, LifecycleConfiguration={"Rules": rules})

    # --- presigning (the service's side of skyfn.protocol.blobs) ------------------------------
    def presign_upload(self, key: str, max_bytes: int, expires: float) -> dict:
        """A presigned POST {url, fields} for exactly `<prefix><key>`, 1..max_bytes bytes."""
        form = self.client.generate_presigned_post(self.bucket, self._k(key),
                                                   Conditions=[["content-length-range", 1, int(max_bytes)]],
                                                   ExpiresIn=int(expires))
        return {"url": form["url"], "fields": form["fields"]}

    def presign_prefix_upload(self, prefix: str, max_bytes: int, expires: float) -> dict:
        """A presigned POST {url, fields} for any key under `<prefix><prefix arg>` (the uploader
        sets fields['key']), 1..max_bytes bytes."""
        full = self._k(prefix)
        form = self.client.generate_presigned_post(self.bucket, full + "${filename}",
                                                   Conditions=[["starts-with", "$key", full],
                                                               ["content-length-range", 1, int(max_bytes)]],
                                                   ExpiresIn=int(expires))
        return {"url": form["url"], "fields": form["fields"]}

    def presign_download(self, key: str, expires: float) -> str:
        """A presigned GET URL for `<prefix><key>`."""
        return self.client.generate_presigned_url("get_object", Params={"Bucket": self.bucket, "Key": self._k(key)},
                                                  ExpiresIn=int(expires))


__all__ = ["S3Connector", "upload_with_form", "download_url", "ttl_days_class", "DEFAULT_PREFIX"]
