"""Who is asking: the user whose task is running in this process (or the SDK's user).

The worker sets the owner of each task before calling it (the service puts the submitter
in the task pack; the agent hands it to the worker); the SDK sets its user when it learns
it. A process running tasks of several owners at once on threads (the light agent,
endpoint_agent/light/) sets each task's owner for its thread alone (`set_thread_task`),
which comes before the process-wide one. Capabilities are checked against this identity. Also: where the endpoint's store
definitions are (SKYFN_DATA_STORES) and which endpoint this process runs for.
"""
from __future__ import annotations

import os
import threading
from typing import Optional

_task_owner: Optional[str] = None
_task_id: Optional[str] = None
_sdk_user: Optional[str] = None
_user_provider = None  # asked once, when a ref is resolved outside a task before set_user
_thread = threading.local()  # .owner, .task_id: a task running on this thread (set_thread_task)

STORES_ENV = "SKYFN_DATA_STORES"      # path of the endpoint's stores file (JSON, mode 0600)
ENDPOINT_ENV = "SKYFN_ENDPOINT_ID"


def set_task(owner: Optional[str], task_id: Optional[str] = None) -> None:
    """Called by the worker around each task (None after it)."""
    global _task_owner, _task_id
    _task_owner, _task_id = owner, task_id


def set_thread_task(owner: Optional[str], task_id: Optional[str] = None) -> None:
    """The task running on the calling thread (None after it), for this thread only."""
    _thread.owner, _thread.task_id = owner, task_id


def set_user(user: Optional[str]) -> None:
    """The SDK's user, for refs made or resolved outside a task."""
    global _sdk_user
    _sdk_user = user


def set_user_provider(provider) -> None:
    """A function returning the SDK's user (e.g. Client.whoami), asked only when needed
    (ignored once the user is known)."""
    global _user_provider
    if _sdk_user is None:
        _user_provider = provider


def current_user() -> Optional[str]:
    global _sdk_user, _user_provider
    owner = getattr(_thread, "owner", None)
    if owner is not None:
        return owner
    if _task_owner is not None:
        return _task_owner
    if _sdk_user is None and _user_provider is not None:
        provider, _user_provider = _user_provider, None
        _sdk_user = provider()
    return _sdk_user


def current_task() -> Optional[str]:
    return getattr(_thread, "task_id", None) or _task_id


def endpoint_id() -> Optional[str]:
    return os.environ.get(ENDPOINT_ENV) or None
