"""Issue 15 at the service: the aAPP paper's Figure 3 script, in the paper's layout (followup
beside the tag), uploaded as an endpoint group's policy, places tasks as the paper
describes; a policy with an unclosed bracket is a 422 naming the line it was opened on.
Real Redis and moto behind the API handler (tests/service/conftest.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from skyfn.protocol import pack_args, serialize_function

FIGURE_3 = (Path(__file__).parents[1] / "unit" / "aapp_figure3.yaml").read_text()


def work(x):
    return x


@pytest.fixture
def eps(api):
    ids = {}
    for name in ("alpha", "beta", "gamma"):
        status, body = api.call("POST", "/endpoints", {"name": name})
        assert status == 201
        ids[name] = body["endpoint_id"]
    return ids


def register(api, tag):
    status, answer = api.call("POST", "/functions", {"function": serialize_function(work), "name": f"work-{tag}",
                                                     "tag": tag})
    assert status == 201
    return answer["function_id"]


def submit(api, fid, n=1, **target):
    status, body = api.call("POST", "/tasks", {**target, "tasks": [{"function_id": fid, "payload": pack_args((1,), {})}
                                                                   for _ in range(n)]})
    assert status == 202, body
    return body["task_ids"]


def endpoints_of(api, task_ids):
    out = []
    for tid in task_ids:
        status, body = api.call("GET", f"/tasks/{tid}")
        assert status == 200
        out.append(body["endpoint_id"])
    return out


def test_figure_3_uploads_and_places_as_the_paper_describes(api, eps):
    status, g = api.call("POST", "/endpoint-groups", {"name": "dei", "policy": FIGURE_3,
                                                      "members": [{"endpoint_id": eps[n]} for n in eps]})
    assert status == 201, g
    assert g["policy"] == FIGURE_3 and g["warnings"] == []
    gid = g["group_id"]
    divide, impera, heavy = register(api, "divide"), register(api, "impera"), register(api, "heavy")
    submit(api, heavy, 1, endpoint_id=eps["alpha"])
    # impera: never beside heavy
    impera_at = set(endpoints_of(api, submit(api, impera, 6, group_id=gid)))
    assert impera_at and impera_at <= {eps["beta"], eps["gamma"]}
    # divide: only where impera runs and heavy does not
    assert set(endpoints_of(api, submit(api, divide, 4, group_id=gid))) <= impera_at
    # `any` picks at random: 1 time in 32 all six impera land on one of beta and gamma, the
    # other stays empty and heavy may rightly go there. The paper's scene has impera on both.
    for name in ("beta", "gamma"):
        submit(api, impera, 1, endpoint_id=eps[name])
    # heavy: away from divide and impera — alpha, which runs only heavy
    assert endpoints_of(api, submit(api, heavy, 2, group_id=gid)) == [eps["alpha"]] * 2


def test_figure_3_fails_divide_when_heavy_runs_everywhere(api, eps):
    status, g = api.call("POST", "/endpoint-groups", {"name": "dei", "policy": FIGURE_3,
                                                      "members": [{"endpoint_id": eps[n]} for n in ("alpha", "beta")]})
    assert status == 201, g
    divide, heavy = register(api, "divide"), register(api, "heavy")
    submit(api, heavy, 1, endpoint_id=eps["alpha"])
    submit(api, heavy, 1, endpoint_id=eps["beta"])
    (tid,) = submit(api, divide, 1, group_id=g["group_id"])
    status, answer = api.call("POST", "/tasks/status", {"task_ids": [tid]})
    task = answer["tasks"][tid]
    assert task["state"] == "FAILED"
    assert task["reason"] == (
        "placement in endpoint group 'dei': no valid worker for tag 'divide': "
        "'divide' block 1 (line 6): alpha runs 1 'heavy' function(s) (anti-affinity !heavy); "
        "beta runs 1 'heavy' function(s) (anti-affinity !heavy) | "
        "'divide' block 2 (line 8): alpha runs 1 'heavy' function(s) (anti-affinity !heavy); "
        "beta runs 1 'heavy' function(s) (anti-affinity !heavy) (followup: fail)")


def test_upload_errors_name_the_line(api, eps):
    members = [{"endpoint_id": eps["alpha"]}]
    status, body = api.call("POST", "/endpoint-groups", {"name": "g", "members": members, "policy":
                            "- t:\n  - workers: [alpha\n    strategy: best_first\n  followup: fail\n"})
    assert status == 422 and body["error"] == "invalid_policy"
    assert body["details"] == [{"line": 2, "key": "", "reason":
                                "not valid YAML: the '[' opened on line 2 is never closed (parsing stopped on line 3: "
                                "expected ',' or ']', but got ':'): close it with ']' on line 2"}]
    status, body = api.call("POST", "/endpoint-groups", {"name": "g", "members": members, "policy":
                            "- t:\n  - workers: [alpha]\n  followup: later\n"})
    assert status == 422
    assert body["details"] == [{"line": 3, "key": "t.followup",
                                "reason": "bad followup 'later': use 'default' or 'fail'"}]
