"""The S3 connector (skyfn/data/connectors/s3.py) against moto's S3 in server mode: the
Connector protocol, TTL through object metadata and the lifecycle rules, multipart both
ways, the presigned mode skyfn.protocol.blobs uses, and a 100 MB numpy array passed by
ref to another process."""
from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import time

import boto3
import numpy as np
import pytest
import requests

from skyfn.data import codec
from skyfn.data.connectors import from_config
from skyfn.data.connectors.s3 import S3Connector, download_url, upload_with_form

REPO = __file__.rsplit("/tests/", 1)[0]


@pytest.fixture
def bucket(aws_endpoint, unique):
    name = f"data-{unique}"
    boto3.client("s3", endpoint_url=aws_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture
def conn(bucket):
    c = S3Connector(bucket, prefix="t/")
    yield c
    c.close()


def test_put_get_exists_evict(conn):
    frames = [b"head", memoryview(b"-middle-"), bytearray(b"tail")]
    assert not conn.exists("k1") and conn.get("k1") is None
    conn.put("k1", frames)
    assert conn.exists("k1")
    assert bytes(conn.get("k1")) == b"head-middle-tail"
    conn.put("k1", [b"replaced"])
    assert bytes(conn.get("k1")) == b"replaced"
    conn.evict("k1")
    conn.evict("k1")  # evicting a missing key is not an error
    assert not conn.exists("k1") and conn.get("k1") is None
    keys = [o["Key"] for o in conn.client.list_objects_v2(Bucket=conn.bucket).get("Contents", [])]
    assert keys == []


def test_objects_live_under_the_prefix_and_the_config_rebuilds_the_connector(conn, bucket):
    conn.put("abc", [b"x"])
    listed = conn.client.list_objects_v2(Bucket=bucket)["Contents"]
    assert [o["Key"] for o in listed] == ["t/abc"]
    cfg = conn.config()
    assert cfg["kind"] == "s3" and cfg["bucket"] == bucket and cfg["prefix"] == "t/"
    json.dumps(cfg)  # a ref carries it
    other = from_config(cfg)
    assert isinstance(other, S3Connector) and bytes(other.get("abc")) == b"x"


def test_ttl_expiry_in_metadata_is_checked_on_get_and_tagged_for_the_lifecycle_rule(conn, bucket):
    put_at = time.time()
    conn.put("short", [b"soon gone"], ttl=5)  # long enough to read it back on a loaded machine
    conn.put("week", [b"kept"], ttl=3 * 86400)
    conn.put("forever", [b"kept"])
    head = conn.client.head_object(Bucket=bucket, Key="t/short")
    expires = float(head["Metadata"]["skyfn-expires"])
    assert put_at + 4.99 <= expires <= time.time() + 5  # kept to the millisecond
    tags = lambda k: {t["Key"]: t["Value"] for t in conn.client.get_object_tagging(Bucket=bucket, Key=k)["TagSet"]}
    assert tags("t/short") == {"skyfn-ttl-days": "1"} and tags("t/week") == {"skyfn-ttl-days": "7"}
    assert tags("t/forever") == {}
    assert bytes(conn.get("short")) == b"soon gone"
    time.sleep(max(0.0, expires - time.time()) + 0.3)
    assert conn.get("short") is None
    assert "Contents" not in conn.client.list_objects_v2(Bucket=bucket, Prefix="t/short")  # deleted on read
    conn.put("short2", [b"x"], ttl=0.2)
    time.sleep(0.4)
    assert not conn.exists("short2")
    assert bytes(conn.get("week")) == b"kept" and bytes(conn.get("forever")) == b"kept"


def test_lifecycle_rules_are_applied_next_to_the_buckets_own(conn, bucket):
    conn.client.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [
        {"ID": "operators-own", "Status": "Enabled", "Filter": {"Prefix": "logs/"}, "Expiration": {"Days": 90}}]})
    conn.apply_lifecycle()
    conn.apply_lifecycle()  # idempotent
    rules = {r["ID"]: r for r in conn.client.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]}
    assert set(rules) == {"operators-own", "skyfn-ttl-1d", "skyfn-ttl-7d", "skyfn-ttl-30d",
                          "skyfn-abort-incomplete-multipart"}
    r7 = rules["skyfn-ttl-7d"]
    assert r7["Expiration"]["Days"] == 7
    assert r7["Filter"]["And"]["Prefix"] == "t/"
    assert r7["Filter"]["And"]["Tags"] == [{"Key": "skyfn-ttl-days", "Value": "7"}]
    assert rules["skyfn-abort-incomplete-multipart"]["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"] == 1


def test_large_objects_go_multipart_both_ways(bucket):
    conn = S3Connector(bucket, prefix="m/", multipart_bytes=5 << 20, part_bytes=5 << 20, max_concurrency=4)
    data = np.random.default_rng(1).integers(0, 255, 23 << 20, dtype=np.uint8)
    frames = codec.encode_frames(data)
    conn.put("big", frames, ttl=3600)
    head = conn.client.head_object(Bucket=bucket, Key="m/big")
    assert head["ETag"].strip('"').endswith("-5")  # 23 MiB + header in 5 MiB parts: a multipart upload
    assert "skyfn-expires" in head["Metadata"]
    got = conn.get("big")
    assert isinstance(got, bytearray) and len(got) == codec.size_of(frames)
    out = codec.decode(got)
    assert np.array_equal(out, data) and out.flags.writeable  # a view on the downloaded buffer
    conn.close()


def test_presigned_mode_moves_bytes_without_credentials(conn, bucket):
    form = conn.presign_upload("args/one", 1000, 60)
    assert upload_with_form(form, [b"hello ", b"world"]) == "t/args/one"
    assert download_url(conn.presign_download("args/one", 60)) == b"hello world"
    # S3 enforces the form's policy (moto does not check it): read the conditions signed into it
    policy = lambda f: json.loads(base64.b64decode(f["fields"]["policy"]))["conditions"]
    assert ["content-length-range", 1, 10] in policy(conn.presign_upload("args/two", 10, 60))
    prefix_form = conn.presign_prefix_upload("results/ep/", 1 << 20, 60)
    assert ["starts-with", "$key", "t/results/ep/"] in policy(prefix_form)
    assert upload_with_form(prefix_form, b"r", key="t/results/ep/task") == "t/results/ep/task"
    assert download_url(conn.presign_download("results/ep/task", 60)) == b"r"
    assert requests.get(conn.presign_download("missing", 60), timeout=10).status_code == 404
    with pytest.raises(OSError, match="404"):
        download_url(conn.presign_download("missing", 60))


def test_the_sdk_stays_light():
    code = ("import sys, skyfn, skyfn.protocol.blobs, skyfn.data.connectors.s3, skyfn.data; "
            "bad = [m for m in ('boto3', 'botocore', 'requests') if m in sys.modules]; print(bad); assert not bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


CHILD = r"""
import hashlib, json, sys
import numpy as np
import skyfn.data.context as context
from skyfn.data import Store
from skyfn.data.connectors import from_config
spec = json.loads(sys.stdin.readline())
Store(spec["store"], from_config(spec["connector"]), secret=spec["secret"])
context.set_user("alice")
import pickle
ref = pickle.loads(bytes.fromhex(spec["ref"]))
expected = np.random.default_rng(12).random(spec["n"])
arr = np.asarray(ref)
print(json.dumps({"equal": bool(np.array_equal(arr, expected)), "sha": hashlib.sha256(arr.tobytes()).hexdigest(),
                  "shape": list(arr.shape)}))
"""


def test_a_100mb_array_by_ref_resolves_equal_in_another_process(bucket):
    import pickle

    from skyfn.data import Store

    n = (100 << 20) // 8
    arr = np.random.default_rng(12).random(n)
    conn = S3Connector(bucket, prefix="refs/")
    store = Store(f"s3-{bucket}", conn, secret=b"k" * 32)
    try:
        ref = store.ref(arr, ttl=600, owner="alice")
        blob = pickle.dumps(ref)
        assert len(blob) < 2000  # the ref travels, not the array
        spec = {"store": store.name, "connector": conn.config(), "secret": store.secret.hex(), "ref": blob.hex(),
                "n": n}
        out = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(spec) + "\n", capture_output=True,
                             text=True, cwd=REPO, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        res = json.loads(out.stdout.strip().splitlines()[-1])
        assert res == {"equal": True, "sha": hashlib.sha256(arr.tobytes()).hexdigest(), "shape": [n]}
    finally:
        store.close()
