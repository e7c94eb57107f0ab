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
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

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


def save(aws_url: str, directory: Path) -> dict[str, int]:
    """Save every DynamoDB table and S3 bucket of `aws_url`; returns counts."""
    ddb, s3 = _clients(aws_url)
    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "s3").mkdir(parents=True)
    counts = {"tables": 0, "items": 0, "objects": 0}
    specs = []
    for page in ddb.get_paginator("list_tables").paginate():
        for name in page["TableNames"]:
            t = ddb.describe_table(TableName=name)["Table"]
            specs.append({"TableName": name, "KeySchema": t["KeySchema"],
                          "AttributeDefinitions": t["AttributeDefinitions"],
                          "GlobalSecondaryIndexes": [{"IndexName": g["IndexName"], "KeySchema": g["KeySchema"],
                                                      "Projection": g["Projection"]}
                                                     for g in t.get("GlobalSecondaryIndexes", [])]})
            with open(tmp / f"{name}.jsonl", "w") as f:
                for items in ddb.get_paginator("scan").paginate(TableName=name):
                    for item in items["Items"]:
                        f.write(json.dumps(_encode(item)) + "\n")
                        counts["items"] += 1
            counts["tables"] += 1
    (tmp / "tables.json").write_text(json.dumps(specs, indent=1))
    manifest = []
    for bucket in s3.list_buckets().get("Buckets", []):
        name = bucket["Name"]
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
