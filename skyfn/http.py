"""The SDK's HTTP transport: one keep-alive ``requests.Session`` with a bearer token,
JSON bodies through orjson, service errors as :class:`SkyfnAPIError`, and bounded
retries with exponential backoff for calls that are safe to repeat.

Safe to repeat means: GET and DELETE, POST /tasks/status, and POST /tasks *because it
carries an idempotency key* that the caller generated once, before the first attempt, so
a retried submission is replayed by the service instead of creating tasks twice.

By default transient failures are retried for up to ``retry_seconds`` (60 s): long enough
to ride through a restart of the service or of its Redis, so a client never turns an
outage of a few seconds into failed tasks. An explicit ``retries`` count bounds the
attempts instead (``retries=2`` gives up after three).
"""
from __future__ import annotations

import random
import time
from typing import Any, Optional

import orjson
import requests
from requests.auth import AuthBase

from skyfn.protocol.errors import SkyfnError

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
CONNECT_TIMEOUT = 10.0


class SkyfnAPIError(SkyfnError):
    """The service answered with an error: ``status`` (HTTP), ``code`` and ``message`` as
    the service wrote them (``{"error": code, "message": text}``)."""

    def __init__(self, status: int, code: str, message: str, details: Any = None):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details


class TaskNotFound(SkyfnAPIError, LookupError):
    """The service does not know this task id (never submitted, not yours, or purged)."""

    def __init__(self, task_id: str, message: str | None = None):
        super().__init__(404, "not_found", message or f"unknown task {task_id}")
        self.task_id = task_id


class SkyfnConnectionError(SkyfnError, ConnectionError):
    """The service could not be reached (after retries)."""


class _Bearer(AuthBase):
    # Setting auth on the session also spares requests a ~/.netrc lookup per request.
    def __init__(self, token: str):
        self.header = f"Bearer {token}"

    def __call__(self, r):
        r.headers["Authorization"] = self.header
        return r


class HttpClient:
    """JSON over one keep-alive session. Thread-safe enough for the SDK's use: the
    session's connection pool is shared by the caller's threads and the Executor's."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 60.0,
        retries: Optional[int] = None,
        backoff: float = 0.05,
        max_backoff: float = 2.0,
        pool_size: int = 16,
        retry_seconds: float = 60.0,
    ):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = None if retries is None else max(0, int(retries))
        self.retry_seconds = max(0.0, float(retry_seconds))
        self.backoff = backoff
        self.max_backoff = max_backoff
        s = requests.Session()
        s.auth = _Bearer(token)
        s.headers.update({"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "skyfn-sdk"})
        adapter = requests.adapters.HTTPAdapter(pool_connections=2, pool_maxsize=pool_size)
        s.mount("http://", adapter)
        s.mount("https://", adapter)
        self.session = s

    def close(self) -> None:
        self.session.close()

    # -- errors ---------------------------------------------------------------------
    @staticmethod
    def _error(resp: requests.Response) -> SkyfnAPIError:
        code, message, details = f"http_{resp.status_code}", "", None
        try:
            body = orjson.loads(resp.content)
        except orjson.JSONDecodeError:
            body = None
        if isinstance(body, dict):
            code = str(body.get("error") or code)
            message = str(body.get("message") or body.get("Message") or "")
            details = body.get("details")
        if not message:
            message = (resp.text or resp.reason or "").strip()[:2000] or f"HTTP {resp.status_code}"
        return SkyfnAPIError(resp.status_code, code, message, details)

    # -- requests -------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        retry: bool = True,
        timeout: Optional[float] = None,
        retries: Optional[int] = None,
    ) -> Any:
        """Send one call and return its decoded JSON answer (None when empty).

        With ``retry``, connection errors, timeouts, 429 and 5xx answers are retried with
        exponential backoff and jitter, re-sending the very same bytes (hence the same
        idempotency key): ``retries`` more times if a count is set, else for up to
        ``retry_seconds``. 4xx answers raise at once.
        """
        url = self.base_url + path
        data = orjson.dumps(body) if body is not None else None
        count = self.retries if retries is None else retries
        attempts = 1 + (count if count is not None else 1 << 30) if retry else 1
        give_up = time.monotonic() + (self.retry_seconds if count is None else float("inf"))
        delay = self.backoff
        read_timeout = self.timeout if timeout is None else timeout
        last: Exception | None = None
        for attempt in range(attempts):
            try:
                resp = self.session.request(method, url, data=data, timeout=(CONNECT_TIMEOUT, read_timeout))
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
                last = SkyfnConnectionError(
                    f"{method} {path}: cannot reach the skyfn service at {self.base_url} "
                    f"({type(exc).__name__}: {exc}). Is it running? Try `skyfn local status`."
                )
                last.__cause__ = exc
                wait_hint = None
            else:
                status = resp.status_code
                if status < 400:
                    content = resp.content
                    return orjson.loads(content) if content else None
                err = self._error(resp)
                if status not in RETRY_STATUSES or not retry:
                    raise err
                last = err
                wait_hint = resp.headers.get("Retry-After")
            if attempt + 1 >= attempts or time.monotonic() >= give_up:
                break
            pause = delay * (0.5 + random.random())
            if wait_hint:
                try:
                    pause = max(pause, min(float(wait_hint), 30.0))
                except ValueError:
                    pass
            time.sleep(pause)
            delay = min(delay * 2, self.max_backoff)
        assert last is not None
        raise last

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any, **kw: Any) -> Any:
        return self.request("POST", path, body, **kw)

    def delete(self, path: str, **kw: Any) -> Any:
        return self.request("DELETE", path, **kw)
