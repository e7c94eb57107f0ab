"""Process-wide clients of the handlers, created on first use and reused across
invocations (as a Lambda container reuses them between events): the hot store's ports
(lambdas/adapters/redis_store), the durable tables and the queues. lambdas/core calls the
ports by meaning; no store command is sent from lambdas/core itself."""
from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

from lambdas.adapters import service_queues
from lambdas.adapters.dynamodb import Dynamo
from lambdas.adapters.redis_store import connection
from lambdas.adapters.redis_store.action_store import ActionStore
from lambdas.adapters.redis_store.backlog_store import BacklogFigures
from lambdas.adapters.redis_store.batch_store import BatchStore
from lambdas.adapters.redis_store.claims_store import ClaimsStore
from lambdas.adapters.redis_store.credential_store import CredentialHashes
from lambdas.adapters.redis_store.direct_channels import DirectChannels
from lambdas.adapters.redis_store.endpoint_allowlists import EndpointAllowlists
from lambdas.adapters.redis_store.group_store import GroupStore
from lambdas.adapters.redis_store.lanes_store import LaneStore
from lambdas.adapters.redis_store.liveness_store import Liveness
from lambdas.adapters.redis_store.dead_letter_watch import DeadLetterWatch
from lambdas.adapters.redis_store.queue_login_users import QueueLoginUsers
from lambdas.adapters.redis_store.rate_limits import RateLimits
from lambdas.adapters.redis_store.push_channel import PushChannels
from lambdas.adapters.redis_store.registry_store import RegistryCache
from lambdas.adapters.redis_store.run_store import RunStore
from lambdas.adapters.redis_store.session_store import SessionStore
from lambdas.adapters.redis_store.shares_store import ShareStore
from lambdas.adapters.redis_store.store import TaskStore
from lambdas.adapters.redis_store.task_fields import TaskFields
from lambdas.adapters.redis_store.teams_store import TeamStore
from lambdas.config import settings
from skyfn.protocol.api import QueueDescriptor
from skyfn.protocol.queues import TaskQueue

_PORTS: list[Callable[[], Any]] = []
T = TypeVar("T")


def _port(cls: Callable[[Any], T]) -> Callable[[], T]:
    """`cls` over the process's hot-store client: made on first use, forgotten by reset()."""
    @functools.lru_cache(maxsize=1)
    def get() -> T:
        return cls(connection.redis_client())

    _PORTS.append(get)
    return get


@functools.lru_cache(maxsize=1)
def store() -> TaskStore:
    s = settings()
    return TaskStore(connection.redis_client(), result_ttl=s.result_ttl, unretrieved_ttl=s.unretrieved_ttl,
                     memo_ttl=s.memo_ttl)


rate_limits = _port(RateLimits)
lanes = _port(LaneStore)
queue_login_users = _port(QueueLoginUsers)
registry_cache = _port(RegistryCache)
liveness = _port(Liveness)
dead_letter_watch = _port(DeadLetterWatch)
group_store = _port(GroupStore)
task_fields = _port(TaskFields)
shares = _port(ShareStore)
teams = _port(TeamStore)
batch_store = _port(BatchStore)
run_store = _port(RunStore)
action_store = _port(ActionStore)
claims = _port(ClaimsStore)
credential_hashes = _port(CredentialHashes)
direct_channels = _port(DirectChannels)
endpoint_allowlists = _port(EndpointAllowlists)
sessions = _port(SessionStore)
push_channels = _port(PushChannels)
backlog_figures = _port(BacklogFigures)


@functools.lru_cache(maxsize=1)
def dynamo() -> Dynamo:
    return Dynamo(settings().table_prefix)


def task_queue(endpoint_id: str) -> tuple[TaskQueue, QueueDescriptor]:
    return service_queues.service_queue(settings().task_queue_name(endpoint_id))


def lane_queue(endpoint_id: str, lane: str) -> tuple[TaskQueue, QueueDescriptor]:
    return service_queues.service_queue(settings().lane_queue_name(endpoint_id, lane))


def control_queue(endpoint_id: str) -> tuple[TaskQueue, QueueDescriptor]:
    return service_queues.service_queue(settings().control_queue_name(endpoint_id))


def results_queue() -> tuple[TaskQueue, QueueDescriptor]:
    return service_queues.service_queue(settings().results_queue_name)


_PORTS += [store, dynamo]


def reset() -> None:
    """Forget every client (tests that change the environment call this)."""
    settings.cache_clear()
    connection.reset()
    for port in _PORTS:
        port.cache_clear()
    service_queues.reset()
