"""One Lambda execution environment of the embedded runtime: a process that imports a
handler (`module:attr`) once and then invokes it for each event it is sent, one at a time,
as a warm Lambda container does.

    python -m infra.local.standins.lambda_worker lambdas.api:handler READ_FD WRITE_FD

Events and answers travel as length-prefixed pickle frames over the two pipe fds (the
parent is our own gateway, never a remote party), so the handler's stdout/stderr stay
free for its logs. The worker exits when its request pipe closes (the gateway is gone).
"""
from __future__ import annotations

import importlib
import os
import pickle
import signal
import struct
import sys
import traceback

from skyfn import gc_tuning

_LEN = struct.Struct(">Q")


def write_frame(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LEN.pack(len(data)) + data)
    stream.flush()


def _read_exact(stream, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(stream):
    """The next object, or None at end of stream (works on raw, unbuffered pipes too)."""
    head = _read_exact(stream, _LEN.size)
    if head is None:
        return None
    data = _read_exact(stream, _LEN.unpack(head)[0])
    return None if data is None else pickle.loads(data)


def load_target(target: str):
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr or "handler")


def main(argv: list[str]) -> int:
    target, rfd, wfd = argv[0], int(argv[1]), int(argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the gateway, which stops us
    requests = os.fdopen(rfd, "rb")
    answers = os.fdopen(wfd, "wb")
    try:
        handler = load_target(target)
    except BaseException as exc:
        write_frame(answers, ("fatal", f"cannot load {target}: {type(exc).__name__}: {exc}",
                              traceback.format_exc()))
        return 1
    from infra.local.standins.events import LocalLambdaContext

    gc_tuning.settle()
    write_frame(answers, ("ready", os.getpid()))
    while True:
        request = read_frame(requests)
        if request is None:
            return 0
        event, function_name, timeout_seconds, request_id = request
        context = LocalLambdaContext(function_name, timeout_seconds, request_id=request_id)
        try:
            answer = ("ok", handler(event, context))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the gateway
            answer = ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())
        try:
            write_frame(answers, answer)
        except (pickle.PicklingError, TypeError) as exc:
            write_frame(answers, ("error", f"unpicklable handler response: {exc}", traceback.format_exc()))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
