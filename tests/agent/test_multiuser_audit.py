"""endpoint_agent.multiuser.audit (issue 23): a 0600 file of the writer's, whole JSON lines, from
many threads at once."""
from __future__ import annotations

import json
import os
import stat
import threading

import pytest

from endpoint_agent.multiuser.audit import AuditLog, AuditLogError

ALICE = {"id": "8c1d3c7e-9f0a-4a55-9a53-3f4d2a1b0c01", "username": "alice@example.org", "email": "alice@example.org",
         "identity_provider": "b1f0c8a2-7d3e-4f5a-8b6c-9d0e1f2a3b4c"}


def _record(log, task_id="t-1", **kw):
    args = dict(identity=ALICE, account="alice", uid=1001, function_id="f-1", function_name="simulate",
                task_id=task_id, start=1_700_000_000.0, end=1_700_000_001.25, outcome="SUCCEEDED")
    args.update(kw)
    return log.record(**args)


def test_records_are_json_lines_in_a_0600_file_of_the_writer(tmp_path):
    path = tmp_path / "audit.log"
    with AuditLog(path) as log:
        _record(log)
        _record(log, task_id="t-2", identity={"id": "x", "username": "eve\n{\"forged\": true}"}, account=None,
                uid=None, outcome="REFUSED", reason="identity eve maps to no local account on endpoint site-ep")
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    lines = path.read_text().splitlines()
    assert len(lines) == 2  # the newline in a username is escaped, never a line of its own
    first, second = map(json.loads, lines)
    assert {k: v for k, v in first.items() if k != "time"} == {
        "identity": ALICE, "account": "alice", "uid": 1001, "function": {"id": "f-1", "name": "simulate"},
        "task_id": "t-1", "start": "2023-11-14T22:13:20.000Z", "end": "2023-11-14T22:13:21.250Z",
        "outcome": "SUCCEEDED"}
    assert first["time"].endswith("Z")
    assert second["identity"] == {"id": "x", "username": "eve\n{\"forged\": true}", "email": None,
                                  "identity_provider": None}
    assert (second["outcome"], second["account"], second["uid"]) == ("REFUSED", None, None)
    assert second["reason"].startswith("identity eve maps to no local account")
    with AuditLog(path) as log:  # reopened: appended to
        _record(log, task_id="t-3")
    assert [json.loads(line)["task_id"] for line in path.read_text().splitlines()] == ["t-1", "t-2", "t-3"]


def test_a_log_others_may_read_or_that_is_not_the_writers_is_refused(tmp_path):
    path = tmp_path / "audit.log"
    path.write_text("")
    path.chmod(0o644)
    with pytest.raises(AuditLogError) as info:
        AuditLog(path)
    assert str(info.value) == (f"audit log {path} is accessible to group or others (mode 0644); it must be the "
                               f"endpoint's alone: chmod 600 {path}")
    path.chmod(0o600)
    link = tmp_path / "link.log"
    link.symlink_to(path)
    with pytest.raises(AuditLogError, match="is a symlink"):
        AuditLog(link)
    with pytest.raises(AuditLogError, match="its directory .* does not exist"):
        AuditLog(tmp_path / "no" / "audit.log")
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)
        with pytest.raises(AuditLogError, match=f"belongs to uid 65534, not to the endpoint's account \\(uid 0\\): "
                                                f"chown 0 {path}"):
            AuditLog(path)
    with AuditLog(tmp_path / "ok.log") as log, pytest.raises(ValueError, match="outcome 'DONE' is not one of"):
        _record(log, outcome="DONE")


def test_many_threads_append_whole_lines(tmp_path):
    path = tmp_path / "audit.log"
    threads, per_thread = 8, 250
    long_name = "x" * 3000  # records well past a pipe buffer's atomic size, still one write each
    with AuditLog(path) as log:
        def work(n):
            for i in range(per_thread):
                _record(log, task_id=f"t-{n}-{i}", function_name=long_name if i % 10 == 0 else "f")

        pool = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    records = [json.loads(line) for line in lines[:-1]]
    assert sorted(r["task_id"] for r in records) == sorted(f"t-{n}-{i}" for n in range(threads)
                                                           for i in range(per_thread))
    assert all(r["outcome"] == "SUCCEEDED" and r["identity"] == ALICE for r in records)
