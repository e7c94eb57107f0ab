"""The endpoint's audit log: who ran what as whom, one JSON object per line.

Each record (`AuditLog.record(...)`) holds the submitting identity (id, username, email,
identity_provider), the mapped account and its uid, the function (id, name), the task id,
start and end (ISO 8601, UTC, milliseconds), the outcome (SUCCEEDED, FAILED, TIMED_OUT,
CANCELLED, REFUSED for a task refused before it ran, or UNCONFIRMED for a lane's task whose
final state the service did not confirm in time: multiuser/audit_confirm.py) with an
optional reason, and when it was written. Values are JSON-encoded, so a newline in a
username cannot forge a line.

A *disagreement* (`AuditLog.disagreement(...)`) is a line of another shape: what a user agent
reported about a task that does not match the routing record (multiuser/routes.py) or the
service's final state -- a task not routed to it, another identity or function, another
outcome than the service's -- with the agent (account, uid, key), the reason, and the
claim as received (`claimed`, strings cut at MAX_CLAIM characters). It has no top-level
`task_id`: it is never a task's record.

The file is the privileged process's alone: created 0600 (O_CREAT, never through a symlink:
O_NOFOLLOW), and an existing one must be a regular file owned by the writer with no group
or other permission bits, else `AuditLogError` says what is wrong and the fix (chmod/chown).
Records are appended with O_APPEND, each in a single write() of the whole line under a
lock, so lines of several threads (and of several processes appending to the same file)
never interleave: a reader sees whole lines only.
"""
from __future__ import annotations

import errno
import json
import os
import stat
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Optional

from endpoint_agent.errors import ConfigError

OUTCOMES = ("SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "REFUSED", "UNCONFIRMED")
MAX_CLAIM = 256  # characters of each string of a disagreeing claim kept in its line
IDENTITY_FIELDS = ("id", "username", "email", "identity_provider")


class AuditLogError(ConfigError):
    """The audit log cannot be written safely; the message says why and the fix."""


def iso(ts: Optional[float]) -> Optional[str]:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _cut(value: Any, depth: int = 0) -> Any:
    """A claim made safe to keep: strings cut, at most 32 items per level, 3 levels deep."""
    if isinstance(value, str):
        return value if len(value) <= MAX_CLAIM else value[:MAX_CLAIM] + "..."
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    if depth >= 3:
        return "..."
    if isinstance(value, dict):
        return {_cut(str(k)): _cut(v, depth + 1) for k, v in list(value.items())[:32]}
    if isinstance(value, (list, tuple)):
        return [_cut(v, depth + 1) for v in list(value)[:32]]
    return _cut(repr(value))


class AuditLog:
    """An open audit log; thread-safe. Use as a context manager or close() it."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o600)
        except FileNotFoundError:
            raise AuditLogError(f"audit log {self.path}: its directory {self.path.parent} does not exist; create it "
                                "or change audit_log") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise AuditLogError(f"audit log {self.path} is a symlink; the audit log must be a regular file: "
                                    f"remove the link") from None
            raise AuditLogError(f"audit log {self.path} cannot be opened: {exc}") from None
        try:
            self._check(os.fstat(fd))
        except AuditLogError:
            os.close(fd)
            raise
        self._fd: Optional[int] = fd

    def _check(self, st: os.stat_result) -> None:
        me = os.geteuid()
        if not stat.S_ISREG(st.st_mode):
            raise AuditLogError(f"audit log {self.path} is not a regular file")
        if st.st_uid != me:
            raise AuditLogError(f"audit log {self.path} belongs to uid {st.st_uid}, not to the endpoint's account (uid "
                                f"{me}): chown {me} {self.path}, or choose another audit_log")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise AuditLogError(f"audit log {self.path} is accessible to group or others (mode {mode:04o}); it must "
                                f"be the endpoint's alone: chmod 600 {self.path}")

    def record(self, *, identity: Mapping[str, Any], account: Optional[str], uid: Optional[int],
               function_id: Optional[str], function_name: Optional[str], task_id: str, start: Optional[float],
               end: Optional[float], outcome: str, reason: Optional[str] = None) -> dict:
        """Append one record; returns it as written."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
        entry = {
            "time": iso(time.time()),
            "identity": {k: identity.get(k) for k in IDENTITY_FIELDS},
            "account": account,
            "uid": uid,
            "function": {"id": function_id, "name": function_name},
            "task_id": task_id,
            "start": iso(start),
            "end": iso(end),
            "outcome": outcome,
        }
        if reason is not None:
            entry["reason"] = reason
        self._write(entry)
        return entry

    def disagreement(self, *, account: str, uid: int, user_agent: str, reason: str, claimed: Any) -> dict:
        """Append a disagreement line (see the module docstring); returns it as written."""
        entry = {"time": iso(time.time()), "disagreement": reason,
                 "user_agent": {"key": user_agent, "account": account, "uid": uid}, "claimed": _cut(claimed)}
        self._write(entry)
        return entry

    def _write(self, entry: dict) -> None:
        line = (json.dumps(entry, ensure_ascii=False, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
            if self._fd is None:
                raise AuditLogError(f"audit log {self.path} is closed")
            written = os.write(self._fd, line)
            if written != len(line):  # a full disk; a short line is better than a lost one, but say so
                raise AuditLogError(f"audit log {self.path}: wrote {written} of {len(line)} bytes of a record "
                                    "(disk full?)")

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> "AuditLog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
