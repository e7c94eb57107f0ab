"""Functions the SDK tests run remotely (importable, so every strategy can carry them)."""
import time

from tests.sdk.sample_errors import ScienceError  # noqa: F401  (raised remotely)


def add(a, b=0):
    return a + b


def square(x):
    return x * x


def noop():
    return None


def explode(message):
    raise ScienceError(message)


def slow(seconds, value=None):
    time.sleep(seconds)
    return value
