"""What the Globus Transfer stand-in (infra/local/standins/globus_transfer) keeps: a task and its
Globus document, the log of tasks tests read, the API's constants and its error answer."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

PREFIX = "/v0.10"
TRANSFER_RESOURCE_SERVER = "transfer.api.globus.org"
TRANSFER_SCOPE = "urn:globus:auth:scope:transfer.api.globus.org:all"
PAGE = 1000  # successful_transfers / skipped_errors entries per page (Globus pages by 1000 too)


def stamp(ts: Optional[float]) -> Optional[str]:
    """Globus's time format: '2026-11-25 01:02:03+00:00'."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S+00:00")


class APIError(Exception):
    """An error answer with Globus's body shape {code, message, request_id, resource}."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class Task:
    task_id: str
    kind: str                      # TRANSFER | DELETE
    source: str
    destination: Optional[str]
    items: list[dict]
    options: dict
    submission_id: str
    label: Optional[str]
    owner: str
    request_time: float = field(default_factory=time.time)
    status: str = "ACTIVE"
    started: bool = False
    completion_time: Optional[float] = None
    nice_status: Optional[str] = "Queued"
    nice_details: Optional[str] = None
    fatal_error: Optional[dict] = None
    succeeded: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    bytes_transferred: int = 0
    files_transferred: int = 0
    files_skipped: int = 0          # left alone by the sync level (already up to date)
    processed: int = 0              # items done so far (copied, in sync or skipped)
    cancel: threading.Event = field(default_factory=threading.Event)

    def document(self, collections: dict[str, Path]) -> dict:
        n = len(self.items)
        done = self.status != "ACTIVE"
        elapsed = ((self.completion_time or time.time()) - self.request_time) or 1e-6
        failed = 1 if self.status == "FAILED" else 0
        return {
            "DATA_TYPE": "task", "task_id": self.task_id, "type": self.kind, "status": self.status,
            "label": self.label, "owner_id": self.owner, "username": self.owner,
            "source_endpoint_id": self.source, "destination_endpoint_id": self.destination,
            "source_endpoint_display_name": f"stand-in collection {self.source}",
            "destination_endpoint_display_name": (f"stand-in collection {self.destination}"
                                                  if self.destination else None),
            "request_time": stamp(self.request_time), "completion_time": stamp(self.completion_time),
            "deadline": self.options.get("deadline"),
            "nice_status": None if self.status == "SUCCEEDED" else self.nice_status,
            "nice_status_short_description": (None if self.nice_status is None or self.status == "SUCCEEDED"
                                              else self.nice_status.replace("_", " ").lower()),
            "nice_status_details": self.nice_details, "nice_status_expires_in": -1 if done else None,
            "fatal_error": self.fatal_error, "is_ok": None if done else self.fatal_error is None,
            "is_paused": False, "canceled_by_admin": None, "canceled_by_admin_message": None,
            "history_deleted": False,
            "files": n if self.kind == "TRANSFER" else 0, "directories": 0, "symlinks": 0,
            "delete_destination_extra": bool(self.options.get("delete_destination_extra")),
            "files_transferred": self.files_transferred, "files_skipped": self.files_skipped,
            "bytes_transferred": self.bytes_transferred, "bytes_checksummed": 0,
            "effective_bytes_per_second": int(self.bytes_transferred / elapsed),
            "subtasks_total": n, "subtasks_succeeded": len(self.succeeded),
            "subtasks_pending": 0 if done else n - self.processed,
            "subtasks_failed": failed, "subtasks_retrying": 0, "subtasks_expired": 0,
            "subtasks_canceled": n - len(self.succeeded) - len(self.skipped) if self.status == "FAILED" else 0,
            "subtasks_skipped_errors": len(self.skipped),
            "sync_level": self.options.get("sync_level"), "verify_checksum": bool(self.options.get("verify_checksum")),
            "encrypt_data": bool(self.options.get("encrypt_data")),
            "skip_source_errors": bool(self.options.get("skip_source_errors")),
            "fail_on_quota_errors": bool(self.options.get("fail_on_quota_errors")),
            "preserve_timestamp": bool(self.options.get("preserve_timestamp")),
            "recursive_symlinks": "ignore", "submission_id": self.submission_id,
        }


class TransferLog:
    """What tests read: every task submitted and the most ACTIVE at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tasks: list[dict] = []
        self.active = 0
        self.max_active = 0

    def transfer_tasks(self, source: Optional[str] = None, destination: Optional[str] = None) -> list[dict]:
        with self.lock:
            return [dict(t) for t in self.tasks if t["type"] == "TRANSFER"
                    and (source is None or t["source"] == source)
                    and (destination is None or t["destination"] == destination)]

    def snapshot(self) -> dict:
        with self.lock:
            return {"tasks": [dict(t) for t in self.tasks], "max_active": self.max_active, "active": self.active}

    def reset(self) -> None:
        with self.lock:
            self.tasks.clear()
            self.max_active = self.active
