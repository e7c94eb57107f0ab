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


def chatty(x, n_out=10, n_err=5):
    import sys

    print("out" * n_out, end="")
    sys.stderr.write("err" * n_err)
    return x


def gpu_env(x, sleep=0.0):
    time.sleep(sleep)
    return [x, os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("OMP_NUM_THREADS"), os.getpid()]


def big(n):
    return "r" * n
