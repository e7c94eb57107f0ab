"""The worker's half of dataflow (issue 26): run_task opens an envelope and puts each input's result
in its placeholder's place (endpoint_agent/manager/inputs.py). Envelopes are built by hand from
serialize() buffers as the service builds them; large buffers are served over HTTP as S3 would."""
from __future__ import annotations

import threading
from collections import namedtuple
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from endpoint_agent.manager.worker import FunctionCache, run_task
from skyfn.protocol import blobs
from skyfn.protocol.dataflow import Input, make_envelope
from skyfn.protocol.remote_exception import unwrap_exception
from skyfn.protocol.serialize import deserialize, pack_args, serialize, serialize_function

A_ID = "0190a5e1-0000-7000-8000-00000000000a"
B_ID = "0190a5e1-0000-7000-8000-00000000000b"
Pair = namedtuple("Pair", "left right")


def echo(*args, **kwargs):
    return list(args), kwargs


def same(a, b):
    return a is b


class Counted:
    """A value that counts how often it was unpickled."""

    loads = 0

    def __reduce__(self):
        return _counted, ()


def _counted():
    Counted.loads += 1
    return Counted()


@pytest.fixture
def cache():
    c = FunctionCache()
    c.add({"echo": serialize_function(echo), "same": serialize_function(same)})
    return c


@pytest.fixture
def files():
    """{path: text} served over HTTP at the returned base URL (a presigned URL stand-in)."""
    served: dict[str, str] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = served.get(self.path)
            self.send_response(200 if body is not None else 404)
            data = (body or "no such object").encode()
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def run(cache, fid, payload):
    state, result, error = run_task(cache, fid, payload)
    return state, (deserialize(result) if result is not None else unwrap_exception(error))


def test_inputs_take_their_placeholders_places_in_nested_arguments(cache):
    args = pack_args((Input(0), [Input(1), (Input(0),)], Pair(Input(1), 2)), {"k": {"x": Input(0)}, "s": {Input(1)}})
    env = make_envelope(args, [{"task_id": A_ID, "result": serialize(5)}, {"task_id": B_ID, "result": serialize("b")}])
    state, value = run(cache, "echo", env)
    assert state == "SUCCEEDED"
    assert value == ([5, ["b", (5,)], Pair("b", 2)], {"k": {"x": 5}, "s": {"b"}})


def test_each_input_is_deserialized_once_and_only_when_used(cache):
    Counted.loads = 0
    args = pack_args((Input(0), Input(0)), {})
    env = make_envelope(args, [{"task_id": A_ID, "result": serialize(Counted())},
                               {"task_id": B_ID, "result": "pickle 3.11\nnot base64 at all!"}])
    state, value = run(cache, "same", env)
    assert (state, value) == ("SUCCEEDED", True) and Counted.loads == 1  # input 1 is broken but never asked for


def test_a_payload_without_an_envelope_runs_as_before(cache):
    assert run(cache, "echo", pack_args((1,), {"k": 2})) == ("SUCCEEDED", ([1], {"k": 2}))


def test_an_undecodable_input_fails_the_task_naming_its_task(cache):
    env = make_envelope(pack_args((Input(0),), {}), [{"task_id": A_ID, "result": "nosuch 3.11\nxx"}])
    state, exc = run(cache, "echo", env)
    assert state == "FAILED" and A_ID in str(exc) and "input 0" in str(exc)


@pytest.mark.parametrize("payload, words", [
    ("dataflow 1\n{not json", "envelope is broken"),
    ("dataflow 1\n" + '{"inputs": []}', "envelope is broken"),
    (make_envelope(pack_args((Input(3),), {}), [{"task_id": A_ID, "result": serialize(1)}]), "holds 1 inputs"),
    (make_envelope(pack_args((Input(0),), {}), [{"task_id": A_ID}]), A_ID),
])
def test_a_broken_envelope_fails_the_task_with_a_clear_message(cache, payload, words):
    state, exc = run(cache, "echo", payload)
    assert state == "FAILED" and words in str(exc)


def test_results_and_arguments_kept_in_s3_are_downloaded(cache, files):
    served, base = files
    served["/result-a"] = serialize(list(range(1000)))
    served["/args"] = pack_args((Input(0), "big" * 10), {})
    env = make_envelope(blobs.make_ref("users/u/args-key"), [{"task_id": A_ID, "url": base + "/result-a"}],
                        args_url=base + "/args")
    state, value = run(cache, "echo", env)
    assert (state, value) == ("SUCCEEDED", ([list(range(1000)), "big" * 10], {}))
    # the envelope itself too large to travel inline: a payload blob, fetched first
    served["/envelope"] = env
    assert run(cache, "echo", blobs.make_ref(base + "/envelope")) == (state, value)


def test_an_input_that_does_not_download_fails_the_task(cache, files):
    _, base = files
    env = make_envelope(pack_args((Input(0),), {}), [{"task_id": B_ID, "url": base + "/gone"}])
    state, exc = run(cache, "echo", env)
    assert state == "FAILED" and B_ID in str(exc) and "404" in str(exc)
