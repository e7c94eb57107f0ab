"""The spmd-group state machine under moto's Step Functions with the real SpmdInit and
RunTask handlers: 4 ranks run at once on the local endpoint, each handed its rank, the
world size and the rendezvous address with a group token; with the communicator they
join their group through the real rendezvous server and allreduce."""
from __future__ import annotations

import pytest

from skyfn.runs import RunFailed, run_group
from tests.runs import fns


def test_ranks_get_rank_size_and_rendezvous(client, endpoint, rendezvous_server):
    out = run_group(client, fns.check_rank, "local", world_size=4, tag="t1").result(timeout=120)
    assert out["world_size"] == 4 and out["group_id"].startswith("spmd-")
    assert [r["rank"] for r in out["results"]] == [0, 1, 2, 3]
    assert all(r["world_size"] == 4 and r["group"] == out["group_id"] and r["tag"] == "t1" and r["token_ok"]
               for r in out["results"])


def test_group_of_4_allreduces_through_the_communicator(client, endpoint):
    pytest.importorskip("comm._core", reason="the communicator extension is not built")
    out = run_group(client, fns.allreduce_rank, "local", world_size=4).result(timeout=180)
    expected = [sum(10 * r + i for r in range(4)) for i in range(4)]
    assert [r["rank"] for r in out["results"]] == [0, 1, 2, 3]
    assert all(r["size"] == 4 and r["sum"] == expected for r in out["results"]), out["results"]


def test_failing_rank_fails_the_group(client, endpoint):
    with pytest.raises(RunFailed) as info:
        run_group(client, fns.fails_on_rank_one, "local", world_size=2).result(timeout=120)
    assert info.value.error == "TaskFailed"
    assert info.value.cause.startswith("step rank: task ") and "RuntimeError: rank 1 of 2 gives up" in info.value.cause


def test_group_on_offline_endpoint(client, offline_endpoint):
    with pytest.raises(RunFailed) as info:
        run_group(client, fns.check_rank, offline_endpoint, world_size=2, tag="x").result(timeout=60)
    assert info.value.error == "EndpointOffline"
