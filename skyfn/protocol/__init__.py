"""The wire contract shared by every part of skyfn: task states and events, messages
between service and agents, REST bodies, serialization, and the task-queue port."""
from skyfn.protocol.errors import (
    DeserializationError,
    RemoteExecutionError,
    SerializationError,
    SkyfnError,
    TaskCancelled,
    TaskFailed,
    TaskTimedOut,
)
from skyfn.protocol.serialize import deserialize, pack_args, serialize, serialize_function, unpack_args
from skyfn.protocol.states import FINAL_STATES, TaskState

__all__ = [
    "DeserializationError", "RemoteExecutionError", "SerializationError", "SkyfnError", "TaskCancelled",
    "TaskFailed", "TaskTimedOut", "deserialize", "pack_args", "serialize", "serialize_function", "unpack_args",
    "FINAL_STATES", "TaskState",
]
