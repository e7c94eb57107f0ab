"""The SDK's HTTP transport: one keep-alive urllib3 connection pool with a bearer token,
JSON bodies through orjson, service errors as :class:`SkyfnAPIError`, and bounded
retries with exponential backoff for calls that are safe to repeat.

Safe to repeat means: GET and DELETE, POST /tasks/status, and POST /tasks *because it
carries an idempotency key* that the caller generated once, before the first attempt, so
a retried submission is replayed by the service instead of creating tasks twice.

By default transient failures are retried for up to ``retry_seconds`` (60 s): long enough
to ride through a restart of the service or of its Redis, so a client never turns an
outage of a few seconds into failed tasks. An explicit ``retries`` count bounds the
attempts instead (``retries=2`` gives up after three). A 429 ``backlog`` answer (the
service is reachable and has taken more than it has yet archived: docs/contracts.md) is
waited out for up to ``backlog_seconds`` (an hour) as the service's Retry-After asks,
each such answer renewing the ``retry_seconds`` window.

urllib3 rather than a ``requests.Session``: requests re-reads the environment (proxies,
CA bundle, netrc) and runs its hooks on every call, about half a millisecond each on the
single-task round trip. requests' own rules read the environment once, when the client is
made (connection_pool).
"""
from __future__ import annotations

import random
import time
from typing import Any, Optional

import orjson
import urllib3

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


def connection_pool(base_url: str, pool_size: int) -> urllib3.PoolManager:
    """A pool for `base_url`, with the proxy and CA bundle requests would choose from the
    environment (HTTP(S)_PROXY / NO_PROXY, REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE, certifi),
    read once here instead of on every call."""
    import requests
    from urllib.parse import urlsplit

    env = requests.Session().merge_environment_settings(base_url, {}, None, None, None)
    scheme = urlsplit(base_url).scheme
    kw: dict[str, Any] = {"num_pools": 2, "maxsize": pool_size, "block": False}
    if scheme == "https":
        verify = env["verify"]
        if verify is False:
            kw["cert_reqs"] = "CERT_NONE"
        else:
            kw["ca_certs"] = verify if isinstance(verify, str) else requests.certs.where()
    proxy = env["proxies"].get(scheme) or env["proxies"].get("all")
    if proxy:
        return urllib3.ProxyManager(proxy, **kw)
    return urllib3.PoolManager(**kw)


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
        backlog_seconds: float = 3600.0,
    ):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = None if retries is None else max(0, int(retries))
        self.retry_seconds = max(0.0, float(retry_seconds))
        self.backlog_seconds = max(0.0, float(backlog_seconds))
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                        "Accept": "application/json", "User-Agent": "skyfn-sdk"}
        self.pool = connection_pool(self.base_url, pool_size)

    def close(self) -> None:
        self.pool.clear()

    # -- errors ---------------------------------------------------------------------
    @staticmethod
    def _error(resp: urllib3.BaseHTTPResponse) -> SkyfnAPIError:
        code, message, details = f"http_{resp.status}", "", None
        try:
            body = orjson.loads(resp.data)
        except orjson.JSONDecodeError:
            body = None
        if isinstance(body, dict):
            code = str(body.get("error") or code)
            message = str(body.get("message") or body.get("Message") or "")
            details = body.get("details")
        if not message:
            text = resp.data.decode("utf-8", "replace") if resp.data else ""
            message = (text or resp.reason or "").strip()[:2000] or f"HTTP {resp.status}"
        return SkyfnAPIError(resp.status, code, message, details)

    # -- calls ----------------------------------------------------------------------
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
        started = time.monotonic()
        give_up = started + (self.retry_seconds if count is None else float("inf"))
        delay = self.backoff
        read_timeout = self.timeout if timeout is None else timeout
        limits = urllib3.Timeout(connect=CONNECT_TIMEOUT, read=read_timeout)
        last: Exception | None = None
        for attempt in range(attempts):
            try:
                resp = self.pool.request(method, url, body=data, headers=self.headers, timeout=limits, retries=False,
                                         redirect=False)
            except (urllib3.exceptions.HTTPError, OSError) as exc:  # connection, timeout, broken stream
                last = SkyfnConnectionError(
                    f"{method} {path}: cannot reach the skyfn service at {self.base_url} "
                    f"({type(exc).__name__}: {exc}). Is it running? Try `skyfn local status`."
                )
                last.__cause__ = exc
                wait_hint = None
            else:
                status = resp.status
                if status < 400:
                    content = resp.data
                    return orjson.loads(content) if content else None
                err = self._error(resp)
                if status not in RETRY_STATUSES or not retry:
                    raise err
                last = err
                wait_hint = resp.headers.get("Retry-After")
                if err.code == "backlog" and count is None:
                    give_up = max(give_up, min(time.monotonic() + self.retry_seconds, started + self.backlog_seconds))
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
