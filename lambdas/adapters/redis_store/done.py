"""The completion streams of the hot task store: done:<owner> gets one entry per batch of an
owner's tasks that became final (written by the scripts); status long-polls block on it and
the results push announces its entries (Notice)."""
from __future__ import annotations

import redis


class DoneStreams:
    """The done:<owner> reads of TaskStore."""

    r: redis.Redis

    def done_cursor(self, owner: str) -> str:
        last = self.r.xrevrange(f"done:{owner}", count=1)
        return last[0][0].decode() if last else "0-0"

    def cursor_valid(self, owner: str, cursor: str) -> bool:
        """A cursor is usable while the notifications after it have not been trimmed away.
        One that is not a stream id (two 64-bit numbers) never was ours: not usable."""
        try:
            ms, seq = (int(x) for x in cursor.split("-"))
        except ValueError:
            return False
        if not (0 <= ms < 1 << 64 and 0 <= seq < 1 << 64):
            return False
        first = self.r.xrange(f"done:{owner}", count=1)
        if not first:
            return False
        head = tuple(int(x) for x in first[0][0].decode().split("-"))
        return (ms, seq) >= (head[0], head[1] - 1 if head[1] else 0)

    def done_since(self, owner: str, cursor: str) -> tuple[str, set[str]]:
        """Ids finished after cursor (without blocking), and the new cursor."""
        return self.wait_done(owner, cursor, 0)

    def wait_done(self, owner: str, cursor: str, timeout: float) -> tuple[str, set[str]]:
        """Block until tasks of this owner complete after cursor; returns new cursor and ids."""
        block = max(1, int(timeout * 1000)) if timeout > 0 else None
        got = self.r.xread({f"done:{owner}": cursor}, block=block, count=1000)
        ids: set[str] = set()
        for _stream, entries in got or []:
            for entry_id, fields in entries:
                cursor = entry_id.decode()
                ids.update(fields[b"ids"].decode().split(","))
        return cursor, ids
