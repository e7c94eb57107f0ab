"""The serialization facade: ordered strategies, and a header that names the one used.

A buffer is text: ``"<strategy> <python-version>\\n<body>"``. Binary bodies are base64.
The first strategy that succeeds wins; only the receiving side decodes, and it knows
which strategy to use from the header. Errors on decoding name the strategy, the Python
versions on both sides and what to do about it.

Data strategies, in order: json (plain data, exact round trip), arrow (pyarrow tables),
pickle, dill, cloudpickle. Code strategies, in order: source (survives a change of
Python version), dill, cloudpickle.
"""
from __future__ import annotations

import base64
import builtins
import inspect
import io
import json
import linecache
import pickle
import sys
import textwrap
import threading
import types
from typing import Any, Callable

try:  # the fast JSON writer; workers of another Python may lack it (the standard library writes the same)
    import orjson
except ImportError:  # pragma: no cover - exercised by the other-Python test
    orjson = None

from skyfn.protocol.errors import DeserializationError, SerializationError

PYTHON_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


class Strategy:
    """One way of turning objects into text and back."""

    name: str = ""
    binary = True

    def dumps(self, obj: Any) -> bytes | str:
        raise SerializationError(f"{self.name} cannot serialize {type(obj).__name__}")

    def loads(self, body: bytes | str) -> Any:
        raise DeserializationError(f"{self.name} cannot deserialize")


class JsonStrategy(Strategy):
    """Plain data only, and only when it round-trips exactly (no tuples, no int keys)."""

    name = "json"
    binary = False

    @staticmethod
    def _plain(obj: Any) -> bool:
        return _plainness(obj, 0) != _NOT_PLAIN

    def dumps(self, obj: Any) -> str:
        kind = _plainness(obj, 0)
        if kind == _NOT_PLAIN:
            raise SerializationError("not plain JSON data")
        if kind == _PLAIN and orjson is not None:  # orjson: the same JSON values, several times faster
            return orjson.dumps(obj).decode()
        return json.dumps(obj, separators=(",", ":"), allow_nan=True)  # infinities, integers past 64 bits

    def loads(self, body: str) -> Any:
        return json.loads(body)  # not orjson: it reads integers past 64 bits as floats


_NOT_PLAIN, _PLAIN, _PLAIN_STDLIB = 0, 1, 2
_INT64 = (-(2 ** 63), 2 ** 64 - 1)  # what orjson writes and reads as integers


def _plainness(obj: Any, depth: int) -> int:
    """_PLAIN: JSON data orjson writes exactly; _PLAIN_STDLIB: JSON data only the
    standard library writes (infinities, integers past 64 bits); _NOT_PLAIN: anything else
    (subclasses, tuples, non-str keys, NaN, nesting past 100)."""
    t = type(obj)
    if t is str or t is bool or obj is None:
        return _PLAIN
    if t is int:
        return _PLAIN if _INT64[0] <= obj <= _INT64[1] else _PLAIN_STDLIB
    if t is float:
        if obj - obj == 0.0:
            return _PLAIN
        return _NOT_PLAIN if obj != obj else _PLAIN_STDLIB  # NaN does not round-trip as equal
    if depth >= 100:
        return _NOT_PLAIN
    if t is list:
        values = obj
    elif t is dict:
        for k in obj:
            if type(k) is not str:
                return _NOT_PLAIN
        values = obj.values()
    else:
        return _NOT_PLAIN
    kind = _PLAIN
    lo, hi = _INT64
    for x in values:
        tx = type(x)
        if tx is str or tx is bool or x is None or (tx is int and lo <= x <= hi) or (tx is float and x - x == 0.0):
            continue
        sub = _plainness(x, depth + 1)
        if sub == _NOT_PLAIN:
            return _NOT_PLAIN
        kind = max(kind, sub)
    return kind


class ArrowStrategy(Strategy):
    """pyarrow Tables and RecordBatches as Arrow IPC streams."""

    name = "arrow"

    def dumps(self, obj: Any) -> bytes:
        mod = type(obj).__module__
        if not mod.startswith("pyarrow"):
            raise SerializationError("not an Arrow table")
        import pyarrow as pa

        if isinstance(obj, pa.RecordBatch):
            obj = pa.Table.from_batches([obj])
        if not isinstance(obj, pa.Table):
            raise SerializationError("not an Arrow table")
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, obj.schema) as writer:
            writer.write_table(obj)
        return sink.getvalue()

    def loads(self, body: bytes) -> Any:
        import pyarrow as pa

        return pa.ipc.open_stream(body).read_all()


class PickleStrategy(Strategy):
    """Standard pickle; refused for anything that refers to __main__ (the receiver has
    a different __main__), so dill can carry it by value instead."""

    name = "pickle"

    def dumps(self, obj: Any) -> bytes:
        # type(), not isinstance(): isinstance asks obj.__class__, which resolves a lazy data ref
        if issubclass(type(obj), (types.FunctionType, types.LambdaType, type)):
            raise SerializationError("code goes through the code strategies")
        data = pickle.dumps(obj, protocol=5)
        if b"__main__" in data:
            raise SerializationError("refers to __main__")
        return data

    def loads(self, body: bytes) -> Any:
        return pickle.loads(body)


class DillStrategy(Strategy):
    name = "dill"

    def dumps(self, obj: Any) -> bytes:
        import dill

        return dill.dumps(obj, protocol=4, recurse=True)

    def loads(self, body: bytes) -> Any:
        import dill

        return dill.loads(body)


class CloudpickleStrategy(Strategy):
    name = "cloudpickle"

    def dumps(self, obj: Any) -> bytes:
        import cloudpickle

        return cloudpickle.dumps(obj, protocol=4)

    def loads(self, body: bytes) -> Any:
        import cloudpickle  # noqa: F401  (registers reducers it may need)

        return pickle.loads(body)


class SourceStrategy(Strategy):
    """A function as its source text plus the globals it uses (modules, other top-level
    functions and classes of its module by source, plain constants, importable names). Bytecode-free, so it
    survives a change of Python version between client and worker. Refuses lambdas,
    closures, decorated functions and globals it cannot describe."""

    name = "source"
    binary = False

    def dumps(self, fn: Any) -> str:
        if not isinstance(fn, types.FunctionType):
            raise SerializationError("not a function")
        if fn.__module__ not in sys.modules:
            raise SerializationError("defining module is gone")
        spec: dict[str, Any] = {"name": fn.__name__, "functions": [], "globals": {}}
        self._collect(fn, spec, seen=set())
        return json.dumps(spec, separators=(",", ":"))

    def _collect(self, obj: Any, spec: dict, seen: set) -> None:
        """Add obj's source (a function or a class of the same module) after the sources
        of the globals it uses, so exec order defines dependencies first."""
        if isinstance(obj, types.FunctionType) and (
                obj.__name__ == "<lambda>" or obj.__closure__ or "<locals>" in obj.__qualname__):
            raise SerializationError("lambdas, closures and nested functions have no standalone source")
        if isinstance(obj, type) and "<locals>" in obj.__qualname__:
            raise SerializationError("classes defined inside functions have no standalone source")
        seen.add(obj.__name__)
        try:
            src = textwrap.dedent(inspect.getsource(obj))
        except (OSError, TypeError) as exc:
            raise SerializationError(f"source unavailable: {exc}") from exc
        if src.lstrip().startswith("@"):
            raise SerializationError("decorated functions and classes are carried by value")
        if isinstance(obj, type):
            codes = [f.__code__ for f in vars(obj).values() if isinstance(f, types.FunctionType)]
            namespace = sys.modules[obj.__module__].__dict__ if obj.__module__ in sys.modules else {}
            bases = {b.__name__ for b in obj.__bases__ if b is not object}
        else:
            codes, namespace, bases = [obj.__code__], obj.__globals__, set()
        names = set(bases)
        for code in codes:
            names |= self._global_names(code)
        for name in sorted(names):
            if name in spec["globals"] or name in seen or name not in namespace:
                continue
            value = namespace[name]
            if isinstance(value, types.ModuleType):
                spec["globals"][name] = ["module", value.__name__]
            elif isinstance(value, (types.FunctionType, type)) and value.__module__ == obj.__module__:
                self._collect(value, spec, seen)
            elif JsonStrategy._plain(value):
                spec["globals"][name] = ["const", value]
            else:
                module = getattr(value, "__module__", None)
                qualname = getattr(value, "__qualname__", None)
                if not module or module == "__main__" or not qualname or "<" in qualname:
                    raise SerializationError(f"global {name!r} cannot be described by source")
                spec["globals"][name] = ["import", module, qualname]
        spec["functions"].append(src)

    @staticmethod
    def _global_names(code: types.CodeType) -> set[str]:
        names = set(code.co_names)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                names |= SourceStrategy._global_names(const)
        return names

    def loads(self, body: str) -> Callable:
        import importlib

        spec = json.loads(body)
        namespace: dict[str, Any] = {"__builtins__": builtins, "__name__": "__skyfn_source__"}
        for name, entry in spec["globals"].items():
            kind = entry[0]
            if kind == "module":
                namespace[name] = importlib.import_module(entry[1])
            elif kind == "const":
                namespace[name] = entry[1]
            else:
                obj: Any = importlib.import_module(entry[1])
                for part in entry[2].split("."):
                    obj = getattr(obj, part)
                namespace[name] = obj
        for i, src in enumerate(spec["functions"]):
            filename = f"<skyfn source of {spec['name']}#{i}>"
            # Known to linecache, so remote tracebacks show the user's source lines.
            linecache.cache[filename] = (len(src), None, src.splitlines(keepends=True), filename)
            exec(compile(src, filename, "exec"), namespace)
        return namespace[spec["name"]]


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (JsonStrategy(), ArrowStrategy(), PickleStrategy(), DillStrategy(), CloudpickleStrategy(), SourceStrategy())
}
DATA_ORDER = ("json", "arrow", "pickle", "dill", "cloudpickle")
CODE_ORDER = ("source", "dill", "cloudpickle")

_FIXES = {
    "json": "the buffer is corrupt; submit the task again",
    "arrow": "install pyarrow on this side (pip install pyarrow) or send plain Python data",
    "pickle": "use the same Python and library versions on client and endpoint, or send plain JSON data",
    "dill": "use the same Python and dill versions on client and endpoint, or define the function at "
    "module top level so the version-independent 'source' strategy can carry it",
    "cloudpickle": "use the same Python and cloudpickle versions on client and endpoint, or define the "
    "function at module top level so the version-independent 'source' strategy can carry it",
    "source": "the function's source uses a module or name that is not importable here: install it on "
    "the endpoint, or import it inside the function",
}


def _encode(strategy: Strategy, body: bytes | str) -> str:
    text = base64.b64encode(body).decode("ascii") if strategy.binary else body
    return f"{strategy.name} {PYTHON_VERSION}\n{text}"


def _dumps(obj: Any, order: tuple[str, ...]) -> str:
    reasons = []
    for name in order:
        strategy = STRATEGIES[name]
        try:
            return _encode(strategy, strategy.dumps(obj))
        except Exception as exc:  # any failure means: try the next strategy
            reasons.append(f"{name}: {exc}")
    raise SerializationError(
        f"no strategy could serialize {type(obj).__name__} ({'; '.join(reasons)}). "
        "Make it picklable, or pass plain data (numbers, strings, lists, dicts)."
    )


def serialize(obj: Any) -> str:
    """Serialize data (arguments, results)."""
    return _dumps(obj, DATA_ORDER)


def serialize_function(fn: Callable) -> str:
    """Serialize code: source first (portable across Python versions), then by value."""
    if not callable(fn):
        raise SerializationError(f"expected a function, got {type(fn).__name__}")
    return _dumps(fn, CODE_ORDER)


def strategy_of(buffer: str) -> str:
    return buffer.split(" ", 1)[0]


def deserialize(buffer: str) -> Any:
    header, sep, text = buffer.partition("\n")
    name, _, version = header.partition(" ")
    strategy = STRATEGIES.get(name)
    if not sep or strategy is None:
        raise DeserializationError(
            f"unknown serialization header {header[:40]!r}: this buffer was not made by skyfn's "
            f"serializer, or by a newer skyfn; known strategies are {', '.join(STRATEGIES)}. "
            "Upgrade skyfn on this side to the sender's version."
        )
    try:
        body = base64.b64decode(text) if strategy.binary else text
        return strategy.loads(body)
    except Exception as exc:
        raise DeserializationError(
            f"could not deserialize with strategy '{name}': {type(exc).__name__}: {exc}. "
            f"Serialized by Python {version or 'unknown'}, deserializing on Python {PYTHON_VERSION}. "
            f"Fix: {_FIXES[name]}."
        ) from exc


# Files to stage met while packing arguments (skyfn.data.connectors.globus.GlobusFile notes
# itself when pickled): the task is submitted with them, so its agent needs no unpickling.
_staging = threading.local()


class StagedPayload(str):
    """An argument buffer with `staging`: {"stage_in"|"stage_out": [{collection, path}, ...]}."""

    staging: dict


def note_staging(kind: str, item: dict) -> None:
    found = getattr(_staging, "found", None)
    if found is not None and item not in found.setdefault(kind, []):
        found[kind].append(item)


def pack_args(args: tuple, kwargs: dict) -> str:
    """One buffer for a call's positional and keyword arguments (a StagedPayload when they
    hold files to stage)."""
    outer = getattr(_staging, "found", None)
    _staging.found = found = {}
    try:
        buf = serialize({"a": list(args), "k": dict(kwargs)})
    finally:
        _staging.found = outer
    if found:
        buf = StagedPayload(buf)
        buf.staging = found
    return buf


def unpack_args(buffer: str) -> tuple[tuple, dict]:
    data = deserialize(buffer)
    return tuple(data["a"]), data["k"]
