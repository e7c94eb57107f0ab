"""Functions the workflow tests register (serialized by source, run on the endpoint)."""


def square(x):
    return x * x


def square_or_fail(x):
    if x % 10 == 0:
        raise ValueError(f"no multiples of ten: {x}")
    return x * x
