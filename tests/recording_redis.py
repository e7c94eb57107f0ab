"""redis-py's own client, keeping what it sends: a command's name (EVALSHA with its
script's sha), or a pipeline's names as one tuple (one round trip). For tests that check
which Redis round trips a path makes, against a real redis-server."""
from __future__ import annotations

import redis


def _name(args: tuple) -> str:
    name = str(args[0]).upper()
    return f"EVALSHA {args[1]}" if name == "EVALSHA" else name


class RecordingRedis(redis.Redis):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sent: list = []

    def execute_command(self, *args, **options):
        self.sent.append(_name(args))
        return super().execute_command(*args, **options)

    def pipeline(self, transaction=True, shard_hint=None):
        pipe = super().pipeline(transaction, shard_hint)
        execute, sent = pipe.execute, self.sent

        def recorded(*args, **kwargs):
            sent.append(tuple(_name(c[0]) for c in pipe.command_stack))
            return execute(*args, **kwargs)

        pipe.execute = recorded
        return pipe
