"""Functions the light agent and fleet tests run (serialized by source, like a user's)."""


def add(x, y):
    return x + y


def fail(x):
    raise ValueError(f"bad value {x}")


def shout(x):
    print(f"value {x}")
    return x * 2
