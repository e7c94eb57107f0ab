"""A worker process: runs the tasks its manager gives it, one at a time, in order.

`python -m endpoint_agent.manager.worker --connect ipc://... --identity ID --slot I --slots-fd FD
--slots N [--max-output BYTES]`. The manager may start it inside a container (the command
is then wrapped by the container runtime); everything it needs comes on the command line.
The manager sends chunks of tasks; for each the worker deserializes the
function (cached by function_id), unpacks the arguments, calls it and serializes the
result, or wraps the exception with its traceback (state FAILED). Results go back when
the chunk is done, or sooner when the chunk is slow (so long tasks report one by one),
in the order the tasks were given. Progress is written to the shared slots (endpoint_agent/slots.py).

Per task, what the function prints to sys.stdout / sys.stderr is captured (at most
`--max-output` characters per stream, then a truncation marker) and returned with the
result; a task may carry environment settings (CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS)
that the worker applies before the call and restores after it.

Argument refs: the refs an Executor made for a task's large arguments (marked
`RefInfo.task_argument`, skyfn.data.autoref) are evicted by this worker once the task is
final here -- succeeded or failed -- right after its result went to the manager, so their
lifetime does not depend on the client that submitted them. A worker that dies mid-task
evicts nothing: the task, run again elsewhere, still finds its arguments (their TTL ends
them if it never does).

Dataflow: a task that takes other tasks' results comes with an envelope for payload; its
inputs' results are put in their places before the call (endpoint_agent/manager/inputs.py).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import zmq

from endpoint_agent import wire
from endpoint_agent.manager.inputs import fill_inputs, open_payload
from endpoint_agent.procutil import die_with_parent
from endpoint_agent.slots import Slots
from skyfn.data.context import set_task
from skyfn.protocol import blobs
from skyfn.protocol.remote_exception import wrap_exception
from skyfn.protocol.serialize import deserialize, serialize, unpack_args

PARTIAL_FLUSH_S = 0.02
DEFAULT_MAX_OUTPUT = 64 * 1024


class CappedWriter:
    """A text stream that keeps the first `cap` characters written to it and counts the rest."""

    __slots__ = ("cap", "parts", "size", "dropped")
    encoding = "utf-8"
    errors = "replace"

    def __init__(self, cap: int):
        self.cap = cap
        self.parts: list[str] = []
        self.size = 0
        self.dropped = 0

    def write(self, s) -> int:
        if not isinstance(s, str):
            s = str(s)
        n = len(s)
        room = self.cap - self.size
        if n <= room:
            self.parts.append(s)
            self.size += n
        else:
            if room > 0:
                self.parts.append(s[:room])
                self.size += room
            self.dropped += n - max(room, 0)
        return n

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def take(self) -> str | None:
        """What was written since the last take (None when nothing), marker included."""
        if not self.size and not self.dropped:
            return None
        out = "".join(self.parts)
        if self.dropped:
            out += f"\n[skyfn: output truncated, {self.dropped} more characters not captured]\n"
        self.parts = []
        self.size = 0
        self.dropped = 0
        return out  # a chunk running longer than this reports results as they come
PARENT_CHECK_S = 1.0


class FunctionCache:
    """function_id -> callable, deserialized on first use. A body that fails to
    deserialize is remembered as the exception, so every task calling it fails alike."""

    def __init__(self) -> None:
        self.bodies: dict[str, str] = {}
        self.loaded: dict[str, object] = {}

    def add(self, bodies: dict[str, str]) -> None:
        self.bodies.update(bodies)

    def get(self, function_id: str):
        fn = self.loaded.get(function_id)
        if fn is None:
            body = self.bodies.get(function_id)
            if body is None:
                fn = LookupError(f"function {function_id} was not delivered to this worker")
            else:
                try:
                    fn = deserialize(body)
                except Exception as exc:  # DeserializationError, with the fix in its message
                    fn = exc
            self.loaded[function_id] = fn
        if isinstance(fn, BaseException):
            raise fn
        return fn


def run_task(cache: FunctionCache, function_id: str, payload: str,
             argument_refs: list | None = None) -> tuple[str, str | None, str | None]:
    """(state, result, error) of one call. The remote traceback starts at the user's
    function: the worker's own frame is cut off. The task's argument refs to evict once its
    result is sent (see the module docstring) are appended to `argument_refs`."""
    try:
        fn = cache.get(function_id)
        if blobs.is_ref(payload):  # a large payload in S3: fetched here, off the agent's loop
            payload = blobs.download(blobs.target(payload))
        payload, inputs = open_payload(payload)
        args, kwargs = unpack_args(payload)
    except Exception as exc:  # DeserializationError and friends: FAILED, with the fix in the message
        return "FAILED", None, _wrap(exc)
    # before the inputs are in: refs among their results are theirs to keep, not this task's to evict
    if argument_refs is not None and "skyfn.data.ref" in sys.modules:  # a Ref was unpickled: maybe marked ones
        try:
            from skyfn.data.autoref import task_argument_refs

            argument_refs.extend(task_argument_refs(args, kwargs))
        except Exception:  # noqa: BLE001 - never fail a task over its clean-up (the refs' TTL ends them)
            pass
    if inputs is not None:
        try:
            args, kwargs = fill_inputs(args, kwargs, inputs)
        except Exception as exc:  # InputError: names the input's task
            return "FAILED", None, _wrap(exc)
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - user code may raise anything, SystemExit included
        if isinstance(exc, KeyboardInterrupt) and _stopping:
            raise
        tb = exc.__traceback__
        return "FAILED", None, _wrap(exc.with_traceback(tb.tb_next if tb is not None else None))
    try:
        return "SUCCEEDED", serialize(value), None
    except Exception as exc:  # SerializationError: says which strategies were tried and why
        return "FAILED", None, _wrap(exc)


def _wrap(exc: BaseException) -> str:
    try:
        return wrap_exception(exc)
    except BaseException as wrap_exc:  # noqa: BLE001 - an exception whose str() raises, ...
        return wrap_exception(RuntimeError(f"{type(exc).__name__} (unprintable: {wrap_exc!r})"))


def _evict_arguments(infos: list) -> list:
    """Evict the argument refs of tasks whose results were just sent; a fresh list back."""
    if infos:
        from skyfn.data.autoref import evict_task_arguments

        evict_task_arguments(infos)
    return []


_stopping = False


def main(argv: list[str] | None = None) -> int:
    global _stopping
    ap = argparse.ArgumentParser(prog="endpoint_agent.manager.worker")
    ap.add_argument("--connect", required=True)
    ap.add_argument("--identity", required=True)
    ap.add_argument("--slot", type=int, required=True)
    ap.add_argument("--slots", type=int, required=True)
    ap.add_argument("--slots-fd", type=int, required=True)
    ap.add_argument("--parent", type=int, required=True, help="the manager's pid")
    ap.add_argument("--max-output", type=int, default=DEFAULT_MAX_OUTPUT, help="captured characters per stream")
    args = ap.parse_args(argv)

    die_with_parent()
    parent = args.parent
    if os.getppid() != parent:  # the manager died while we were starting
        return 0
    # Ctrl-C in a foreground agent reaches the whole process group: the agent decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def _term(signum, frame):
        global _stopping
        _stopping = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)

    slots = Slots(args.slots, fd=args.slots_fd)
    ctx = zmq.Context(1)
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, args.identity.encode())
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(args.connect)
    sock.send_multipart([wire.READY, wire.dumps({"pid": os.getpid()})])

    cache = FunctionCache()
    slot = args.slot
    started = 0
    now = time.time
    out_w = CappedWriter(args.max_output)
    err_w = CappedWriter(args.max_output)
    real_out, real_err = sys.stdout, sys.stderr
    environ = os.environ
    try:
        while True:
            if not sock.poll(PARENT_CHECK_S * 1000):
                if os.getppid() != parent:
                    return 0
                continue
            op, body = sock.recv_multipart()
            if op == wire.STOP:
                return 0
            msg = wire.loads(body)
            if msg.get("f"):
                cache.add(msg["f"])
            out: list = []
            evict: list = []  # argument refs of the tasks in `out` (module docstring)
            last_send = now()
            for key, function_id, payload, _walltime, env, *rest in msg["t"]:
                set_task(rest[0] if rest else None)  # whose refs this task may resolve (skyfn.data)
                started += 1
                saved = None
                if env:
                    saved = {k: environ.get(k) for k in env}
                    environ.update(env)
                sys.stdout, sys.stderr = out_w, err_w
                t0 = now()
                slots.begin(slot, started, t0)
                try:
                    state, result, error = run_task(cache, function_id, payload, evict)
                finally:
                    t1 = now()
                    slots.end(slot)
                    sys.stdout, sys.stderr = real_out, real_err
                    if saved is not None:
                        for k, v in saved.items():
                            if v is None:
                                environ.pop(k, None)
                            else:
                                environ[k] = v
                out.append((key, state, result, error, round(t0, 6), round(t1, 6), out_w.take(), err_w.take()))
                if t1 - last_send > PARTIAL_FLUSH_S:
                    sock.send_multipart([wire.RES, wire.dumps(out)])
                    out = []
                    last_send = t1
                    evict = _evict_arguments(evict)
            if out:
                sock.send_multipart([wire.RES, wire.dumps(out)])
            _evict_arguments(evict)
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # leaving anyway: no interrupt inside the clean-up
        sock.close(linger=500)
        ctx.term()
        slots.close()


if __name__ == "__main__":
    sys.exit(main())
