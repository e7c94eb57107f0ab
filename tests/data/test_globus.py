"""Globus staging with globus-sdk's real TransferClient driving the local Transfer stand-in
(infra/local/standins/globus_transfer/), which really copies between directories as collections:
the API subset, token refresh through globus-sdk's auth clients, the stager's batching
(200 items -> ceil(200 / batch size) Transfer tasks, concurrency bound kept), a missing
path failing with Globus's message, the GlobusConnector with a 100 MB array by ref, and
`data: globus:` config errors."""
from __future__ import annotations

import json
import math
import os
import stat
import threading
import time

import globus_sdk
import numpy as np
import pytest

from infra.local.standins.globus_transfer.server import TransferStandIn
from skyfn.data import GlobusConnector, GlobusFile, Store
from skyfn.data.globus_config import TRANSFER_RS, authorizer, parse_globus, read_tokens, save_tokens
from skyfn.protocol.serialize import pack_args, unpack_args

A = "aaaaaaaa-1111-4111-8111-000000000001"
B = "bbbbbbbb-2222-4222-8222-000000000002"
E = "eeeeeeee-3333-4333-8333-000000000003"   # the endpoint's own collection
TOKEN = "test-transfer-token"
REPO = __file__.rsplit("/tests/", 1)[0]


@pytest.fixture
def dirs(tmp_path):
    d = {cid: tmp_path / name for cid, name in ((A, "a"), (B, "b"), (E, "endpoint"))}
    for p in d.values():
        p.mkdir()
    return d


@pytest.fixture
def standin(dirs):
    with TransferStandIn(dirs, tokens={TOKEN}) as s:
        yield s


def client(standin, token=TOKEN):
    return globus_sdk.TransferClient(base_url=standin.url, authorizer=globus_sdk.AccessTokenAuthorizer(token))


def settings(root, standin, token_file, **extra):
    return parse_globus({"collection": E, "root": str(root), "transfer_url": standin.url, "auth_url": standin.url,
                         "token_file": str(token_file), "poll_min": 0.02, "poll_max": 0.2, "batch_wait": 0.2,
                         **extra})


# --- the stand-in, through globus-sdk ---------------------------------------------------
def test_transfer_client_drives_the_standin(standin, dirs):
    (dirs[A] / "in").mkdir()
    (dirs[A] / "in" / "x.bin").write_bytes(b"x" * 1000)
    (dirs[A] / "in" / "y.bin").write_bytes(b"y" * 10)
    tc = client(standin)
    data = globus_sdk.TransferData(A, B, label="two files")
    data.add_item("/in/x.bin", "/deep/out/x.bin")
    data.add_item("/in/y.bin", "/deep/out/y.bin")
    sub = data["submission_id"] = tc.get_submission_id()["value"]
    res = tc.submit_transfer(data)
    assert res["code"] == "Accepted" and res["submission_id"] == sub
    assert tc.submit_transfer(data)["code"] == "Duplicate"            # same submission id: same task
    assert tc.task_wait(res["task_id"], timeout=10, polling_interval=1)
    task = tc.get_task(res["task_id"])
    assert (task["status"], task["type"], task["files"], task["files_transferred"], task["bytes_transferred"]) == \
        ("SUCCEEDED", "TRANSFER", 2, 2, 1010)
    assert task["fatal_error"] is None and task["source_endpoint_id"] == A
    done = [(t["source_path"], t["destination_path"]) for t in tc.paginated.task_successful_transfers(res["task_id"]).items()]
    assert done == [("/in/x.bin", "/deep/out/x.bin"), ("/in/y.bin", "/deep/out/y.bin")]
    assert (dirs[B] / "deep" / "out" / "x.bin").read_bytes() == b"x" * 1000
    assert tc.cancel_task(res["task_id"])["code"] == "TaskComplete"
    assert [f["name"] for f in tc.operation_ls(B, path="/deep/out")["DATA"]] == ["x.bin", "y.bin"]
    listed = list(tc.task_list(filter=f"task_id:{res['task_id']}"))
    assert [t["task_id"] for t in listed] == [res["task_id"]]
    log = standin.log.transfer_tasks(A, B)
    assert len(log) == 1 and log[0]["items"] == 2 and log[0]["status"] == "SUCCEEDED"


def test_missing_path_fails_with_globus_reason_and_cancel_and_auth(dirs):
    with TransferStandIn(dirs, tokens={TOKEN}, copy_delay=1.0) as standin:
        tc = client(standin)
        data = globus_sdk.TransferData(A, B)
        data.add_item("/no/such/file.npy", "/x.npy")
        tid = tc.submit_transfer(data)["task_id"]
        assert tc.get_task(tid)["status"] == "ACTIVE"
        assert tc.task_wait(tid, timeout=10, polling_interval=1)
        task = tc.get_task(tid)
        assert task["status"] == "FAILED" and task["nice_status"] == "FILE_NOT_FOUND"
        assert task["fatal_error"] == {"code": "FILE_NOT_FOUND", "description": "No such file or directory"}
        assert "/no/such/file.npy" in task["nice_status_details"]

        slow = globus_sdk.TransferData(A, B)
        slow.add_item("/no/such/file.npy", "/x.npy")
        tid = tc.submit_transfer(slow)["task_id"]
        assert tc.cancel_task(tid)["code"] == "Canceled"
        assert tc.get_task(tid)["status"] == "FAILED"

        with pytest.raises(globus_sdk.TransferAPIError) as bad:
            client(standin, "not-a-token").get_task(tid)
        assert (bad.value.http_status, bad.value.code) == (401, "AuthenticationFailed")
        with pytest.raises(globus_sdk.TransferAPIError) as unknown:
            unknown_data = globus_sdk.TransferData(A, "cccccccc-0000-4000-8000-00000000000c")
            unknown_data.add_item("/a", "/b")
            tc.submit_transfer(unknown_data)
        assert unknown.value.http_status == 404 and "not found" in unknown.value.message


def test_refresh_token_is_refreshed_through_globus_auth_and_saved_0600(standin, dirs, tmp_path):
    standin.refresh_tokens.add("the-refresh-token")
    token_file = tmp_path / "tokens.json"
    save_tokens(token_file, {TRANSFER_RS: {"access_token": "expired", "refresh_token": "the-refresh-token",
                                           "expires_at_seconds": int(time.time()) - 10}})
    s = settings(dirs[E], standin, token_file, client_id="dddddddd-4444-4444-8444-000000000004")
    tc = globus_sdk.TransferClient(base_url=standin.url, authorizer=authorizer(s, token_file))
    assert tc.get_submission_id()["value"]                      # refreshed first, then accepted
    assert standin.token_requests == 1
    saved = read_tokens(token_file)[TRANSFER_RS]
    assert saved["access_token"].startswith("standin-") and saved["refresh_token"] == "the-refresh-token"
    assert saved["expires_at_seconds"] > time.time() + 3600
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600


def test_client_credentials_authorizer(standin, dirs, tmp_path):
    standin.clients["dddddddd-4444-4444-8444-000000000004"] = "s3cret"
    (tmp_path / "secret").write_text("s3cret\n")
    s = settings(dirs[E], standin, tmp_path / "cc.json", client_id="dddddddd-4444-4444-8444-000000000004",
                 client_secret_file=str(tmp_path / "secret"))
    tc = globus_sdk.TransferClient(base_url=standin.url, authorizer=authorizer(s, tmp_path / "cc.json"))
    assert tc.get_submission_id()["value"]
    assert read_tokens(tmp_path / "cc.json")[TRANSFER_RS]["access_token"].startswith("standin-")


def test_no_credentials_is_a_clear_error(standin, dirs, tmp_path):
    s = settings(dirs[E], standin, tmp_path / "none.json")
    with pytest.raises(ValueError) as info:
        authorizer(s, tmp_path / "none.json")
    assert "no Globus credentials for Transfer" in str(info.value) and "none.json" in str(info.value)


# --- the stager ------------------------------------------------------------------------
def run_stager(s, standin, jobs: dict, timeout=60.0):
    from endpoint_agent.data.staging import Stager

    done: dict = {}
    ev = threading.Event()

    def on_done(job, error):
        done[job] = error
        if len(done) == len(jobs):
            ev.set()

    stager = Stager(s, client(standin), on_done).start()
    try:
        for job, items in jobs.items():
            stager.request(job, items)
        assert ev.wait(timeout), f"{len(done)} of {len(jobs)} jobs done"
        return done, stager.snapshot()
    finally:
        stager.stop()


@pytest.mark.parametrize("batch_size,bound,copy_delay", [(100, 5, 0.0), (20, 3, 0.3)])
def test_200_files_become_ceil_200_over_batch_size_transfer_tasks(dirs, tmp_path, batch_size, bound, copy_delay):
    for i in range(200):
        (dirs[A] / f"f{i:03d}.dat").write_bytes(i.to_bytes(2, "big") * 50)
    with TransferStandIn(dirs, tokens={TOKEN}, copy_delay=copy_delay) as standin:
        save_tokens(tmp_path / "t.json", {TRANSFER_RS: {"access_token": TOKEN}})
        s = settings(dirs[E], standin, tmp_path / "t.json", batch_size=batch_size, max_concurrent_transfers=bound)
        jobs = {i: [(A, f"/f{i:03d}.dat", E, f"/stage/f{i:03d}.dat")] for i in range(200)}
        done, snap = run_stager(s, standin, jobs)
    assert done == {i: None for i in range(200)}
    tasks = standin.log.transfer_tasks(A, E)
    assert len(tasks) == math.ceil(200 / batch_size) == snap["transfers_submitted"]
    assert sorted(t["items"] for t in tasks) == [batch_size] * (200 // batch_size)
    assert standin.log.max_active <= bound and snap["max_active_transfers"] <= bound
    if copy_delay:  # tasks lingered ACTIVE: the bound was reached, never exceeded
        assert standin.log.max_active == bound
    assert all((dirs[E] / "stage" / f"f{i:03d}.dat").read_bytes() == i.to_bytes(2, "big") * 50 for i in range(200))


def test_a_missing_file_fails_only_the_task_that_needs_it(standin, dirs, tmp_path):
    (dirs[A] / "ok1").write_text("1")
    (dirs[A] / "ok2").write_text("2")
    save_tokens(tmp_path / "t.json", {TRANSFER_RS: {"access_token": TOKEN}})
    s = settings(dirs[E], standin, tmp_path / "t.json")
    jobs = {"good": [(A, "/ok1", E, "/s/ok1"), (A, "/ok2", E, "/s/ok2")], "bad": [(A, "/ok1", E, "/s/ok1"),
                                                                                  (A, "/missing.npy", E, "/s/m")]}
    done, snap = run_stager(s, standin, jobs)
    assert done["good"] is None
    assert done["bad"].endswith(f"FILE_NOT_FOUND: No such file or directory (globus://{A}/missing.npy)")
    assert snap["transfers_submitted"] == 1          # one batch; /ok1 wanted twice, moved once
    assert standin.log.transfer_tasks(A, E)[0]["items"] == 3


def test_a_failed_transfer_task_fails_its_jobs_with_the_fatal_error(standin, dirs, tmp_path):
    (dirs[A] / "f").write_text("x")
    (dirs[E] / "taken").write_text("a file where a directory must be")
    save_tokens(tmp_path / "t.json", {TRANSFER_RS: {"access_token": TOKEN}})
    done, _ = run_stager(settings(dirs[E], standin, tmp_path / "t.json"), standin,
                         {"j": [(A, "/f", E, "/taken/f")]})
    assert "FAILED: ENDPOINT_ERROR" in done["j"] and "Globus Transfer task" in done["j"]


# --- GlobusFile --------------------------------------------------------------------------
def test_globus_file_marks_the_task_and_is_the_local_path_on_the_endpoint(monkeypatch, tmp_path):
    from skyfn.data.connectors.globus import Layout

    payload = pack_args((GlobusFile(A, "/runs/7/x.npy"), {"out": GlobusFile(B, "/r/m.npy", output=True)}), {})
    assert payload.staging == {"stage_in": [{"collection": A, "path": "/runs/7/x.npy"}],
                               "stage_out": [{"collection": B, "path": "/r/m.npy"}]}
    (gf, outs), _ = unpack_args(payload)
    assert str(gf) == f"globus://{A}/runs/7/x.npy"
    with pytest.raises(Exception, match="has no local copy here"):
        os.fspath(gf)
    monkeypatch.setenv(*next(iter(Layout(E, tmp_path).env().items())))
    assert os.fspath(gf) == str(tmp_path / ".skyfn-staging" / "in" / A / "runs/7/x.npy")
    assert str(outs["out"]) == str(tmp_path / ".skyfn-staging" / "out" / B / "r/m.npy")
    assert os.fspath(GlobusFile(E, "/mine.txt")) == str(tmp_path / "mine.txt")
    assert type(pack_args((1, 2), {})) is str
    for bad in ("relative/x", "/a/../../etc/passwd"):
        with pytest.raises(ValueError, match="GlobusFile path"):
            GlobusFile(A, bad)
    with pytest.raises(ValueError, match="collection's id"):
        GlobusFile("my-laptop", "/x")


# --- the connector -------------------------------------------------------------------------
def test_globus_connector_passes_a_100mb_array_by_ref(standin, dirs, tmp_path):
    save_tokens(tmp_path / "t.json", {TRANSFER_RS: {"access_token": TOKEN}})
    local = {"collection": E, "root": str(dirs[E]), "token_file": str(tmp_path / "t.json"),
             "transfer_url": standin.url, "poll_min": 0.02, "poll_max": 0.2}
    producer = Store("globus-p", GlobusConnector(B, "/objects", local), secret=b"k" * 32, register=False)
    array = np.random.default_rng(7).random(100 * 1024 * 1024 // 8)
    ref = producer.ref(array, owner="alice", ttl=600)
    assert list((dirs[B] / "objects").iterdir())[0].stat().st_size > 100 * 1024 * 1024
    from skyfn.data import context
    from skyfn.data.connectors import from_config
    from skyfn.data.ref import ref_info

    info = ref_info(ref)
    consumer = Store("globus-p", from_config(json.loads(json.dumps(info.connector))), secret=b"k" * 32)
    try:
        context.set_user("alice")
        got = consumer.resolve(info)
        assert np.array_equal(np.asarray(got), array)
        assert consumer.exists(info.key)
        consumer.evict(info.key)
        assert not consumer.exists(info.key) and consumer.connector.get(info.key) is None
    finally:
        context.set_user(None)
        consumer.close()
    assert not list((dirs[E] / ".skyfn-staging" / "objects").iterdir())   # scratch copies removed


# --- config ----------------------------------------------------------------------------------
def test_bad_data_globus_config_lists_allowed_names():
    from endpoint_agent.config import ConfigError, parse_config

    base = {"collection": E, "root": "/srv/globus"}
    with pytest.raises(ConfigError) as info:
        parse_config({"data": {"globus": {**base, "batch_sise": 50}}})
    msg = str(info.value)
    assert "data.globus: unknown key 'batch_sise' (value 50); allowed keys: collection, root, stage_dir, " \
           "batch_size, max_concurrent_transfers" in msg
    with pytest.raises(ConfigError, match=r"data.globus.max_concurrent_transfers: value 0 is not allowed .*"
                                          r"allowed: an integer from 1 to 100"):
        parse_config({"data": {"globus": {**base, "max_concurrent_transfers": 0}}})
    with pytest.raises(ConfigError, match=r"data.globus.collection: value 'laptop' is not allowed"):
        parse_config({"data": {"globus": {**base, "collection": "laptop"}}})
    with pytest.raises(ConfigError, match=r"data.globus.root is required"):
        parse_config({"data": {"globus": {"collection": E}}})
    cfg = parse_config({"data": {"globus": {**base, "batch_size": 50}}})
    assert (cfg.data.globus.batch_size, cfg.data.globus.max_concurrent_transfers) == (50, 5)


def test_sync_level_leaves_files_in_sync_alone(standin, dirs, tmp_path):
    (dirs[A] / "same.dat").write_bytes(b"s" * 100)
    save_tokens(tmp_path / "t.json", {TRANSFER_RS: {"access_token": TOKEN}})
    s = settings(dirs[E], standin, tmp_path / "t.json", sync_level="mtime", batch_wait=0.0)
    item = [(A, "/same.dat", E, "/s/same.dat")]
    tc = client(standin)
    for round_, expect in ((1, (1, 0)), (2, (0, 1))):
        done, _ = run_stager(s, standin, {round_: item})
        assert done == {round_: None}
        task = tc.get_task(standin.log.transfer_tasks(A, E)[-1]["task_id"])
        assert (task["files_transferred"], task["files_skipped"]) == expect
    time.sleep(0.01)
    (dirs[A] / "same.dat").write_bytes(b"n" * 100)            # newer at the source: copied again
    run_stager(s, standin, {3: item})
    assert (dirs[E] / "s" / "same.dat").read_bytes() == b"n" * 100


def test_login_flow_keeps_a_refresh_token_the_endpoint_then_uses(standin, dirs, tmp_path):
    from skyfn.data.globus_config import login

    cid = "dddddddd-4444-4444-8444-000000000004"
    standin.auth_codes.add("one-time-code")
    shown: list[str] = []
    path = login(cid, tmp_path / "ep" / "globus_tokens.json", auth_url=standin.url,
                 ask=lambda _prompt: "one-time-code", echo=shown.append)
    assert "/v2/oauth2/authorize" in shown[0] and cid in shown[0] and "code_challenge" in shown[0]
    saved = read_tokens(path)[TRANSFER_RS]
    assert saved["refresh_token"].startswith("standin-refresh-") and saved["access_token"].startswith("standin-")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert all(saved["access_token"] not in line and saved["refresh_token"] not in line for line in shown)
    s = settings(dirs[E], standin, path, client_id=cid)
    assert isinstance(authorizer(s, path), globus_sdk.RefreshTokenAuthorizer)
    assert globus_sdk.TransferClient(base_url=standin.url, authorizer=authorizer(s, path)).get_submission_id()
    with pytest.raises(globus_sdk.AuthAPIError):           # a code works once
        login(cid, tmp_path / "again.json", auth_url=standin.url, ask=lambda _p: "one-time-code", echo=shown.append)


def test_standin_cli_with_globus_sdk_environment(dirs, tmp_path, monkeypatch):
    import subprocess
    import sys

    import requests

    (dirs[A] / "cli.txt").write_text("through the CLI")
    proc = subprocess.Popen([sys.executable, "-m", "infra.local.standins.globus_transfer", "--collection", f"{A}={dirs[A]}",
                             "--collection", f"{B}={dirs[B]}", "--token", TOKEN, "--port", "0",
                             "--log", str(tmp_path / "log.json")],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = line.split("GLOBUS_SDK_SERVICE_URL_TRANSFER=")[1].strip()
        monkeypatch.setenv("GLOBUS_SDK_SERVICE_URL_TRANSFER", url)    # globus-sdk's documented setting
        tc = globus_sdk.TransferClient(authorizer=globus_sdk.AccessTokenAuthorizer(TOKEN))
        assert tc.base_url.rstrip("/") == url.rstrip("/")
        data = globus_sdk.TransferData(A, B)
        data.add_item("/cli.txt", "/got/cli.txt")
        tid = tc.submit_transfer(data)["task_id"]
        assert tc.task_wait(tid, timeout=10, polling_interval=1) and tc.get_task(tid)["status"] == "SUCCEEDED"
        assert (dirs[B] / "got" / "cli.txt").read_text() == "through the CLI"
        log = requests.get(url + "standin/log", timeout=5).json()
        assert [(t["items"], t["status"]) for t in log["tasks"]] == [(1, "SUCCEEDED")] and log["max_active"] == 1
        assert json.loads((tmp_path / "log.json").read_text())["tasks"][0]["task_id"] == tid
    finally:
        proc.terminate()
        proc.wait(10)


def test_stage_items_cannot_leave_the_staging_area(standin, dirs, tmp_path):
    """The agent does not trust the task message: '..' in a stage item fails the task; the
    service refuses such a request before (422 through the API model)."""
    import collections

    from endpoint_agent.data.staging import TaskStaging
    from skyfn.protocol.api import TaskRequest
    from skyfn.protocol.messages import TaskSpec

    class Interchange:   # what TaskStaging uses of the interchange
        def __init__(self):
            self.tasks, self.control, self.results = {}, collections.deque(), []

        def wake_up(self):
            pass

        def _add_result(self, rec, pack):
            self.results.append(rec)

    save_tokens(tmp_path / "t.json", {TRANSFER_RS: {"access_token": TOKEN}})
    ix = Interchange()
    staging = TaskStaging(ix, settings(dirs[E], standin, tmp_path / "t.json"), None)
    try:
        for field in ("stage_in", "stage_out"):
            spec = TaskSpec(task_id=f"t-{field}", function_id="f", payload="x",
                            **{field: [{"collection": A, "path": "/runs/../../../../secret"}]})
            t = [spec.task_id, "f", "x", None, 1, 0.0, 0, None, None]
            ix.tasks[7] = t
            assert staging.admit(7, t, spec) is True
            rec = ix.results[-1]
            assert rec["state"] == "FAILED" and "'..' is not allowed" in rec["reason"] and 7 not in ix.tasks
        assert staging.stager.snapshot()["transfers_submitted"] == 0
    finally:
        staging.close()
        os.environ.pop("SKYFN_GLOBUS_LOCAL", None)
    with pytest.raises(ValueError, match="without '..' components"):
        TaskRequest.model_validate({"function_id": "f", "payload": "x",
                                    "stage_out": [{"collection": A, "path": "/a/../../b"}]})


def test_a_transfer_task_that_disappears_fails_its_jobs(dirs, tmp_path):
    (dirs[A] / "f").write_text("x")
    save_tokens(tmp_path / "t.json", {TRANSFER_RS: {"access_token": TOKEN}})
    with TransferStandIn(dirs, tokens={TOKEN}, copy_delay=2.0) as standin:
        s = settings(dirs[E], standin, tmp_path / "t.json", batch_wait=0.0)

        def vanish():   # the Transfer service forgets the task (e.g. its history was deleted)
            deadline = time.monotonic() + 10
            while not standin.tasks and time.monotonic() < deadline:
                time.sleep(0.01)
            with standin.lock:
                standin.tasks.clear()

        threading.Thread(target=vanish, daemon=True).start()
        done, _ = run_stager(s, standin, {"j": [(A, "/f", E, "/g")]})
    assert "cannot be read any more (404 TaskNotFound" in done["j"]
