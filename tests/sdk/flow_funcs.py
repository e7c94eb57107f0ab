"""Functions the SDK's dataflow tests run (importable, so every strategy can carry them)."""
from __future__ import annotations

import time
from collections import namedtuple

from tests.sdk.sample_errors import ScienceError  # noqa: F401  (raised remotely)

Pair = namedtuple("Pair", "left right")


def add(a, b=0):
    return a + b


def echo(*args, **kwargs):
    return list(args), kwargs


def total(xs):
    return sum(xs)


def same(a, b):
    return a is b


def explode(message):
    raise ScienceError(message)


def slow(seconds, value=None):
    time.sleep(seconds)
    return value
