"""An exception class the remote functions raise; importable on both sides, so the SDK
re-raises this very class."""


class ScienceError(ValueError):
    pass
