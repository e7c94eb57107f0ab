"""infra/local/snapshot.py against real moto servers: what `skyfn local down` saves from
one moto, `skyfn local up` loads into a fresh one exactly (every item, every attribute
type including binary values nested in maps and lists, the key schemas and global
secondary indexes, S3 objects byte for byte); the table export (the linear path) and
Scan (the fallback) write the same items, at Scan's page boundaries by count and by
size; and the save cleans up after itself (its export bucket, point-in-time recovery)."""
from __future__ import annotations

import json
import os

import pytest
import requests

from infra.local import snapshot
from infra.local.processes import start_moto


@pytest.fixture(scope="module")
def motos(tmp_path_factory):
    servers = [start_moto(tmp_path_factory.mktemp("moto-src")), start_moto(tmp_path_factory.mktemp("moto-dst"))]
    yield servers
    for s in servers:
        s.stop()


@pytest.fixture
def src_dst(motos):
    """Two empty moto servers (save() saves every table of a server: none of other tests)."""
    for s in motos:
        requests.post(f"{s.url}/moto-api/reset", timeout=10).raise_for_status()
    return motos[0].url, motos[1].url


def _table(ddb, name: str, range_key: bool = False, gsi: bool = True) -> None:
    attrs = [{"AttributeName": "pk", "AttributeType": "S"}]
    schema = [{"AttributeName": "pk", "KeyType": "HASH"}]
    if range_key:
        attrs.append({"AttributeName": "sk", "AttributeType": "N"})
        schema.append({"AttributeName": "sk", "KeyType": "RANGE"})
    kw = {}
    if gsi:
        attrs += [{"AttributeName": "owner", "AttributeType": "S"}, {"AttributeName": "created", "AttributeType": "N"}]
        kw["GlobalSecondaryIndexes"] = [{"IndexName": "owner-index", "Projection": {"ProjectionType": "ALL"},
                                         "KeySchema": [{"AttributeName": "owner", "KeyType": "HASH"},
                                                       {"AttributeName": "created", "KeyType": "RANGE"}]}]
    ddb.create_table(TableName=name, BillingMode="PAY_PER_REQUEST", AttributeDefinitions=attrs, KeySchema=schema, **kw)


def _put(ddb, table: str, items: list[dict]) -> None:
    for lo in range(0, len(items), 25):
        pending = {table: [{"PutRequest": {"Item": i}} for i in items[lo:lo + 25]]}
        while pending:
            pending = ddb.batch_write_item(RequestItems=pending).get("UnprocessedItems") or {}


def _all(ddb, table: str) -> list[dict]:
    return [i for p in ddb.get_paginator("scan").paginate(TableName=table) for i in p["Items"]]


def _canon(items: list[dict]) -> list[str]:
    """Items comparable as a multiset (sets' member order is not significant)."""
    def norm(v):
        if isinstance(v, dict):
            return {k: (sorted(norm(x) for x in v[k]) if k in ("SS", "NS", "BS") else norm(v[k])) for k in v}
        if isinstance(v, list):
            return [norm(x) for x in v]
        return v
    return sorted(json.dumps(snapshot._encode(norm(i)), sort_keys=True) for i in items)


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


RICH = [
    {"pk": {"S": "a"}, "owner": {"S": "alice"}, "created": {"N": "1700000000.125"},
     "blob": {"B": bytes(range(256))}, "blobs": {"BS": [b"\x00", b"\xff\xfe", b"plain"]},
     "n": {"N": "-12.5e3"}, "big": {"N": "123456789012345678901234567890"},
     "ss": {"SS": ["x", "y", "z"]}, "ns": {"NS": ["1", "2.5", "-3"]},
     "m": {"M": {"inner": {"B": b"\x01\x02"}, "deeper": {"M": {"b": {"B": b"\x00"}, "s": {"S": "s"}}},
                 "l": {"L": [{"B": b"\x03"}, {"N": "7"}, {"NULL": True}, {"BOOL": False}, {"BS": [b"\x04"]}]}}},
     "l": {"L": [{"M": {"b": {"B": b"\x05"}}}, {"L": []}, {"M": {}}]},
     "t": {"BOOL": True}, "nil": {"NULL": True}, "u": {"S": "h\u00e9llo \u2603 \U0001f600 \"q\" \\ \n"}},
    {"pk": {"S": "b"}, "owner": {"S": "alice"}, "created": {"N": "1700000001"}, "blob": {"B": b""}},
    {"pk": {"S": "c"}, "note": {"S": "no GSI keys: not in owner-index"}},
    {"pk": {"S": "d"}, "owner": {"S": "bob"}, "created": {"N": "5"}},
]


def test_round_trip_is_exact(src_dst, tmp_path):
    src, dst = src_dst
    ddb, s3 = snapshot._clients(src)
    _table(ddb, "history")  # like <p>-tasks: hash key and GSI (owner, created)
    _table(ddb, "ranged", range_key=True, gsi=False)
    _table(ddb, "empty", gsi=False)
    _put(ddb, "history", RICH)
    _put(ddb, "ranged", [{"pk": {"S": f"h{i % 3}"}, "sk": {"N": str(i)}, "v": {"B": bytes([i])}} for i in range(40)])
    s3.create_bucket(Bucket="payloads")
    bodies = {"k/1": bytes(range(256)) * 10, "k/empty": b"", "k/ü nicode": b"x"}
    for key, body in bodies.items():
        s3.put_object(Bucket="payloads", Key=key, Body=body)

    counts = snapshot.save(src, tmp_path / "snap")
    assert counts == {"tables": 3, "items": len(RICH) + 40, "objects": 3, "scanned_tables": 0}
    # the save's own bucket is gone, and point-in-time recovery is off again as it was
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["payloads"]
    for name in ("history", "ranged", "empty"):
        pitr = ddb.describe_continuous_backups(TableName=name)["ContinuousBackupsDescription"]
        assert pitr["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"] == "DISABLED"

    loaded = snapshot.load(dst, tmp_path / "snap")
    assert loaded == {"tables": 3, "items": len(RICH) + 40, "objects": 3}
    ddb2, s32 = snapshot._clients(dst)
    for name in ("history", "ranged", "empty"):
        a, b = ddb.describe_table(TableName=name)["Table"], ddb2.describe_table(TableName=name)["Table"]
        assert b["KeySchema"] == a["KeySchema"]
        assert sorted(b["AttributeDefinitions"], key=str) == sorted(a["AttributeDefinitions"], key=str)
        assert ([(g["IndexName"], g["KeySchema"], g["Projection"]) for g in b.get("GlobalSecondaryIndexes", [])]
                == [(g["IndexName"], g["KeySchema"], g["Projection"]) for g in a.get("GlobalSecondaryIndexes", [])])
        assert _canon(_all(ddb2, name)) == _canon(_all(ddb, name))
    assert _canon(_all(ddb2, "history")) == _canon(RICH)
    got = ddb2.get_item(TableName="history", Key={"pk": {"S": "a"}})["Item"]
    assert got["blob"]["B"] == bytes(range(256)) and got["m"]["M"]["deeper"]["M"]["b"]["B"] == b"\x00"
    # the GSI answers in the new moto as in the old
    q = dict(TableName="history", IndexName="owner-index", KeyConditionExpression="#o = :o",
             ExpressionAttributeNames={"#o": "owner"}, ExpressionAttributeValues={":o": {"S": "alice"}})
    assert [i["pk"]["S"] for i in ddb2.query(**q)["Items"]] == [i["pk"]["S"] for i in ddb.query(**q)["Items"]] == ["a", "b"]
    for key, body in bodies.items():
        assert s32.get_object(Bucket="payloads", Key=key)["Body"].read() == body


@pytest.mark.parametrize("n", [0, 1, 9, 10, 11, 20, 21])
def test_export_and_scan_hold_every_item_at_page_boundaries(src_dst, tmp_path, n):
    """Scan pages of 10 items; the export has no pages: both hold each item once."""
    src, _ = src_dst
    ddb, _ = snapshot._clients(src)
    _table(ddb, "t")
    items = [{"pk": {"S": f"item-{i:03d}"}, "owner": {"S": f"o{i % 2}"}, "created": {"N": str(i)},
              "b": {"B": i.to_bytes(2, "big")}} for i in range(n)]
    _put(ddb, "t", items)
    exported = snapshot.save(src, tmp_path / "export")
    scanned = snapshot.save(src, tmp_path / "scan", method="scan", scan_limit=10)
    assert exported["items"] == scanned["items"] == n
    assert (exported["scanned_tables"], scanned["scanned_tables"]) == (0, 1)
    for d in ("export", "scan"):
        lines = _lines(tmp_path / d / "t.jsonl")
        assert len(lines) == n and len({line["pk"]["S"] for line in lines}) == n
        assert _canon([snapshot._decode(line) for line in lines]) == _canon(items)


def test_items_beyond_a_one_megabyte_scan_page(src_dst, tmp_path):
    """moto ends a Scan page at 1 MB: 30 items of 100 kB are three pages by size."""
    src, dst = src_dst
    ddb, _ = snapshot._clients(src)
    _table(ddb, "big", gsi=False)
    items = [{"pk": {"S": f"k{i:02d}"}, "payload": {"B": os.urandom(100_000)}} for i in range(30)]
    _put(ddb, "big", items)
    assert len(ddb.scan(TableName="big")["Items"]) < 30  # the boundary is really crossed
    for method in ("export", "scan"):
        counts = snapshot.save(src, tmp_path / method, method=method)
        assert counts["items"] == 30
        assert _canon([snapshot._decode(line) for line in _lines(tmp_path / method / "big.jsonl")]) == _canon(items)
    snapshot.load(dst, tmp_path / "export")
    assert _canon(_all(snapshot._clients(dst)[0], "big")) == _canon(items)


def test_bad_method_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="method must be 'export' or 'scan'"):
        snapshot.save("http://127.0.0.1:9", tmp_path, method="fast")


def test_a_failed_export_falls_back_to_scan_and_cleans_up(src_dst, tmp_path, monkeypatch):
    """An export that fails half-way (here: after writing one line) leaves no partial
    file: that table is read again, whole, with Scan; the save's bucket is removed and
    point-in-time recovery switched off again."""
    src, _ = src_dst
    ddb, s3 = snapshot._clients(src)
    _table(ddb, "t")
    items = [{"pk": {"S": f"k{i}"}, "b": {"B": bytes([i])}} for i in range(12)]
    _put(ddb, "t", items)

    def broken(self, name, arn, bucket, out):
        out.write(json.dumps({"pk": {"S": "half-written"}}) + "\n")
        raise snapshot._ExportFailed("the export of table t ended FAILED: UNKNOWN disk full")

    monkeypatch.setattr(snapshot._Exporter, "_export", broken)
    counts = snapshot.save(src, tmp_path / "snap", scan_limit=5)
    assert (counts["items"], counts["scanned_tables"]) == (12, 1)
    assert _canon([snapshot._decode(line) for line in _lines(tmp_path / "snap" / "t.jsonl")]) == _canon(items)
    assert s3.list_buckets()["Buckets"] == []
    pitr = ddb.describe_continuous_backups(TableName="t")["ContinuousBackupsDescription"]
    assert pitr["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"] == "DISABLED"
