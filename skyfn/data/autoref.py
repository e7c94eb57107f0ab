"""Large arguments become refs by themselves (the Executor's side of DESIGN.md section 6).

`ArgumentRefs.pack(args, kwargs)` returns the payload to submit: every argument larger
than `threshold` bytes is put in the store and replaced by a Ref, so user code does not
change; small arguments travel inline as before. The refs it made are the Executor's: they
are evicted as soon as the tasks that consume them have finished (`track`). With
`evict_user_refs`, Refs the user passed are evicted the same way once no running task of
this Executor consumes them any more.

`local_endpoint_store(name)`: the default store of an endpoint whose agent runs on this
machine (its stores file, `$SKYFN_HOME/endpoints/<name>/data/stores.json`), registered in
this process so that refs of it -- arguments and results -- resolve here too.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Iterable, Optional

from skyfn.data import codec
from skyfn.data.ref import Ref, is_ref, ref_info
from skyfn.protocol.serialize import pack_args

DEFAULT_THRESHOLD = 1 << 20


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
    def __init__(self, store, owner, threshold: int = DEFAULT_THRESHOLD, evict_user_refs: bool = False):
        """`owner`: the user id, or a function returning it (asked once, at the first ref)."""
        self.store = store
        self._owner = owner
        self.threshold = max(1, int(threshold))
        self.evict_user_refs = evict_user_refs
        self._users: dict[tuple[str, str], int] = {}  # (store, key) -> running tasks consuming it
        self._lock = threading.Lock()

    @property
    def owner(self) -> str:
        if callable(self._owner):
            self._owner = self._owner()
        return self._owner

    def _ref(self, value: Any, made: list) -> Any:
        ref = self.store.ref(value, owner=self.owner)
        made.append(ref_info(ref))
        return ref

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
