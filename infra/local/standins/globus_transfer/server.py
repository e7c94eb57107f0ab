"""TransferStandIn, the Globus Transfer stand-in (infra/local/standins/globus_transfer): its
collections, tokens and tasks, the API operations on them (submit, task documents, cancel,
task lists, directory listings, the token endpoint) and its HTTP server's life; the copying
is the engine's, the HTTP routes are routes'."""
from __future__ import annotations

import os
import secrets
import threading
import time
import uuid
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

from infra.local.standins.globus_transfer.engine import CopyEngine
from infra.local.standins.globus_transfer.model import (PAGE, TRANSFER_RESOURCE_SERVER, TRANSFER_SCOPE, APIError, Task,
                                               TransferLog, stamp)
from infra.local.standins.globus_transfer.routes import handler_class


class TransferStandIn(CopyEngine):
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
        self.httpd = ThreadingHTTPServer((host, port), handler_class(self))
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
                         "size": st.st_size, "last_modified": stamp(st.st_mtime), "permissions": oct(st.st_mode & 0o777)[2:],
                         "user": "standin", "group": "standin", "link_target": None})
        return {"DATA_TYPE": "file_list", "endpoint": collection, "path": path, "absolute_path": path,
                "DATA": data, "length": len(data), "total": len(data)}
