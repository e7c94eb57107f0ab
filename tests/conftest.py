"""Shared fixtures: a real redis-server and moto in server mode, one per test session,
plus per-test isolation (a flushed Redis database, unique AWS resource names)."""
from __future__ import annotations

import os
import uuid

import pytest

from infra.local.processes import start_moto, start_redis

# Fake credentials for moto; no request ever leaves this machine.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = start_redis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server):
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory):
    server = start_moto(tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


@pytest.fixture
def aws_endpoint(moto_server, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.url)
    return moto_server.url


@pytest.fixture
def unique():
    return uuid.uuid4().hex[:10]
