"""The interchange's task record: a list indexed by these fields (a list, not an object,
because the hot path creates and reads one per task). Its own module so that the parts
that read records -- placement, staging -- need not import the interchange."""
from __future__ import annotations

T_ID, T_FN, T_PAYLOAD, T_WALL, T_PACK, T_RECV, T_TRIES, T_ROUTE, T_MGR = range(9)
