"""The status page in AWS: GET /ui and GET /ui/{proxy+} on the REST API (infra/aws/stacks/
status_page.py), without an authorizer: the files hold no data, and every call the page
makes carries the user's token. It answers exactly as the embedded runtime's gateway does
(lambdas.ui_assets.serve); only config.json differs:

- ``api_url``: SKYFN_API_URL if set, else the REST API the page came from (its stage path,
  same origin, so no CORS and a custom domain keeps working);
- ``ws_url``: SKYFN_WS_URL, the WebSocket API's URL (set by the stack; its own host, so it
  is also the page's one connect-src beyond 'self'). Unset, the page refreshes without push.

The function reads no store, queue or secret: its role has none.
"""
from __future__ import annotations

import os
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError

from lambdas import ui_assets

app = APIGatewayRestResolver()


def _prefix() -> str:
    """What API Gateway puts in front of the resource path: "/<stage>" on the execute-api
    host, a base path (or nothing) on a custom domain."""
    event = app.current_event
    full, path = event.request_context.path or "", event.path or ""
    if path and full.endswith(path):
        return full[: len(full) - len(path)].rstrip("/")
    stage = event.request_context.stage
    return f"/{stage}" if stage and stage != "$default" else ""


def _config(prefix: str) -> ui_assets.PageConfig:
    api_url = os.environ.get("SKYFN_API_URL") or f"{prefix}/"
    ws_url = os.environ.get("SKYFN_WS_URL") or None
    connect = tuple(o for o in (ui_assets.origin(ws_url), ui_assets.origin(api_url)) if o)
    return ui_assets.PageConfig(api_url=api_url, ws_url=ws_url, connect_src=connect)


def _answer() -> Response:
    # the path as requested, not as routed: the resolver ignores trailing slashes, the
    # local gateway does not, and both must answer alike
    event = app.current_event
    prefix = _prefix()
    answer = ui_assets.serve(event.path or "", _config(prefix), base=f"{prefix}{ui_assets.DEFAULT_BASE}",
                             if_none_match=event.headers.get("If-None-Match"))
    # text, not bytes: bytes would go out base64-encoded, which the REST API passes on as is
    # unless binary media types are configured
    return Response(status_code=answer.status, headers=answer.headers, body=answer.body.decode())


@app.get("/ui")
@app.get("/ui/<name>")
def page(name: str = "") -> Response:
    """The page and its files; serve() knows which names exist."""
    return _answer()


@app.not_found
def not_found(_: NotFoundError) -> Response:
    return _answer()  # a 404 naming the page, for anything but its files


def handler(event: dict, context: Any) -> dict:
    return app.resolve(event, context)
