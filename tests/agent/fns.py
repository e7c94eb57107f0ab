"""Functions the agent tests run on real workers (serialized by source, like a user's)."""
import os
import signal
import time


def square(x):
    return x * x


def noop(x):
    return None


def fail(x):
    raise ValueError(f"bad value {x}")


def whoami(x, sleep=0.0):
    time.sleep(sleep)
    return [x, os.getpid()]


def slow(x, seconds):
    time.sleep(seconds)
    return x


def die(x):
    os.kill(os.getpid(), signal.SIGKILL)
