"""The status page (/ui), one copy for both places that serve it: the embedded runtime's
gateway (infra/local/standins/gateway.py) and, in AWS, the UI function behind the REST API
(lambdas/ui.py). The files (index.html, app.js, style.css; no build step) hold no data:
everything the page shows comes from the REST and WebSocket APIs with the token the user
signs in with.

``serve`` is the whole behaviour, so both places answer alike: which paths exist, their
content types, revalidated caching (ETag), the security headers with a strict
Content-Security-Policy, the page's base URL (``<base href>``: the REST API puts its stage
in front of /ui), and config.json, which tells app.js where the APIs are. Only the fixed
file names below are ever read: no request path reaches the file system.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
PREFIX = "/ui"
DEFAULT_BASE = "/ui/"
FILES = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
         "style.css": "text/css; charset=utf-8"}
CONFIG = "config.json"
JSON_TYPE = "application/json"
_BASE_TAG = f'<base href="{DEFAULT_BASE}">'
_SAFE_BASE = re.compile(r"^(/[A-Za-z0-9._~-]+)*/ui/$")
_SAFE_ORIGIN = re.compile(r"^(https?|wss?)://[A-Za-z0-9.-]+(:\d{1,5})?$")
NOT_FOUND = ("no such file of the status page: open /ui/ (its files are index.html, app.js, style.css "
             "and config.json)")


@dataclass(frozen=True)
class PageConfig:
    """Where the page finds the APIs (config.json). URLs may be relative to the page's
    origin ("/", "/ws") or absolute (AWS: the WebSocket API has its own host)."""
    api_url: str
    ws_url: str | None
    connect_src: tuple[str, ...] = field(default=())  # origins beyond 'self' the page may call

    def body(self) -> bytes:
        return json.dumps({"api_url": self.api_url, "ws_url": self.ws_url}, sort_keys=True).encode()


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def origin(url: str | None) -> str | None:
    """scheme://host[:port] of an absolute URL; None for relative or malformed ones."""
    if not url:
        return None
    parts = urlsplit(url)
    found = f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""
    return found if _SAFE_ORIGIN.match(found) else None


def security_headers(config: PageConfig) -> dict[str, str]:
    connect = " ".join(dict.fromkeys(["'self'", *(o for o in config.connect_src if _SAFE_ORIGIN.match(o))]))
    return {
        "Content-Security-Policy": (f"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                    f"connect-src {connect}; base-uri 'self'; form-action 'none'; "
                                    "frame-ancestors 'none'"),
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
        "Cross-Origin-Opener-Policy": "same-origin",
    }


@lru_cache(maxsize=len(FILES))
def _read(name: str) -> bytes:
    return (HERE / name).read_bytes()


def _index(base: str) -> bytes:
    page = _read("index.html")
    if base == DEFAULT_BASE or not _SAFE_BASE.match(base):
        return page
    return page.replace(_BASE_TAG.encode(), f'<base href="{base}">'.encode(), 1)


def serve(path: str, config: PageConfig, *, base: str = DEFAULT_BASE, if_none_match: str | None = None) -> Answer:
    """The answer to GET `path` (no query string): /ui, /ui/ and /ui/index.html are the page,
    /ui/<file> one of its files, /ui/config.json `config`; anything else is a 404."""
    headers = security_headers(config)
    if path in (PREFIX, PREFIX + "/"):
        name = "index.html"
    elif path.startswith(PREFIX + "/"):
        name = path[len(PREFIX) + 1:]
    else:
        name = ""
    if name in FILES:
        ctype, body = FILES[name], _index(base) if name == "index.html" else _read(name)
    elif name == CONFIG:
        ctype, body = JSON_TYPE, config.body()
    else:
        return Answer(404, {"Content-Type": JSON_TYPE, "Cache-Control": "no-store", **headers},
                      json.dumps({"error": "not_found", "message": NOT_FOUND}).encode())
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    # no-cache: a browser keeps the files but asks each time, so a new deployment is seen at once
    headers.update({"Content-Type": ctype, "Cache-Control": "no-cache", "ETag": etag})
    if if_none_match and etag in {tag.strip() for tag in if_none_match.split(",")}:
        return Answer(304, headers, b"")
    return Answer(200, headers, body)
