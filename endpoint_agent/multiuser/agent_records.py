"""A user agent's record and process: the `UserAgent` dataclass (what it runs as, its queues,
its process, its lane), kept as 0600 JSON in `<state dir>/agents/<key>.json`, and the helpers
that read those records when a privileged process killed hard left its user agents running
(`end_leftover_agents`, `is_user_agent`), or check the group that gates identities.json
(`check_peer_gid`). The registry that starts and supervises them is user_agents.py.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from endpoint_agent.multiuser.accounts import Account
from endpoint_agent.multiuser.router_redis import prefix_of
from endpoint_agent.procutil import pid_alive
from skyfn.protocol.queues.redis_streams import RedisStreamQueue

STOP_TIMEOUT_S = 60.0

@dataclass
class UserAgent:
    """One user agent: what it runs as, its queues, its process."""

    key: str
    account: Account
    digest: str
    config: dict
    acl_user: str
    password: str
    endpoint_id: str
    pid: Optional[int] = None
    proc: Optional[subprocess.Popen] = None
    started: float = 0.0
    last_active: float = field(default_factory=time.monotonic)
    quick_exits: int = 0
    stopping: bool = False
    identities: set[str] = field(default_factory=set)  # skyfn user ids whose tasks it ran
    queues: dict[str, RedisStreamQueue] = field(default_factory=dict)
    lane: Optional[dict] = None  # LaneGranted (skyfn.protocol.lanes) when the service sends its tasks directly
    bindings: set[str] = field(default_factory=set)  # "<identity id> <config key>" bound to its lane
    lane_queue: Optional[RedisStreamQueue] = None  # the endpoint's handle on the lane's task queue
    start_failures: int = 0  # in a row: how long the back-off is
    retry_at: float = 0.0  # monotonic: not started again before (backed off)
    refusal: Optional[str] = None  # why it could not start, while backed off
    unbind_at: float = 0.0  # monotonic: its idle lane is not tried to be unbound again before (the service was down)

    @property
    def tasks(self) -> RedisStreamQueue:
        """Where its tasks wait: its lane's queue at the service, or its stream in the router's Redis."""
        return self.lane_queue if self.lane_queue is not None else self.queues["tasks"]

    @property
    def prefix(self) -> str:
        return prefix_of(self.account.name, self.digest[:12])

    def stream(self, kind: str) -> str:
        return self.prefix + kind

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return self.pid is not None and pid_alive(self.pid)

    def record(self) -> dict[str, Any]:
        return {"key": self.key, "account": self.account.name, "digest": self.digest, "config": self.config,
                "acl_user": self.acl_user, "password": self.password, "endpoint_id": self.endpoint_id,
                "pid": self.pid, "identities": sorted(self.identities), "lane": self.lane,
                "bindings": sorted(self.bindings)}



def check_peer_gid(gid: int) -> None:
    """ConfigError unless no group and no account has `gid` (it gates who reads identities.json)."""
    import grp
    import pwd

    from endpoint_agent.errors import ConfigError

    try:
        group = grp.getgrgid(gid)
    except KeyError:
        group = None
    if group is not None:
        raise ConfigError(f"peer_gid {gid} is the gid of group {group.gr_name}: its members would read which skyfn "
                          "identities run as which uid; choose a gid no group and no account has")
    taken = [p.pw_name for p in pwd.getpwall() if p.pw_gid == gid]
    if taken:
        raise ConfigError(f"peer_gid {gid} is the primary gid of {', '.join(taken[:3])}; choose a gid no group "
                          "and no account has")


def is_user_agent(pid: int, uid: int) -> bool:
    """pid is a user agent process of the account (not a reused pid)."""
    try:
        st = os.stat(f"/proc/{pid}")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return st.st_uid == uid and b"endpoint_agent.multiuser.user_agent" in cmd


def end_leftover_agents(state_dir: Path, timeout: float = STOP_TIMEOUT_S) -> list[int]:
    """Stop (SIGTERM, then SIGKILL after `timeout`) the user agents a privileged process killed
    hard left running; their records stay, so tasks left in their streams are taken up at the
    next start. Returns their pids."""
    pids = []
    for path in sorted((Path(state_dir) / "agents").glob("*.json")):
        try:
            rec = json.loads(path.read_text())
            uid = pwd_uid(rec["account"])
        except (OSError, ValueError, KeyError):
            continue
        pid = rec.get("pid")
        if pid and is_user_agent(pid, uid):
            os.kill(pid, signal.SIGTERM)
            pids.append(pid)
    deadline = time.monotonic() + timeout
    for pid in pids:
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    return pids


def pwd_uid(account: str) -> int:
    import pwd

    return pwd.getpwnam(account).pw_uid
