"""Fixtures of the SDK tests: an isolated $SKYFN_HOME and an in-memory service double."""
from __future__ import annotations

import pytest

from skyfn.config import write_config

from .fake_service import FakeService


@pytest.fixture(autouse=True)
def skyfn_home(tmp_path, monkeypatch):
    home = tmp_path / "skyfn-home"
    monkeypatch.setenv("SKYFN_HOME", str(home))
    monkeypatch.delenv("SKYFN_SERVICE_URL", raising=False)
    monkeypatch.delenv("SKYFN_TOKEN", raising=False)
    return home


@pytest.fixture
def service():
    svc = FakeService()
    yield svc
    svc.stop()


@pytest.fixture
def client(service, skyfn_home):
    from skyfn import Client

    write_config(service.url, service.token, home=skyfn_home)
    c = Client(backoff=0.01)
    yield c
    c.close()


@pytest.fixture
def executor(client):
    from skyfn import Executor

    ex = Executor(client=client)
    yield ex
    ex.shutdown(wait=True, cancel_futures=True)
