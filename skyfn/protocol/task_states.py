"""The states of an endpoint's own tasks, as the service knows them (POST
/endpoints/{id}/task-states, with the endpoint's credential).

A multi-user endpoint's privileged process writes each lane task's audit line from the
service's final state, not from what the user agent reports (endpoint_agent/multiuser/
audit_confirm.py). It asks for a batch of task ids; the service answers, for each, its state
and times when the task was dispatched to *that* endpoint, and `UNKNOWN` otherwise -- a task
of another endpoint, or none at all, are answered alike: the answer says nothing of others.
"""
from __future__ import annotations

from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field

MAX_TASK_STATES = 500   # task ids one request may ask about
MAX_REASON = 2000       # characters of a task's reason the answer carries
UNKNOWN = "UNKNOWN"     # not a task of the asking endpoint (or no longer in the service's hot store)


class TaskStatesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    task_ids: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        min_length=1, max_length=MAX_TASK_STATES, description="the tasks asked about")


class TaskStateOf(BaseModel):
    state: str = Field(description="the task's state, or UNKNOWN")
    start: Optional[float] = Field(default=None, description="when it started running (epoch seconds)")
    end: Optional[float] = Field(default=None, description="when it reached its final state (epoch seconds)")
    reason: Optional[str] = Field(default=None, description="the reason of a failed or cancelled task")


class TaskStates(BaseModel):
    states: dict[str, TaskStateOf]
