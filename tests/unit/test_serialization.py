"""The serialization facade: strategies in order, headers, exact round trips, code
defined in __main__, exceptions with remote tracebacks, errors that say what to do,
and the source strategy across a real change of Python version."""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from skyfn.protocol import DeserializationError, SerializationError, deserialize, pack_args, serialize, serialize_function, unpack_args
from skyfn.protocol.remote_exception import unwrap_exception, wrap_exception
from skyfn.protocol.serialize import PYTHON_VERSION, strategy_of

SCALE = 3


def helper(x):
    return x * SCALE


def uses_module_and_helper(x):
    return math.floor(helper(x) + 0.5)


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return (self.x, self.y) == (other.x, other.y)


class MyStr(str):
    pass


@pytest.mark.parametrize("value, strategy", [
    ({"a": [1, 2.5, "x", None, True]}, "json"),
    ([1, 2, 3], "json"),
    ((1, 2), "pickle"),
    ({1: "int key"}, "pickle"),
    ({"s": {1, 2}}, "pickle"),
    (Point(1, 2), "pickle"),
    (b"\x00\xff", "pickle"),
    (float("nan"), "pickle"),
    ([1, (2,)], "pickle"),  # a tuple anywhere inside
    ({"a": {"b": [None, False, {"c": {3: 4}}]}}, "pickle"),
    (2 ** 70, "json"),  # past 64 bits: written by the standard library, read back exactly
    ([-(2 ** 63), 2 ** 64 - 1, 2 ** 64], "json"),
    ({"x": [float("inf"), float("-inf"), -0.0, 5e-324]}, "json"),
    ({"é☃": "ü\u2028"}, "json"),
    (MyStr("sub"), "pickle"),  # subclasses are not plain: they would come back as their base type
])
def test_data_round_trip_with_first_fitting_strategy(value, strategy):
    buf = serialize(value)
    assert strategy_of(buf) == strategy
    assert buf.split("\n", 1)[0] == f"{strategy} {PYTHON_VERSION}"
    out = deserialize(buf)
    if value != value:  # NaN
        assert out != out
    else:
        assert out == value and type(out) is type(value)


def test_json_values_are_the_same_with_or_without_orjson(monkeypatch):
    """Workers of another Python may lack orjson: the standard library writes the same values."""
    ser = sys.modules["skyfn.protocol.serialize"]  # the package exports a function of the same name

    value = {"a": [1, 2.5, "é", None, True, {"b": [[], {}]}], "k": {"n": -7}}
    fast = serialize(value)
    monkeypatch.setattr(ser, "orjson", None)
    slow = serialize(value)
    assert deserialize(fast) == deserialize(slow) == value


def test_json_nesting_past_100_levels_falls_back_to_pickle():
    deep = inner = []
    for _ in range(150):
        inner.append([])
        inner = inner[0]
    buf = serialize(deep)
    assert strategy_of(buf) == "pickle" and deserialize(buf) == deep
    assert strategy_of(serialize([[[1]]])) == "json"


def test_lambda_goes_by_value():
    buf = serialize(lambda y: y + 1)
    assert strategy_of(buf) == "dill"
    assert deserialize(buf)(1) == 2


def test_arrow_table_round_trip():
    pa = pytest.importorskip("pyarrow")
    table = pa.table({"k": [1, 2, 3], "v": ["a", "b", "c"]})
    buf = serialize(table)
    assert strategy_of(buf) == "arrow"
    assert deserialize(buf).equals(table)


def test_function_by_source_carries_modules_helpers_and_constants():
    buf = serialize_function(uses_module_and_helper)
    assert strategy_of(buf) == "source"
    fn = deserialize(buf)
    assert fn(2) == 6 and fn.__module__ != __name__


def test_closures_fall_back_to_dill():
    k = 10

    def add_k(x):
        return x + k

    buf = serialize_function(add_k)
    assert strategy_of(buf) == "dill"
    assert deserialize(buf)(1) == 11


def test_args_round_trip():
    buf = pack_args((1, (2, 3)), {"flag": True})
    assert unpack_args(buf) == ((1, (2, 3)), {"flag": True})


def test_function_defined_in_main_runs_in_another_process(tmp_path):
    """The client's __main__ is not the worker's: the function and a class it uses
    must travel by value and run in a separate interpreter."""
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent("""
        import sys
        from skyfn.protocol import serialize_function, serialize
        class Acc:
            def __init__(self): self.total = 0
        def main_fn(n):
            a = Acc()
            for i in range(n): a.total += i
            return a.total
        sys.stdout.write(serialize_function(main_fn) + "\\x00" + serialize(Acc()))
    """))
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, check=True).stdout
    fn_buf, obj_buf = out.split("\x00")
    assert strategy_of(fn_buf) == "source"
    assert deserialize(fn_buf)(5) == 10
    assert strategy_of(obj_buf) == "dill"
    assert type(deserialize(obj_buf)).__name__ == "Acc"


def test_exception_with_remote_traceback():
    def fail():
        raise ValueError("bad value 42")

    try:
        fail()
    except ValueError as exc:
        buf = wrap_exception(exc)
    exc = unwrap_exception(buf)
    assert isinstance(exc, ValueError) and str(exc) == "bad value 42"
    assert "in fail" in exc.remote_traceback and 'raise ValueError("bad value 42")' in exc.remote_traceback
    assert any("Remote traceback" in n for n in exc.__notes__)


def test_unpicklable_exception_becomes_remote_execution_error():
    class Local(Exception):
        def __reduce__(self):
            raise TypeError("no")

    try:
        raise Local("odd")
    except Local as e:
        buf = wrap_exception(e)
    exc = unwrap_exception(buf)
    assert type(exc).__name__ == "RemoteExecutionError"
    assert "Local: odd" in str(exc) and "Remote traceback" in str(exc)


def test_unserializable_object_names_the_fix():
    with pytest.raises(SerializationError, match="no strategy could serialize generator.*Make it picklable"):
        serialize(x for x in [1])


def test_deserialization_error_names_strategy_versions_and_fix():
    with pytest.raises(DeserializationError) as info:
        deserialize("dill 3.8\nbm90IGRpbGw=")
    msg = str(info.value)
    assert "strategy 'dill'" in msg and "Python 3.8" in msg and f"Python {PYTHON_VERSION}" in msg
    assert "Fix:" in msg and "source" in msg
    with pytest.raises(DeserializationError, match="unknown serialization header"):
        deserialize("zstd 3.11\nxx")


def _other_python() -> str | None:
    """Another minor version of CPython that really runs here (pyenv builds, then PATH)."""
    candidates = []
    root = os.path.expanduser("~/.pyenv/versions")
    if os.path.isdir(root):
        candidates += [os.path.join(root, v, "bin", "python") for v in sorted(os.listdir(root), reverse=True)]
    candidates += [shutil.which(f"python3.{m}") for m in (12, 13, 10)]
    for exe in filter(None, candidates):
        try:
            out = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=20)
        except OSError:
            continue
        version = out.stdout.strip()
        if out.returncode == 0 and version != PYTHON_VERSION and tuple(map(int, version.split("."))) >= (3, 8):
            return exe
    return None


def test_source_strategy_survives_a_python_version_change(tmp_path):
    """Serialize on this Python, run on another minor version (no skyfn installed
    there: the worker side of the source strategy is plain exec)."""
    other = _other_python()
    if other is None:
        pytest.skip("no second Python version on this machine")
    buf = serialize_function(uses_module_and_helper)
    assert strategy_of(buf) == "source"
    runner = tmp_path / "run.py"
    runner.write_text(textwrap.dedent(f"""
        import sys, json, importlib, builtins
        sys.path.insert(0, {os.getcwd()!r})
        from skyfn.protocol.serialize import deserialize, PYTHON_VERSION
        fn = deserialize(sys.stdin.read())
        print(PYTHON_VERSION, fn(7))
    """))
    out = subprocess.run([other, str(runner)], input=buf, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    version, value = out.stdout.split()
    assert version != PYTHON_VERSION and value == "21"


def divide(a, b):
    return a / b


def test_remote_traceback_of_source_function_shows_its_lines():
    fn = deserialize(serialize_function(divide))
    try:
        fn(1, 0)
    except ZeroDivisionError as exc:
        buf = wrap_exception(exc)
    assert "return a / b" in unwrap_exception(buf).remote_traceback
