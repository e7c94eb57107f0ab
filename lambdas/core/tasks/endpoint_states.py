"""The states of an endpoint's own tasks (skyfn.protocol.task_states), for its agent.

A multi-user endpoint's privileged process checks the outcome its user agents report against
these before writing a task's audit line. Only tasks dispatched to the asking endpoint are
answered; any other id -- another endpoint's task, or one the hot store no longer holds -- is
UNKNOWN, so the answer reveals nothing of other endpoints' tasks. One round trip to the store
for the whole batch (deps.task_fields)."""
from __future__ import annotations

from lambdas.core import deps
from skyfn.protocol.states import parse_events
from skyfn.protocol.task_states import MAX_REASON, UNKNOWN, TaskStateOf, TaskStates

_STARTED = ("RUNNING", "DISPATCHED")


def of_endpoint(endpoint_id: str, task_ids: list[str]) -> TaskStates:
    ids = list(dict.fromkeys(task_ids))
    states: dict[str, TaskStateOf] = {}
    for tid, found in zip(ids, deps.task_fields().dispatch_states(ids)):
        if found is None or found[0] != endpoint_id:
            states[tid] = TaskStateOf(state=UNKNOWN)
            continue
        _, state, events, reason = found
        stamps = {}
        try:
            for name, ts in parse_events(events):
                stamps.setdefault(name, ts)
        except ValueError:  # a record written by an older service: its times are not known
            stamps = {}
        start = next((stamps[s] for s in _STARTED if s in stamps), None)
        if reason is not None and len(reason) > MAX_REASON:
            reason = reason[:MAX_REASON] + "..."
        states[tid] = TaskStateOf(state=state, start=start, end=stamps.get(state), reason=reason)
    return TaskStates(states=states)
