"""Keeps the embedded runtime's AWS state across restarts. moto holds DynamoDB tables and
S3 buckets in memory, so a restarted moto starts empty; yet the registry (functions,
endpoints, groups, shares, endpoint credentials), the submission records and the task
history live in DynamoDB, and large payloads in S3. `skyfn local down` saves them to
`$SKYFN_HOME/local/moto/snapshot/` before it stops moto; `skyfn local up` loads them
into the new moto before the service starts.

Format: `tables.json` (each table's key schema, attribute definitions and global
secondary indexes), one `<table>.jsonl` of items in DynamoDB's typed JSON (binary values
base64) per table, and `s3/manifest.json` mapping bucket/key to a file under `s3/`. A
snapshot is written to a temporary directory and renamed into place, so a crash while
saving leaves the previous snapshot whole. Step Functions definitions are not saved: the
service deploys them again when it starts; running executions are lost with moto.

Reading the items: not with Scan. moto's Scan sorts the whole table and walks it from
the start up to ExclusiveStartKey on every 1 MB page, and serializes each item slowly,
so a Scan of the task history is quadratic (300,000 items: over 10 minutes). A table is
read with ExportTableToPointInTime instead: moto writes every item once, in DynamoDB
JSON, gzipped, to an S3 object in a bucket of our own (made for the save, removed after
it), and we stream that object back. Point-in-time recovery, which an export requires,
is switched on for the export and back off after it. Where the export is unavailable or
fails (another AWS stand-in), the table is read with Scan as before (slow, but whole).
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

log = logging.getLogger("skyfn.snapshot")
_EXPORT_BUCKET_PREFIX = "skyfn-snapshot-export-"  # the save's own bucket; never saved itself
_EXPORT_TIMEOUT = float(os.environ.get("SKYFN_SNAPSHOT_EXPORT_TIMEOUT", "900"))
_CONFIG = Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=5, read_timeout=60)


def _clients(aws_url: str):
    kw = dict(endpoint_url=aws_url, region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
              aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "skyfn-local"),
              aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "skyfn-local"), config=_CONFIG)
    return boto3.client("dynamodb", **kw), boto3.client("s3", **kw)


def _encode(value: Any) -> Any:
    """DynamoDB typed JSON with bytes as base64 (B, BS), recursively (M, L)."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "B":
                out[k] = base64.b64encode(v).decode()
            elif k == "BS":
                out[k] = [base64.b64encode(b).decode() for b in v]
            else:
                out[k] = _encode(v)
        return out
    if isinstance(value, list):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "B":
                out[k] = base64.b64decode(v)
            elif k == "BS":
                out[k] = [base64.b64decode(b) for b in v]
            else:
                out[k] = _decode(v)
        return out
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def save(aws_url: str, directory: Path, *, method: str = "export", scan_limit: int | None = None) -> dict[str, int]:
    """Save every DynamoDB table and S3 bucket of `aws_url`; returns counts (tables,
    items, objects, and scanned_tables: how many were read with Scan, not exported).
    `method` "scan" reads every table with Scan (pages of `scan_limit` items if given)."""
    if method not in ("export", "scan"):
        raise ValueError(f"snapshot.save: method must be 'export' or 'scan', not {method!r}")
    ddb, s3 = _clients(aws_url)
    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "s3").mkdir(parents=True)
    counts = {"tables": 0, "items": 0, "objects": 0, "scanned_tables": 0}
    specs = []
    tables = [ddb.describe_table(TableName=name)["Table"]
              for page in ddb.get_paginator("list_tables").paginate() for name in page["TableNames"]]
    exporter = _Exporter(ddb, s3) if tables and method == "export" else None
    try:
        for t in tables:
            name = t["TableName"]
            specs.append({"TableName": name, "KeySchema": t["KeySchema"],
                          "AttributeDefinitions": t["AttributeDefinitions"],
                          "GlobalSecondaryIndexes": [{"IndexName": g["IndexName"], "KeySchema": g["KeySchema"],
                                                      "Projection": g["Projection"]}
                                                     for g in t.get("GlobalSecondaryIndexes", [])]})
            with open(tmp / f"{name}.jsonl", "w") as f:
                n = exporter.export(t, f) if exporter is not None else None
                if n is None:  # no export: Scan (quadratic under moto, but whole)
                    f.seek(0)
                    f.truncate()
                    n = _scan(ddb, name, f, scan_limit)
                    counts["scanned_tables"] += 1
            counts["items"] += n
            counts["tables"] += 1
    finally:
        if exporter is not None:
            exporter.close()
    (tmp / "tables.json").write_text(json.dumps(specs, indent=1))
    manifest = []
    for bucket in s3.list_buckets().get("Buckets", []):
        name = bucket["Name"]
        if name.startswith(_EXPORT_BUCKET_PREFIX):
            continue
        manifest.append({"bucket": name, "objects": []})
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
            for obj in page.get("Contents", []):
                file = hashlib.sha256(f"{name}/{obj['Key']}".encode()).hexdigest()
                body = s3.get_object(Bucket=name, Key=obj["Key"])["Body"].read()
                (tmp / "s3" / file).write_bytes(body)
                manifest[-1]["objects"].append({"key": obj["Key"], "file": file})
                counts["objects"] += 1
    (tmp / "s3" / "manifest.json").write_text(json.dumps(manifest))
    old = directory.with_name(directory.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        directory.rename(old)
    tmp.rename(directory)
    shutil.rmtree(old, ignore_errors=True)
    return counts


def _scan(ddb, table: str, out, limit: int | None = None) -> int:
    """Every item of `table` with Scan, one typed-JSON line each; returns the count."""
    n = 0
    kw: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
    if limit:
        kw["PaginationConfig"] = {"PageSize": limit}
    for page in ddb.get_paginator("scan").paginate(**kw):
        for item in page["Items"]:
            out.write(json.dumps(_encode(item)) + "\n")
            n += 1
    return n


class _Exporter:
    """Reads tables with ExportTableToPointInTime into a bucket made for this save (see
    the module docstring). export() returns None where the export is unavailable or
    fails, so that the caller scans that table instead."""

    def __init__(self, ddb, s3):
        self.ddb, self.s3 = ddb, s3
        self.bucket: str | None = None

    def _make_bucket(self) -> str:
        name = _EXPORT_BUCKET_PREFIX + uuid.uuid4().hex[:12]
        region = self.s3.meta.region_name
        kw = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
        self.s3.create_bucket(Bucket=name, **kw)
        self.bucket = name
        return name

    def export(self, table: dict, out) -> int | None:
        name = table["TableName"]
        try:
            bucket = self.bucket or self._make_bucket()
            pitr = (self.ddb.describe_continuous_backups(TableName=name)["ContinuousBackupsDescription"]
                    .get("PointInTimeRecoveryDescription", {}).get("PointInTimeRecoveryStatus"))
            if pitr != "ENABLED":
                self.ddb.update_continuous_backups(
                    TableName=name, PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True})
            try:
                return self._export(name, table["TableArn"], bucket, out)
            finally:
                if pitr != "ENABLED":
                    self.ddb.update_continuous_backups(
                        TableName=name, PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": False})
        except (ClientError, BotoCoreError, _ExportFailed) as exc:
            log.warning("table %s: no export (%s: %s); reading it with Scan, which is slow on a large table",
                        name, type(exc).__name__, exc)
            return None

    def _export(self, name: str, arn: str, bucket: str, out) -> int:
        prefix = f"{name}/{uuid.uuid4().hex}"
        desc = self.ddb.export_table_to_point_in_time(TableArn=arn, S3Bucket=bucket, S3Prefix=prefix,
                                                      ExportFormat="DYNAMODB_JSON")["ExportDescription"]
        deadline, pause = time.monotonic() + _EXPORT_TIMEOUT, 0.02
        while desc["ExportStatus"] == "IN_PROGRESS":
            if time.monotonic() > deadline:
                raise _ExportFailed(f"the export of table {name} was still in progress after {_EXPORT_TIMEOUT:.0f} s "
                                    "(raise SKYFN_SNAPSHOT_EXPORT_TIMEOUT for a very large table)")
            time.sleep(pause)
            pause = min(pause * 2, 0.5)
            desc = self.ddb.describe_export(ExportArn=desc["ExportArn"])["ExportDescription"]
        if desc["ExportStatus"] != "COMPLETED":
            raise _ExportFailed(f"the export of table {name} ended {desc['ExportStatus']}: "
                                f"{desc.get('FailureCode')} {desc.get('FailureMessage')}")
        n = 0
        keys = [o["Key"] for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
                for o in page.get("Contents", [])]
        for key in keys:
            if "/data/" in key:
                body = self.s3.get_object(Bucket=bucket, Key=key)["Body"]
                with gzip.GzipFile(fileobj=body) as lines:
                    for line in lines:
                        if line.strip():  # {"Item": {attribute: {type: value}}}, binary values base64
                            out.write(json.dumps(json.loads(line)["Item"]) + "\n")
                            n += 1
            self.s3.delete_object(Bucket=bucket, Key=key)
        expected = desc.get("ItemCount")
        if expected is not None and expected != n:
            raise _ExportFailed(f"the export of table {name} counted {expected} items but its files hold {n}")
        return n

    def close(self) -> None:
        """Remove the save's bucket (and anything a failed export left in it)."""
        if self.bucket is None:
            return
        try:
            for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
                for o in page.get("Contents", []):
                    self.s3.delete_object(Bucket=self.bucket, Key=o["Key"])
            self.s3.delete_bucket(Bucket=self.bucket)
        except (ClientError, BotoCoreError):
            pass  # a leftover bucket of ours is skipped by save() and harmless
        self.bucket = None


class _ExportFailed(RuntimeError):
    pass


def load(aws_url: str, directory: Path) -> dict[str, int]:
    """Load a snapshot saved by save() into `aws_url` (tables and buckets that already
    exist keep their items; saved items overwrite same keys). No snapshot: nothing."""
    directory = Path(directory)
    counts = {"tables": 0, "items": 0, "objects": 0}
    if not (directory / "tables.json").exists():
        return counts
    ddb, s3 = _clients(aws_url)
    existing = {n for page in ddb.get_paginator("list_tables").paginate() for n in page["TableNames"]}
    for spec in json.loads((directory / "tables.json").read_text()):
        name = spec["TableName"]
        if name not in existing:
            kw = {k: v for k, v in spec.items() if v}
            ddb.create_table(BillingMode="PAY_PER_REQUEST", **kw)
            ddb.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})
        batch = []
        with open(directory / f"{name}.jsonl") as f:
            for line in f:
                batch.append({"PutRequest": {"Item": _decode(json.loads(line))}})
                if len(batch) == 25:
                    _write(ddb, name, batch)
                    counts["items"] += len(batch)
                    batch = []
        if batch:
            _write(ddb, name, batch)
            counts["items"] += len(batch)
        counts["tables"] += 1
    manifest = directory / "s3" / "manifest.json"
    for bucket in json.loads(manifest.read_text()) if manifest.exists() else []:
        try:
            s3.create_bucket(Bucket=bucket["bucket"])
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass
        for obj in bucket["objects"]:
            s3.put_object(Bucket=bucket["bucket"], Key=obj["key"], Body=(directory / "s3" / obj["file"]).read_bytes())
            counts["objects"] += 1
    return counts


def _write(ddb, table: str, requests: list[dict]) -> None:
    pending = {table: requests}
    for _ in range(20):
        left = ddb.batch_write_item(RequestItems=pending).get("UnprocessedItems") or {}
        if not left:
            return
        pending = left
    raise RuntimeError(f"restoring {table}: DynamoDB kept {len(pending.get(table, []))} items unprocessed")
