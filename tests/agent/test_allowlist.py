"""Endpoint function allowlists at the agent: `allowed_functions` in config.yaml (bad entries
are errors naming the line and the reason), and a real agent that refuses any other
function before anything of the task is deserialized, even when the service never saw it
(task packs pushed straight onto the endpoint's queue)."""
from __future__ import annotations

import pathlib
import uuid

import pytest

from endpoint_agent.config import ConfigError, load_config, parse_config
from skyfn.protocol.allowlist import REFUSED, AllowedFunction
from skyfn.protocol.messages import TaskPack, TaskSpec
from skyfn.protocol.serialize import deserialize, pack_args, serialize_function
from tests.agent import fns

ALLOWED_ID, CONTROL_ID, OTHER_ID, BY_NAME_ID, WRONG_OWNER_ID = (str(uuid.uuid4()) for _ in range(5))


class Touch:
    """An argument whose unpickling creates a file: it shows whether a payload was deserialized."""

    def __init__(self, path: pathlib.Path):
        self.path = path

    def __reduce__(self):
        return pathlib.Path.touch, (self.path,)


# --- configuration -----------------------------------------------------------------------
def test_entries_parse_to_ids_and_owner_name_pairs(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(f"workers: 1\nallowed_functions:\n  - {ALLOWED_ID}\n  - {{owner: alice, name: simulate}}\n"
                    f"  - function_id: {OTHER_ID.upper()}\n")
    cfg = load_config(path)
    assert cfg.allowed_functions == [AllowedFunction(function_id=ALLOWED_ID),
                                     AllowedFunction(owner="alice", name="simulate"),
                                     AllowedFunction(function_id=OTHER_ID.upper())]
    assert parse_config({}).allowed_functions is None  # absent: any function
    assert parse_config({"allowed_functions": []}).allowed_functions == []  # empty: none


@pytest.mark.parametrize("entries, line, reason", [
    ([ALLOWED_ID, "simulate"], 4, "'simulate' is not a function id: function ids are UUIDs"),
    ([{"owner": "alice"}], 3, "needs both owner and name"),
    ([ALLOWED_ID, ALLOWED_ID, {"owner": "alice", "nmae": "f"}], 5, "unknown key 'nmae'"),
    ([{"function_id": ALLOWED_ID, "owner": "alice", "name": "f"}], 3, "either function_id, or owner and name"),
    ([42], 3, "expected a function id (a UUID"),
    ([{"owner": "alice", "name": 7}], 3, "name must be a string"),
])
def test_a_bad_entry_is_an_error_naming_its_line_and_the_reason(tmp_path, entries, line, reason):
    import yaml

    path = tmp_path / "config.yaml"
    path.write_text("workers: 1\n" + yaml.safe_dump({"allowed_functions": entries}, default_flow_style=False))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert f"{path} line {line}: allowed_functions entry" in msg, msg
    assert reason in msg, msg


def test_a_list_is_required(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(f"workers: 1\n\nallowed_functions: {ALLOWED_ID}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"line 3: allowed_functions: expected a list of entries" in str(info.value)


# --- a real agent --------------------------------------------------------------------------
def _pack(prefix: str, function_id: str, fn, args: tuple, meta: dict | None = None) -> bytes:
    spec = TaskSpec(task_id=f"{prefix}-0", function_id=function_id, payload=pack_args(args, {}))
    pack = TaskPack(pack_id=f"{prefix}-pack", endpoint_id="ep", functions={function_id: serialize_function(fn)},
                    tasks=[spec], function_meta={function_id: meta} if meta else {})
    return pack.model_dump_json().encode()


def test_agent_refuses_unlisted_functions_without_deserializing_them(queues, agent_factory, tmp_path):
    allowed = [ALLOWED_ID, CONTROL_ID, {"owner": "alice", "name": "square"}]
    agent = agent_factory(allowed_functions=allowed).start(wait_workers=2)
    refused_marker, control_marker = tmp_path / "refused-was-deserialized", tmp_path / "allowed-was-deserialized"
    cases = {
        "listed": _pack("listed", ALLOWED_ID, fns.square, (7,)),
        "by-name": _pack("by-name", BY_NAME_ID, fns.square, (8,), {"owner": "alice", "name": "square"}),
        "unlisted": _pack("unlisted", OTHER_ID, fns.noop, (Touch(refused_marker),)),
        "wrong-owner": _pack("wrong-owner", WRONG_OWNER_ID, fns.square, (9,), {"owner": "mallory", "name": "square"}),
        "control": _pack("control", CONTROL_ID, fns.noop, (Touch(control_marker),)),
    }
    queues.send(list(cases.values()), [[f"{k}-0"] for k in cases])
    results = {t: r[0] for t, r in queues.collect([f"{k}-0" for k in cases], timeout=30).items()}

    assert results["listed-0"]["state"] == "SUCCEEDED" and deserialize(results["listed-0"]["result"]) == 49
    assert results["by-name-0"]["state"] == "SUCCEEDED" and deserialize(results["by-name-0"]["result"]) == 64
    for tid, fid in (("unlisted-0", OTHER_ID), ("wrong-owner-0", WRONG_OWNER_ID)):
        r = results[tid]
        assert r["state"] == "FAILED" and r["reason"].startswith(f"{REFUSED}: function {fid}"), r
        assert [e[0] for e in r["events"]] == ["DISPATCHED"]  # never reached a worker
    assert "(mallory/square)" in results["wrong-owner-0"]["reason"]
    assert not refused_marker.exists()  # its argument was never unpickled
    assert results["control-0"]["state"] == "SUCCEEDED" and control_marker.exists()  # the same payload, listed
    st = agent.wait_status(lambda s: s.get("failed") == 2)
    assert st["completed"] == 3
    assert agent.terminate() == 0
