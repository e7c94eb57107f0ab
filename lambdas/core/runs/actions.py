"""Globus Flows actions: a flow step runs a registered function on an endpoint as one skyfn
task, and the Action Provider routes (lambdas/action_provider.py) report on it. An action's
record, and the action each request_id started, are kept in the hot store
(lambdas/adapters/redis_store/action_store.py).

The task is submitted through the service core (tasks.submit: sharing, allowlists, memo,
idempotency all apply), with the request_id as its idempotency key. Task states map to
action states: WAITING (for inputs: a flow step's task has none), QUEUED, DISPATCHED and
RUNNING are ACTIVE, SUCCEEDED is SUCCEEDED (details.result: the return value when it is
JSON; otherwise the serialized buffer, never unpickled here), FAILED, TIMED_OUT and
CANCELLED are FAILED with details.code and details.description.
Only the creator, and principals in monitor_by (status, log) or manage_by (cancel,
release), see an action; anyone else gets 404, as for an id that does not exist.
"""
from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Optional

import orjson

from lambdas.core import deps
from lambdas.core.tasks import tasks
from lambdas.core.errors import Conflict, Invalid, NotFound
from lambdas.core.ids import is_uuid, new_id
from skyfn.protocol.actions import API_VERSION, PREFIX, ActionRequest, RunFunction
from skyfn.protocol.api import SubmitTasks, TaskRequest
from skyfn.protocol.blobs import HEADER as BLOB_HEADER
from skyfn.protocol.serialize import pack_args

DEFAULT_RELEASE_AFTER = "P30D"
MAX_RELEASE_SECONDS = 90 * 86400
LOG_LIMIT_MAX = 100
SKYFN_USERS = uuid.UUID("7d1f8f0e-3b7e-4c36-9c1e-5b3f3a9e6c21")  # namespace of identities of non-Globus users
_DURATION = re.compile(r"^P(?:(\d+(?:\.\d+)?)Y)?(?:(\d+(?:\.\d+)?)M)?(?:(\d+(?:\.\d+)?)W)?(?:(\d+(?:\.\d+)?)D)?"
                       r"(?:T(?:(\d+(?:\.\d+)?)H)?(?:(\d+(?:\.\d+)?)M)?(?:(\d+(?:\.\d+)?)S)?)?$")
_ACTIVE = {"WAITING": "Waiting for its inputs", "QUEUED": "Queued", "DISPATCHED": "Dispatched to the endpoint",
           "RUNNING": "Running"}
_FAILED = {"FAILED": ("TaskFailed", "Failed"), "TIMED_OUT": ("TaskTimedOut", "Timed out"),
           "CANCELLED": ("Cancelled", "Cancelled")}


class InvalidAction(Invalid):
    code = "invalid_request"


def principal(user: str) -> str:
    """A user's principal URN: their Globus Auth identity when the user id is one (Globus
    tokens), else an identity URN derived from the skyfn user id (embedded runtime users)."""
    ident = user if is_uuid(user) else str(uuid.uuid5(SKYFN_USERS, user))
    return f"urn:globus:auth:identity:{ident.lower()}"


def duration_seconds(text: str) -> float:
    m = _DURATION.match(text)
    if not m or text == "P" or text.endswith("T"):
        raise InvalidAction(f"release_after {text!r} is not an ISO8601 duration such as P30D or PT12H")
    y, mo, w, d, h, mi, s = (float(g) if g else 0.0 for g in m.groups())
    return (((y * 365 + mo * 30 + w * 7 + d) * 24 + h) * 60 + mi) * 60 + s


def _iso(ts: Optional[float]) -> Optional[str]:
    return None if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc).isoformat()


def describe(scope: str, admin_contact: str) -> dict[str, Any]:
    """The provider's introspection document."""
    return {
        "types": ["ACTION"], "api_version": API_VERSION, "globus_auth_scope": scope,
        "title": "skyfn: run a registered function on an endpoint",
        "subtitle": "One skyfn task per action; its result becomes the action's details",
        "admin_contact": admin_contact, "synchronous": False, "log_supported": True,
        "visible_to": ["public"], "runnable_by": ["all_authenticated_users"], "maximum_deadline": "P30D",
        "keywords": ["skyfn", "function", "faas", "compute"],
        "input_schema": RunFunction.model_json_schema(),
    }


# --- run ----------------------------------------------------------------------------------
def run(user: str, req: ActionRequest, submitter: Optional[dict[str, str]] = None) -> tuple[dict[str, Any], bool]:
    """Start the action (or return the one this request_id started). Returns (status, created).
    `submitter`: the caller's identity claims, sent with the task (tasks.submit)."""
    actions = deps.action_store()
    digest = hashlib.sha256(req.model_dump_json().encode()).hexdigest()
    release_after = req.release_after or DEFAULT_RELEASE_AFTER
    keep = duration_seconds(release_after)
    if keep > MAX_RELEASE_SECONDS:
        raise InvalidAction(f"release_after {release_after} is longer than the {MAX_RELEASE_SECONDS // 86400} days "
                            "this provider keeps a status")
    if req.deadline is not None:
        deadline = _parse_time(req.deadline)
        if deadline <= time.time():
            raise InvalidAction(f"deadline {req.deadline} has passed: give a time in the future")
    existing = actions.started_by(user, req.request_id)
    if existing is not None:
        rec = _record(existing)
        if rec is not None:
            if rec["h"] != digest:
                raise Conflict(f"request_id {req.request_id!r} already started action {existing} with other "
                               "content: use a new request_id for a new action")
            return _status(rec), False
    body = req.body
    submit = SubmitTasks(endpoint_id=body.endpoint_id, idempotency_key=f"flows-ap:{digest}",
                         tasks=[TaskRequest(function_id=body.function_id, payload=pack_args(tuple(body.args), body.kwargs),
                                            walltime=body.walltime)])
    answer, _ = tasks.submit(user, submit, submitter=submitter)  # 403 (allowlist), 404 (function, endpoint) pass through
    action_id = new_id()
    ttl = int(keep + 31 * 86400)  # longer than any action waits, plus the time its status is kept
    rec = {"u": user, "t": answer["task_ids"][0], "r": req.request_id, "h": digest, "st": f"{time.time():.6f}",
           "ra": release_after, "mon": orjson.dumps(req.monitor_by).decode(),
           "man": orjson.dumps(req.manage_by).decode()}
    if req.label:
        rec["l"] = req.label
    if req.deadline:
        rec["dl"] = req.deadline
    actions.create(action_id, rec, ttl)
    if not actions.claim_request(user, req.request_id, action_id, ttl):  # a concurrent repeat got there first:
        actions.delete(action_id)                                     # its action (the same task: same key)
        winner = _record(actions.started_by(user, req.request_id) or "")
        if winner is None:
            raise Conflict(f"request_id {req.request_id!r} is being started by another request: retry it")
        return _status(winner), False
    return _status({**rec, "id": action_id}), True


def _parse_time(text: str) -> float:
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidAction(f"deadline {text!r} is not an ISO8601 date-time such as 2030-01-01T00:00:00+00:00") \
            from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


# --- reading --------------------------------------------------------------------------------
def _record(action_id: str) -> Optional[dict[str, str]]:
    rec = deps.action_store().record(action_id) if action_id else {}
    if not rec:
        return None
    rec["id"] = action_id
    return rec


def _visible(user: str, action_id: str, role: str) -> dict[str, str]:
    """The record, if `user` created it or is in its monitor_by ('monitor') / manage_by ('manage')."""
    rec = _record(action_id) if re.fullmatch(r"[A-Za-z0-9-]{1,64}", action_id) else None
    if rec is not None:
        if rec["u"] == user:
            return rec
        listed = orjson.loads(rec["mon" if role == "monitor" else "man"])
        if principal(user) in listed:
            return rec
    raise NotFound(f"action {action_id} not found: it was never started, was released, or is not yours to "
                   f"{'see' if role == 'monitor' else 'manage'} (monitor_by / manage_by name who may)")


def _result_details(task: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"task_id": task["task_id"], "state": task["state"]}
    result = task.get("result")
    if result is None:
        return out
    if result.startswith(BLOB_HEADER):
        out["result_url"] = task.get("result_url")
        return out
    header, _, payload = result.partition("\n")
    if header.startswith("json "):
        out["result"] = json.loads(payload)
    else:  # pickled by the worker: handed on as is, never unpickled in the service
        out["result_serialized"] = result
        out["result_format"] = header.split(" ", 1)[0]
    return out


def _failure(task: dict[str, Any]) -> str:
    if task.get("reason"):
        return str(task["reason"])
    err = task.get("error")
    if err:
        header, _, payload = err.partition("\n")
        if header.startswith("json "):
            try:
                data = json.loads(payload)
                return f"{data.get('type')}: {data.get('message')}"[:2000]
            except ValueError:
                pass
        return "the function raised an exception (skyfn's Client.get_result(task_id) re-raises it)"
    return "the task did not succeed"


def _status(rec: dict[str, str]) -> dict[str, Any]:
    if rec.get("fin"):  # completed earlier: kept with the action (the task's record is purged in time)
        return {**orjson.loads(rec["fin"]), "action_id": rec["id"]}
    task = tasks.get(rec["u"], rec["t"]).model_dump(exclude_none=True)
    state = task["state"]
    events = task.get("events") or []
    done_ts = next((ts for s, ts in reversed(events) if s == state), None) if state not in _ACTIVE else None
    details = _result_details(task)
    if state in _ACTIVE:
        status, display = "ACTIVE", _ACTIVE[state]
    elif state == "SUCCEEDED":
        status, display = "SUCCEEDED", "Succeeded"
    else:
        code, display = _FAILED.get(state, ("TaskFailed", state.title()))
        status = "FAILED"
        details.update(code=code, description=_failure(task))
    out = {"action_id": rec["id"], "status": status, "creator_id": principal(rec["u"]),
           "monitor_by": orjson.loads(rec["mon"]), "manage_by": orjson.loads(rec["man"]),
           "start_time": _iso(float(rec["st"])), "release_after": rec["ra"], "display_status": display,
           "details": details}
    if rec.get("l"):
        out["label"] = rec["l"]
    if status != "ACTIVE":
        out["completion_time"] = _iso(done_ts or time.time())
        deps.action_store().keep_final(rec["id"], orjson.dumps(out))  # not when a release removed it meanwhile
    return out


def status(user: str, action_id: str) -> dict[str, Any]:
    return _status(_visible(user, action_id, "monitor"))


def cancel(user: str, action_id: str) -> dict[str, Any]:
    """Cancel a running action (its task is stopped); a completed one is returned as it is."""
    rec = _visible(user, action_id, "manage")
    try:
        tasks.cancel(rec["u"], rec["t"])
    except Conflict:
        pass  # already final: the Action Provider API answers with the status as it stands
    return _status(rec)


def release(user: str, action_id: str) -> dict[str, Any]:
    """Forget a completed action (its last status is returned); an ACTIVE one is a 409."""
    rec = _visible(user, action_id, "manage")
    out = _status(rec)
    if out["status"] == "ACTIVE":
        raise Conflict(f"action {action_id} is still ACTIVE: cancel it ({PREFIX}/actions/{action_id}/cancel) or "
                       "wait for it to complete before releasing it")
    deps.action_store().release(action_id, rec["u"], rec["r"])
    return out


def log(user: str, action_id: str, limit: int = 10, reverse_order: bool = False,
        marker: Optional[str] = None) -> dict[str, Any]:
    """The action's task events, oldest first (or newest with reverse_order), `limit` a page;
    `marker` is the previous page's."""
    rec = _visible(user, action_id, "monitor")
    task = tasks.get(rec["u"], rec["t"])  # (the durable history keeps its events after the hot record goes)
    entries = [{"code": state, "description": f"task {rec['t']} {state.lower().replace('_', ' ')}",
                "time": _iso(ts), "details": {"task_id": rec["t"], "state": state, "timestamp": ts}}
               for state, ts in (task.events or [])]
    if reverse_order:
        entries.reverse()
    try:
        start = int(marker) if marker else 0
    except ValueError:
        raise InvalidAction(f"marker {marker!r} is not one this provider returned: pass the previous page's "
                            "marker as it was") from None
    if start < 0 or start > len(entries):
        raise InvalidAction(f"marker {marker!r} is past the end of the log ({len(entries)} entries)")
    page = entries[start:start + limit]
    more = start + limit < len(entries)
    return {"entries": page, "limit": limit, "has_next_page": more, "marker": str(start + limit) if more else None}
