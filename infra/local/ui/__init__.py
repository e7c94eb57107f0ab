"""The status page of the embedded runtime, served by the local gateway at /ui: static
files (index.html, app.js, style.css), no build step. Sign-in with the REST API's token,
endpoints, recent tasks with state and latency per stage, live over the WebSocket API."""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = {"/ui": "index.html", "/ui/": "index.html", "/ui/index.html": "index.html",
         "/ui/app.js": "app.js", "/ui/style.css": "style.css"}
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8"}


def asset(path: str) -> tuple[str, bytes] | None:
    """(content type, bytes) of a page file, or None."""
    name = FILES.get(path)
    if name is None:
        return None
    file = HERE / name
    return TYPES[file.suffix], file.read_bytes()
