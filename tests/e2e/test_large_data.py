"""Large arguments and results go through S3 transparently (no 10 MB ceiling): on the
embedded runtime, the SDK uploads a 12 MB argument itself, the agent fetches it with a
presigned URL and stores a 12 MB result the same way, and the SDK fetches that."""
from __future__ import annotations

from tests.e2e.conftest import service_s3


def grow(data: bytes, factor: int) -> bytes:
    return data * factor


def test_twelve_megabytes_each_way(client, endpoint_id, local_home):
    fid = client.register_function(grow)
    arg = bytes(range(256)) * (12 * 4096)  # 12 MiB, far above the inline ceiling
    tid = client.run(fid, arg, 1, endpoint_id=endpoint_id)
    assert client.get_result(tid, timeout=120) == arg
    tid2 = client.run(fid, b"ab", 6 << 20, endpoint_id=endpoint_id)  # small argument, 12 MiB result
    assert client.get_result(tid2, timeout=120) == b"ab" * (6 << 20)
    s3, bucket = service_s3(local_home)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert any(k.startswith("args/") for k in keys)
    assert f"results/{endpoint_id}/{tid}" in keys and f"results/{endpoint_id}/{tid2}" in keys
