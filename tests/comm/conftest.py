"""Fixtures for the communicator tests: NAT topologies made of network namespaces.

Tests that need namespaces skip (with the reason) only where namespaces cannot be made,
i.e. when not root or without ip/iptables."""
from __future__ import annotations

import pytest

from tests.comm.netns import NatTopology, namespaces_unavailable_reason


@pytest.fixture(scope="session")
def netns_reason():
    return namespaces_unavailable_reason()


@pytest.fixture
def make_topology(netns_reason):
    """make_topology(n, symmetric=False) -> a created NatTopology, closed after the test."""
    if netns_reason:
        pytest.skip(f"NAT tests need network namespaces: {netns_reason}")
    made = []

    def make(n: int = 2, symmetric=False) -> NatTopology:
        topo = NatTopology(n, symmetric=symmetric).create()
        made.append(topo)
        return topo

    yield make
    for topo in made:
        topo.close()
