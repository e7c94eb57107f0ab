"""Large arguments become refs by themselves (the Executor's side of DESIGN.md section 6).

`ArgumentRefs.pack(args, kwargs)` returns the payload to submit: every argument larger
than `threshold` bytes is put in the store and replaced by a Ref, so user code does not
change; small arguments travel inline as before. With `evict_user_refs`, Refs the user
passed are evicted by the Executor once no running task of it consumes them any more.

Lifetime of the refs it makes (DESIGN.md section 12: lifetimes never depend on a client).
Each ends at the first of:
1. its task ends on a worker: the ref is marked (`RefInfo.task_argument`), and the worker
   that ran the task evicts it once the task is final -- succeeded or failed -- and its
   result has gone to its manager (`task_argument_refs` collects them, `evict_task_arguments`
   evicts them; endpoint_agent/manager/worker.py). A worker that dies mid-task evicts
   nothing, so a task run again after a lost worker still finds its arguments;
2. its Executor sees the task finish (`track`): a second, harmless evict -- and the only
   one for a task that never reached a worker (cancelled, answered from the memo cache);
3. its TTL: `ttl` seconds after it was put (the data key in Redis, the object's expiry in
   S3/file/direct/Globus stores, the capability's expiry), so a client killed with tasks
   still queued leaves nothing forever. Default DEFAULT_TTL (24 h, long enough for a queued
   batch), or SKYFN_ARG_REF_TTL (seconds); per Executor: `Executor(arg_ref_ttl=...)`.
Refs the user makes (`store.ref(...)`) are not marked and keep the TTL they were given.

`local_endpoint_store(name)`: the default store of an endpoint whose agent runs on this
machine (its stores file, `$SKYFN_HOME/endpoints/<name>/data/stores.json`), registered in
this process so that refs of it -- arguments and results -- resolve here too.
"""
from __future__ import annotations

import os
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Optional

from skyfn.data import codec
from skyfn.data.ref import Ref, is_ref, ref_info
from skyfn.protocol.serialize import pack_args

DEFAULT_THRESHOLD = 1 << 20
DEFAULT_TTL = 24 * 3600.0      # seconds an argument ref lives at most (see the module docstring)
TTL_ENV = "SKYFN_ARG_REF_TTL"  # the default for every Executor of this process, in seconds


def argument_ttl(ttl: Optional[float] = None) -> float:
    """The TTL (seconds) of argument refs: `ttl` if given, else SKYFN_ARG_REF_TTL, else DEFAULT_TTL."""
    source = "arg_ref_ttl"
    if ttl is None:
        raw = os.environ.get(TTL_ENV, "").strip()
        if not raw:
            return DEFAULT_TTL
        source = TTL_ENV
        try:
            ttl = float(raw)
        except ValueError:
            raise ValueError(f"{TTL_ENV}={raw!r} is not a number of seconds") from None
    ttl = float(ttl)
    if not ttl > 0 or ttl == float("inf"):
        raise ValueError(f"{source} must be a positive, finite number of seconds (argument refs always expire), "
                         f"not {ttl!r}")
    return ttl


def _cheap_size(obj: Any) -> Optional[int]:
    """Bytes of a buffer-like object without serializing it (None: unknown)."""
    if type(obj) is Ref:
        return 0
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return memoryview(obj).nbytes
    nbytes = getattr(type(obj), "nbytes", None)  # numpy arrays, pyarrow tables and arrays
    if nbytes is not None:
        try:
            return int(obj.nbytes)
        except Exception:  # noqa: BLE001 - a property that fails: size unknown
            return None
    return None


def local_endpoint_store(name: str):
    """The default Store of endpoint `name` when its agent runs on this machine, else None."""
    from skyfn.data.store import get_store, load_stores_file, read_stores_file, register_store

    home = Path(os.environ.get("SKYFN_HOME") or Path.home() / ".skyfn").expanduser()
    path = home / "endpoints" / name / "data" / "stores.json"
    try:
        doc = read_stores_file(str(path))
    except (FileNotFoundError, PermissionError, ValueError):
        return None
    try:
        stores = load_stores_file(str(path))
    except ImportError:  # its connector's client library (redis, ...) is not installed with the SDK alone
        return None      # (pip install skyfn): arguments then travel inline
    for store in stores:
        known = get_store(store.name)
        # a restarted agent may have moved its Redis: the file is the truth
        if known is None or known.connector.config() != store.connector.config() or known.secret != store.secret:
            register_store(store)
    default = doc.get("default")
    return get_store(default) if default else None


def data_locations(args: tuple, kwargs: dict) -> dict[str, int]:
    """endpoint id -> bytes of the refs among these arguments that live there (placement)."""
    out: dict[str, int] = {}
    for a in (*args, *kwargs.values()):
        if type(a) is Ref:
            info = ref_info(a)
            if info.endpoint_id:
                out[info.endpoint_id] = out.get(info.endpoint_id, 0) + info.size
    return out


class ArgumentRefs:
    def __init__(self, store, owner, threshold: int = DEFAULT_THRESHOLD, evict_user_refs: bool = False,
                 ttl: Optional[float] = None):
        """`owner`: the user id, or a function returning it (asked once, at the first ref).
        `ttl`: seconds each ref made here lives at most (None: `argument_ttl()`'s default)."""
        self.store = store
        self._owner = owner
        self.threshold = max(1, int(threshold))
        self.evict_user_refs = evict_user_refs
        self.ttl = argument_ttl(ttl)
        self._users: dict[tuple[str, str], int] = {}  # (store, key) -> running tasks consuming it
        self._lock = threading.Lock()

    @property
    def owner(self) -> str:
        if callable(self._owner):
            self._owner = self._owner()
        return self._owner

    def _ref(self, value: Any, made: list) -> Any:
        # with a TTL, and marked: the worker that runs its task evicts it (module docstring)
        info = replace(ref_info(self.store.ref(value, owner=self.owner, ttl=self.ttl)), task_argument=True)
        made.append(info)
        return Ref(info)

    def pack(self, args: tuple, kwargs: dict) -> tuple[str, list]:
        """(payload, refs to track): large arguments replaced by refs."""
        made: list = []
        sizes = [_cheap_size(a) for a in args]
        ksizes = {k: _cheap_size(v) for k, v in kwargs.items()}
        big = any(s is not None and s > self.threshold for s in (*sizes, *ksizes.values()))
        if big:
            args = tuple(self._ref(a, made) if s is not None and s > self.threshold else a for a, s in zip(args, sizes))
            kwargs = {k: self._ref(v, made) if ksizes[k] is not None and ksizes[k] > self.threshold else v
                      for k, v in kwargs.items()}
        payload = pack_args(args, kwargs)
        if len(payload) > self.threshold:  # something large of a kind we could not size cheaply
            args = tuple(self._ref(a, made) if s is None and len(codec.encode(a)) > self.threshold else a
                         for a, s in zip(args, sizes))
            kwargs = {k: self._ref(v, made) if ksizes[k] is None and len(codec.encode(v)) > self.threshold else v
                      for k, v in kwargs.items()}
            payload = pack_args(args, kwargs)
        refs = made
        if self.evict_user_refs:
            refs = made + [ref_info(a) for a in (*args, *kwargs.values()) if is_ref(a) and ref_info(a) not in made]
        return payload, refs

    def track(self, future, refs: Iterable) -> None:
        """Evict `refs` once every task of this Executor that consumes them has finished."""
        refs = list(refs)
        if not refs:
            return
        with self._lock:
            for info in refs:
                k = (info.store, info.key)
                self._users[k] = self._users.get(k, 0) + 1
        future.add_done_callback(lambda _f: self._release(refs))

    def _release(self, refs: list) -> None:
        from skyfn.data.store import get_store

        gone = []
        with self._lock:
            for info in refs:
                k = (info.store, info.key)
                n = self._users.get(k, 0) - 1
                if n <= 0:
                    self._users.pop(k, None)
                    gone.append(info)
                else:
                    self._users[k] = n
        for info in gone:
            store = get_store(info.store)
            if store is None and info.connector.get("kind") == "direct":   # another endpoint's: its object server
                try:                                                          # evicts it for the owner
                    from skyfn.data.store import evict_ref

                    evict_ref(info)
                except Exception:  # noqa: BLE001 - as below: its TTL (if any) ends it
                    pass
            elif store is not None:
                try:
                    store.evict(info.key)
                except Exception:  # noqa: BLE001 - its TTL (if any) ends it; never fail a future over this
                    pass

    def outstanding(self) -> int:
        with self._lock:
            return len(self._users)


# ---- the worker's side: evicting a task's argument refs once the task is final -------------------

def task_argument_refs(args: tuple, kwargs: dict) -> list:
    """The RefInfos among a task's (unpacked) arguments that an Executor made for it and that
    the worker running it is to evict once it is final: marked `task_argument`, and owned by
    the user the task runs for -- checked against the store's secret where this process knows
    the store (a ref forged to name someone else's key is left alone), else (a direct ref of
    another endpoint) by its object server when it is asked to evict. Call it in the worker,
    while the task's user is set (skyfn.data.context.set_task)."""
    from skyfn.data import capability, context
    from skyfn.data.store import get_store

    user = context.current_user()
    out, seen = [], set()
    for a in (*args, *kwargs.values()):
        if type(a) is not Ref:
            continue
        info = ref_info(a)
        if not info.task_argument or (info.store, info.key) in seen:
            continue
        try:
            store = get_store(info.store)
            if store is not None:
                owner = capability.verify(store.secret, info.store, info.key, info.capability).owner
            elif info.connector.get("kind") == "direct":
                owner = capability.peek(info.capability).owner
            else:
                continue  # a store unknown here: nothing this worker could evict
        except Exception:  # noqa: BLE001 - forged, expired (gone by its TTL already) or malformed: leave it
            continue
        if user is not None and owner == user:
            seen.add((info.store, info.key))
            out.append(info)
    return out


def evict_task_arguments(infos: Iterable) -> int:
    """Evict argument refs collected by `task_argument_refs` (as their owner); how many evictions
    were made. A ref already gone (its Executor evicted it first, its TTL passed) is no error;
    a store that cannot be reached is skipped: the ref's TTL ends it."""
    from skyfn.data import capability
    from skyfn.data import store as stores

    done = 0
    for info in infos:
        try:
            store = stores.get_store(info.store)
            if store is not None:
                store.evict(info.key)
            elif info.connector.get("kind") == "direct":  # another endpoint's object server, as its owner
                from skyfn.data.connectors.direct import DirectConnector

                stores.cache.drop((info.store, info.key))
                stores.cache.drop((info.store, info.key, info.capability))
                DirectConnector.from_config(info.connector).evict_for(info, capability.peek(info.capability).owner)
            else:
                continue
            done += 1
        except Exception:  # noqa: BLE001 - never fail a worker over a clean-up its TTL also does
            continue
    return done
