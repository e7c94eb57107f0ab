"""A local stand-in of the Globus Transfer API: the subset globus-sdk's TransferClient calls
for staging, serving real copies between local directories that act as collections.

    python -m infra.local.globus_transfer --collection 6f1c...=/data/a --collection 0b3e...=/data/b \\
        --token my-token [--port 8600] [--client ID=SECRET] [--log transfers.json]

then point globus-sdk at it (its documented settings; the client path is the real one):

    export GLOBUS_SDK_SERVICE_URL_TRANSFER=http://127.0.0.1:8600/
    export GLOBUS_SDK_SERVICE_URL_AUTH=http://127.0.0.1:8600/     # token refresh, client credentials
    tc = globus_sdk.TransferClient(authorizer=globus_sdk.AccessTokenAuthorizer("my-token"))

Served (version prefix /v0.10/, as globus-sdk 4.x calls it):
  GET  /submission_id                      a fresh submission id
  POST /transfer                           submit a Transfer task (TransferData); a repeated
                                           submission id answers "Duplicate" with the first task
  POST /delete                             submit a Delete task (DeleteData)
  GET  /task/<id>                          the task document: status ACTIVE | SUCCEEDED | FAILED,
                                           nice_status, fatal_error {code, description}, counts
  GET  /task_list?filter=task_id:a,b       many tasks in one call (offset/limit paging)
  GET  /task/<id>/successful_transfers     paged by marker
  GET  /task/<id>/skipped_errors           source errors skipped under skip_source_errors
  POST /task/<id>/cancel                   "Canceled", or "TaskComplete" when it has ended
  GET  /operation/endpoint/<id>/ls?path=   a directory listing
and, for globus-sdk's auth clients, POST /v2/oauth2/token (grant_type refresh_token,
client_credentials, or authorization_code for codes given with --auth-code) issuing access
tokens this server then accepts.

Tasks run asynchronously, one thread each, copying item by item (to a temporary name,
then renamed into place; parent directories are created, as Globus does). A missing
source path fails the task with Globus's fatal error FILE_NOT_FOUND "No such file or
directory" -- or, with skip_source_errors, skips the item and lists it under
skipped_errors. `log` (also GET /standin/log) records every task submitted: its type,
collections, item count, status, and the most tasks ever ACTIVE at once.
"""
from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import secrets
import shutil
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger("skyfn.local.globus")

PREFIX = "/v0.10"
TRANSFER_RESOURCE_SERVER = "transfer.api.globus.org"
TRANSFER_SCOPE = "urn:globus:auth:scope:transfer.api.globus.org:all"
PAGE = 1000  # successful_transfers / skipped_errors entries per page (Globus pages by 1000 too)


def _stamp(ts: Optional[float]) -> Optional[str]:
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
            "request_time": _stamp(self.request_time), "completion_time": _stamp(self.completion_time),
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


class TransferStandIn:
    """The server. `collections`: collection id -> the directory its "/" maps to.

    tokens: bearer tokens accepted (None: any non-empty token); clients: client id -> secret
    of confidential clients (client credentials); the token endpoint also refreshes any
    refresh token it issued or was given in `refresh_tokens`. copy_delay: seconds every
    task stays ACTIVE before it copies (to make concurrency observable)."""

    def __init__(self, collections: dict[str, str | os.PathLike], *, host: str = "127.0.0.1", port: int = 0,
                 tokens: Optional[set[str]] = None, clients: Optional[dict[str, str]] = None,
                 refresh_tokens: Optional[set[str]] = None, auth_codes: Optional[set[str]] = None,
                 token_lifetime: int = 172800,
                 copy_delay: float = 0.0, log_file: Optional[str] = None):
        self.collections = {str(cid): Path(d).resolve() for cid, d in collections.items()}
        for cid, root in self.collections.items():
            root.mkdir(parents=True, exist_ok=True)
        self.tokens = None if tokens is None else set(tokens)
        self.clients = dict(clients or {})
        self.refresh_tokens = set(refresh_tokens or ())
        self.auth_codes = set(auth_codes or ())     # one-time codes a login flow may exchange
        self.token_lifetime = token_lifetime
        self.copy_delay = copy_delay
        self.log_file = log_file
        self.log = TransferLog()
        self.tasks: dict[str, Task] = {}
        self.by_submission: dict[str, str] = {}
        self.lock = threading.Lock()
        self.token_requests = 0
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        self.thread: Optional[threading.Thread] = None

    # --- life ------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def env(self) -> dict[str, str]:
        """The environment that points globus-sdk's Transfer and Auth clients here."""
        return {"GLOBUS_SDK_SERVICE_URL_TRANSFER": self.url, "GLOBUS_SDK_SERVICE_URL_AUTH": self.url}

    def start(self) -> "TransferStandIn":
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="globus-standin", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        for task in list(self.tasks.values()):
            task.cancel.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "TransferStandIn":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if all(t.status != "ACTIVE" for t in self.tasks.values()):
                    return True
            time.sleep(0.02)
        return False

    # --- paths -----------------------------------------------------------------------
    def local_path(self, collection: str, path: str) -> Path:
        root = self.collections.get(collection)
        if root is None:
            raise APIError(404, "ClientError.NotFound", f"Endpoint {collection} not found")
        if not isinstance(path, str) or not path:
            raise APIError(400, "ClientError.BadRequest", f"Invalid path {path!r}")
        rel = path[2:] if path.startswith("~/") else path.lstrip("/")
        target = (root / rel).resolve() if rel else root
        if target != root and root not in target.parents:
            raise APIError(400, "ClientError.BadRequest", f"Path {path!r} is outside collection {collection}")
        return target

    # --- auth ------------------------------------------------------------------------
    def check_token(self, header: Optional[str]) -> str:
        if not header or not header.startswith("Bearer ") or not header[7:].strip():
            raise APIError(401, "AuthenticationFailed", "No Authorization header found")
        token = header[7:].strip()
        if self.tokens is not None and token not in self.tokens:
            raise APIError(401, "AuthenticationFailed", "Token is not active")
        return "standin-user"

    def issue_token(self, form: dict[str, str], basic: Optional[tuple[str, str]]) -> dict:
        self.token_requests += 1
        grant = form.get("grant_type")
        if grant == "refresh_token":
            refresh = form.get("refresh_token", "")
            if refresh not in self.refresh_tokens:
                raise APIError(400, "invalid_grant", "refresh token is not valid")
            new_refresh = refresh
        elif grant == "authorization_code":   # a native app's login flow (PKCE): one use per code
            if form.get("code") not in self.auth_codes or not form.get("code_verifier"):
                raise APIError(400, "invalid_grant", "authorization code is not valid")
            self.auth_codes.discard(form["code"])
            new_refresh = "standin-refresh-" + secrets.token_urlsafe(24)
            self.refresh_tokens.add(new_refresh)
        elif grant == "client_credentials":
            if basic is None or self.clients.get(basic[0]) != basic[1]:
                raise APIError(401, "invalid_client", "client credentials are not valid")
            new_refresh = None
        else:
            raise APIError(400, "unsupported_grant_type", f"grant_type {grant!r} is not supported")
        access = "standin-" + secrets.token_urlsafe(24)
        if self.tokens is not None:
            self.tokens.add(access)
        body = {"access_token": access, "expires_in": self.token_lifetime, "token_type": "Bearer",
                "resource_server": TRANSFER_RESOURCE_SERVER, "scope": TRANSFER_SCOPE, "other_tokens": [],
                "state": "_default"}
        if new_refresh:
            body["refresh_token"] = new_refresh
        return body

    # --- tasks -----------------------------------------------------------------------
    def submit(self, doc: dict, owner: str, kind: str) -> tuple[int, dict]:
        if not isinstance(doc, dict) or doc.get("DATA_TYPE") != kind.lower():
            raise APIError(400, "ClientError.BadRequest", f"Expected a {kind.lower()} document (DATA_TYPE)")
        sub = doc.get("submission_id")
        if not sub:
            raise APIError(400, "ClientError.BadRequest", "submission_id is required")
        with self.lock:
            if sub in self.by_submission:
                tid = self.by_submission[sub]
                return 200, {"DATA_TYPE": f"{kind.lower()}_result", "task_id": tid, "submission_id": sub,
                             "code": "Duplicate", "message": "A transfer with id '%s' was already submitted" % sub,
                             "resource": f"/{kind.lower()}", "request_id": uuid.uuid4().hex[:12]}
        items = doc.get("DATA") or []
        if not items:
            raise APIError(400, "ClientError.BadRequest", "A task needs at least one item (DATA)")
        if kind == "TRANSFER":
            source, dest = str(doc.get("source_endpoint")), str(doc.get("destination_endpoint"))
            for cid in (source, dest):
                if cid not in self.collections:
                    raise APIError(404, "ClientError.NotFound", f"Endpoint {cid} not found")
            for it in items:
                if not isinstance(it, dict) or "source_path" not in it or "destination_path" not in it:
                    raise APIError(400, "ClientError.BadRequest", "Transfer items need source_path and "
                                                                  "destination_path")
                self.local_path(source, it["source_path"]), self.local_path(dest, it["destination_path"])
        else:
            source, dest = str(doc.get("endpoint")), None
            if source not in self.collections:
                raise APIError(404, "ClientError.NotFound", f"Endpoint {source} not found")
            for it in items:
                self.local_path(source, it.get("path"))
        options = {k: v for k, v in doc.items() if k not in ("DATA", "DATA_TYPE")}
        task = Task(str(uuid.uuid4()), kind, source, dest, [dict(i) for i in items], options, sub,
                    doc.get("label"), owner)
        with self.lock:
            self.tasks[task.task_id] = task
            self.by_submission[sub] = task.task_id
        with self.log.lock:
            self.log.tasks.append({"task_id": task.task_id, "type": kind, "source": source, "destination": dest,
                                   "items": len(items), "status": "ACTIVE", "submitted": task.request_time,
                                   "completed": None, "label": task.label})
            self.log.active += 1
            self.log.max_active = max(self.log.max_active, self.log.active)
        self._write_log()
        threading.Thread(target=self._run, args=(task,), name=f"globus-task-{task.task_id[:8]}", daemon=True).start()
        return 202, {"DATA_TYPE": f"{kind.lower()}_result", "task_id": task.task_id, "submission_id": sub,
                     "code": "Accepted", "message": "The transfer has been accepted and a task has been created "
                                                    "and queued for execution",
                     "resource": f"/{kind.lower()}", "request_id": uuid.uuid4().hex[:12],
                     "task_link": {"DATA_TYPE": "link", "href": f"task/{task.task_id}?format=json", "rel": "related",
                                   "resource": "task", "title": "related task"}}

    def _run(self, task: Task) -> None:
        try:
            if self.copy_delay and task.cancel.wait(self.copy_delay):
                return self._finish(task, "FAILED", "CANCELED", "The task was canceled by its owner",
                                    {"code": "CANCELED", "description": "The task was canceled by its owner"})
            task.nice_status, task.started = "OK", True
            for item in task.items:
                if task.cancel.is_set():
                    return self._finish(task, "FAILED", "CANCELED", "The task was canceled by its owner",
                                        {"code": "CANCELED", "description": "The task was canceled by its owner"})
                if task.kind == "DELETE":
                    self._delete(task, item)
                    task.processed += 1
                    continue
                error = self._copy(task, item)
                task.processed += 1
                if error is None:
                    continue
                code, description = error
                if code == "FILE_NOT_FOUND" and task.options.get("skip_source_errors"):
                    task.skipped.append({"DATA_TYPE": "skipped_error", "error_code": code,
                                         "error_details": description, "error_time": _stamp(time.time()),
                                         "source_path": item["source_path"],
                                         "destination_path": item["destination_path"],
                                         "is_directory": False, "is_symlink": False, "checksum_algorithm": None,
                                         "external_checksum": None, "is_delete_destination_extra": False})
                    continue
                details = (f"Error ({'transfer' if code != 'PERMISSION_DENIED' else 'write'})\n"
                           f"Endpoint: stand-in collection {task.source}\n"
                           f"Server: 127.0.0.1\nFile: {item['source_path']}\n"
                           f"Message: 550-GlobusError: {description}")
                return self._finish(task, "FAILED", code, details, {"code": code, "description": description})
            self._finish(task, "SUCCEEDED", None, None, None)
        except Exception as exc:  # noqa: BLE001 - a stand-in bug must still end the task
            log.exception("stand-in task %s failed", task.task_id)
            self._finish(task, "FAILED", "ENDPOINT_ERROR", str(exc), {"code": "ENDPOINT_ERROR",
                                                                        "description": str(exc)})

    def _copy(self, task: Task, item: dict) -> Optional[tuple[str, str]]:
        src = self.local_path(task.source, item["source_path"])
        dst = self.local_path(task.destination, item["destination_path"])
        if not src.exists():
            return "FILE_NOT_FOUND", "No such file or directory"
        try:
            if src.is_dir():
                if not item.get("recursive"):
                    return "NOT_A_FILE", f"{item['source_path']} is a directory: set recursive"
                files = [p for p in src.rglob("*") if p.is_file()]
                copied = [self._copy_file(task, p, dst / p.relative_to(src)) for p in files]
                moved = any(copied) or not files
            else:
                moved = self._copy_file(task, src, dst)
        except FileNotFoundError:
            return "FILE_NOT_FOUND", "No such file or directory"
        except PermissionError:
            return "PERMISSION_DENIED", "Permission denied"
        except (IsADirectoryError, NotADirectoryError) as exc:
            return "ENDPOINT_ERROR", exc.strerror or str(exc)
        if moved:  # like Globus: files left alone by the sync level are not listed
            task.succeeded.append({"DATA_TYPE": "successful_transfer", "source_path": item["source_path"],
                                   "destination_path": item["destination_path"]})
        return None

    @staticmethod
    def _in_sync(level: Any, src: Path, dst: Path) -> bool:
        """Globus's sync levels: 0/exists, 1/size, 2/mtime (destination not older), 3/checksum."""
        if level is None or not dst.is_file():
            return False
        level = {"exists": 0, "size": 1, "mtime": 2, "checksum": 3}.get(level, level)
        a, b = src.stat(), dst.stat()
        if level == 0:
            return True
        if level == 1:
            return a.st_size == b.st_size
        if level == 2:
            return a.st_size == b.st_size and b.st_mtime >= a.st_mtime
        import hashlib

        digest = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (src, dst)]
        return digest[0] == digest[1]

    def _copy_file(self, task: Task, src: Path, dst: Path) -> bool:
        if self._in_sync(task.options.get("sync_level"), src, dst):
            task.files_skipped += 1
            return False
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.globus-{task.task_id[:8]}.part")
        try:
            shutil.copyfile(src, tmp)
            if task.options.get("preserve_timestamp") or task.options.get("sync_level") in ("mtime", 2):
                st = src.stat()
                os.utime(tmp, (st.st_atime, st.st_mtime))
            os.replace(tmp, dst)
        finally:
            if tmp.exists():
                tmp.unlink()
        task.bytes_transferred += dst.stat().st_size
        task.files_transferred += 1
        return True

    def _delete(self, task: Task, item: dict) -> None:
        target = self.local_path(task.source, item["path"])
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
        task.succeeded.append({"DATA_TYPE": "successful_delete", "path": item["path"]})

    def _finish(self, task: Task, status: str, nice: Optional[str], details: Optional[str],
                fatal: Optional[dict]) -> None:
        with self.lock:
            task.status, task.nice_status, task.nice_details, task.fatal_error = status, nice, details, fatal
            task.completion_time = time.time()
        with self.log.lock:
            self.log.active -= 1
            for rec in self.log.tasks:
                if rec["task_id"] == task.task_id:
                    rec.update(status=status, completed=task.completion_time,
                               fatal_error=fatal, succeeded=len(task.succeeded), skipped=len(task.skipped))
        self._write_log()

    def _write_log(self) -> None:
        if self.log_file:
            tmp = self.log_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.log.snapshot(), f, indent=1)
            os.replace(tmp, self.log_file)

    def task(self, task_id: str) -> Task:
        with self.lock:
            task = self.tasks.get(task_id)
        if task is None:
            raise APIError(404, "TaskNotFound", f"Task ID {task_id} not found")
        return task

    def cancel(self, task_id: str) -> dict:
        task = self.task(task_id)
        rid = uuid.uuid4().hex[:12]
        if task.status != "ACTIVE":
            return {"DATA_TYPE": "result", "code": "TaskComplete", "message": "Can't cancel a task that has "
                    "already completed", "resource": f"/task/{task_id}/cancel", "request_id": rid}
        task.cancel.set()
        end = time.monotonic() + 10
        while task.status == "ACTIVE" and time.monotonic() < end:
            time.sleep(0.01)
        return {"DATA_TYPE": "result", "code": "Canceled", "message": "The task has been cancelled successfully.",
                "resource": f"/task/{task_id}/cancel", "request_id": rid}

    def task_list(self, query: dict[str, str]) -> dict:
        wanted: dict[str, set[str]] = {}
        for part in (query.get("filter") or "").split("/"):
            if ":" in part:
                k, v = part.split(":", 1)
                wanted[k] = set(v.split(","))
        with self.lock:
            tasks = [t for t in self.tasks.values()
                     if ("task_id" not in wanted or t.task_id in wanted["task_id"])
                     and ("status" not in wanted or t.status in wanted["status"])
                     and ("type" not in wanted or t.kind in wanted["type"])]
        tasks.sort(key=lambda t: t.request_time, reverse=True)
        offset, limit = int(query.get("offset") or 0), min(1000, int(query.get("limit") or 10))
        page = tasks[offset:offset + limit]
        return {"DATA_TYPE": "task_list", "offset": offset, "limit": limit, "total": len(tasks),
                "length": len(page), "DATA": [t.document(self.collections) for t in page]}

    def paged(self, entries: list[dict], kind: str, marker: Optional[str]) -> dict:
        start = int(marker or 0)
        page = entries[start:start + PAGE]
        nxt = start + PAGE if start + PAGE < len(entries) else None
        return {"DATA_TYPE": kind, "marker": start, "next_marker": nxt, "DATA": page}

    def ls(self, collection: str, path: str) -> dict:
        target = self.local_path(collection, path or "/")
        if not target.exists():
            raise APIError(404, "ClientError.NotFound", f"Directory '{path}' not found on endpoint {collection}")
        if not target.is_dir():
            raise APIError(502, "ExternalError.DirListingFailed.NotDirectory", f"'{path}' is not a directory")
        data = []
        for p in sorted(target.iterdir()):
            st = p.stat()
            data.append({"DATA_TYPE": "file", "name": p.name, "type": "dir" if p.is_dir() else "file",
                         "size": st.st_size, "last_modified": _stamp(st.st_mtime), "permissions": oct(st.st_mode & 0o777)[2:],
                         "user": "standin", "group": "standin", "link_target": None})
        return {"DATA_TYPE": "file_list", "endpoint": collection, "path": path, "absolute_path": path,
                "DATA": data, "length": len(data), "total": len(data)}


def _handler(server: TransferStandIn) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:  # headers carry tokens: log nothing of them
            log.debug("%s %s", self.command, self.path.split("?")[0])

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> bytes:
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        def _dispatch(self) -> None:
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            path = parts.path.rstrip("/") or "/"
            body = self._body()
            try:
                if path == "/v2/oauth2/token" and self.command == "POST":
                    form = {k: v[-1] for k, v in parse_qs(body.decode()).items()}
                    basic = None
                    auth = self.headers.get("Authorization") or ""
                    if auth.startswith("Basic "):
                        cid, _, secret = base64.b64decode(auth[6:]).decode().partition(":")
                        basic = (cid, secret)
                    return self._send(200, server.issue_token(form, basic))
                if path == "/standin/log":
                    return self._send(200, server.log.snapshot())
                if not path.startswith(PREFIX + "/"):
                    raise APIError(404, "ClientError.NotFound", f"No such resource {path}")
                owner = server.check_token(self.headers.get("Authorization"))
                route = path[len(PREFIX):].split("/")[1:]
                if route == ["submission_id"] and self.command == "GET":
                    return self._send(200, {"DATA_TYPE": "submission_id", "value": str(uuid.uuid4())})
                if route in (["transfer"], ["delete"]) and self.command == "POST":
                    try:
                        doc = json.loads(body or b"{}")
                    except ValueError:
                        raise APIError(400, "ClientError.BadRequest", "The body is not JSON") from None
                    return self._send(*server.submit(doc, owner, route[0].upper()))
                if route == ["task_list"] and self.command == "GET":
                    return self._send(200, server.task_list(query))
                if len(route) == 2 and route[0] == "task" and self.command == "GET":
                    return self._send(200, server.task(route[1]).document(server.collections))
                if len(route) == 3 and route[0] == "task":
                    task = server.task(route[1])
                    if route[2] == "successful_transfers" and self.command == "GET":
                        return self._send(200, server.paged(task.succeeded, "successful_transfers",
                                                            query.get("marker")))
                    if route[2] == "skipped_errors" and self.command == "GET":
                        return self._send(200, server.paged(task.skipped, "skipped_errors", query.get("marker")))
                    if route[2] == "cancel" and self.command == "POST":
                        return self._send(200, server.cancel(route[1]))
                if len(route) == 4 and route[:2] == ["operation", "endpoint"] and route[3] == "ls":
                    return self._send(200, server.ls(route[2], query.get("path", "/")))
                raise APIError(404, "ClientError.NotFound", f"No such resource {self.command} {path}")
            except APIError as exc:
                body_out: dict[str, Any] = {"code": exc.code, "message": exc.message, "request_id":
                                            uuid.uuid4().hex[:12], "resource": path}
                if path == "/v2/oauth2/token":
                    body_out = {"error": exc.code, "error_description": exc.message}
                return self._send(exc.status, body_out)

        do_GET = do_POST = do_PUT = do_DELETE = _dispatch

    return Handler


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.local.globus_transfer", description=__doc__.split("\n\n")[0])
    ap.add_argument("--collection", action="append", default=[], metavar="ID=DIR", required=True,
                    help="a collection: its id and the directory its '/' maps to (repeat)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8600)
    ap.add_argument("--token", action="append", default=None, metavar="TOKEN",
                    help="a bearer token to accept (repeat); none given: any token is accepted")
    ap.add_argument("--refresh-token", action="append", default=[], metavar="TOKEN",
                    help="a refresh token the token endpoint accepts (repeat)")
    ap.add_argument("--auth-code", action="append", default=[], metavar="CODE",
                    help="a one-time authorization code a login flow may exchange (repeat)")
    ap.add_argument("--client", action="append", default=[], metavar="ID=SECRET",
                    help="a confidential client for client credentials (repeat)")
    ap.add_argument("--copy-delay", type=float, default=0.0, help="seconds each task waits before copying")
    ap.add_argument("--log", default=None, metavar="FILE", help="keep the task log in this JSON file too")
    args = ap.parse_args(argv)
    collections = {}
    for spec in args.collection:
        cid, sep, directory = spec.partition("=")
        if not sep or not cid or not directory:
            ap.error(f"--collection {spec!r}: expected ID=DIR")
        collections[cid] = directory
    clients = {}
    for spec in args.client:
        cid, sep, secret = spec.partition("=")
        if not sep:
            ap.error(f"--client {spec!r}: expected ID=SECRET")
        clients[cid] = secret
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    server = TransferStandIn(collections, host=args.host, port=args.port,
                             tokens=set(args.token) if args.token else None, clients=clients,
                             refresh_tokens=set(args.refresh_token), auth_codes=set(args.auth_code),
                             copy_delay=args.copy_delay, log_file=args.log)
    print(f"Globus Transfer stand-in on {server.url} ({len(collections)} collection(s)); "
          f"export GLOBUS_SDK_SERVICE_URL_TRANSFER={server.url}", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
