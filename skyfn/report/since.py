"""Parsing of ``--since`` / ``since=``: epoch seconds, an ISO 8601 time, or an age such as
"90s", "30m", "2h", "1d" (before now). None: the last hour."""
from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from typing import Optional, Union

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(since: Union[float, int, str, None], now: Optional[float] = None) -> float:
    now = time.time() if now is None else now
    if since is None:
        return now - 3600
    if isinstance(since, (int, float)):
        return float(since)
    text = str(since).strip()
    m = _AGE.match(text)
    if m:
        return now - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"since={since!r}: use epoch seconds, an ISO 8601 time or an age like 30m, 2h, 1d") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()
