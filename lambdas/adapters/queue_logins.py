"""Redis ACL users of queue logins (an endpoint's `ep-<id>`, a lane's `ln-<ep>-<lane>`):
exactly the commands the queue client sends, each on exactly the keys it sends it to.

QUEUE_LOGIN_COMMANDS is the one source of truth: every Redis command the agents' queue
client (skyfn/protocol/queues/redis_streams.py and the functions of redis_lib.py, which
Redis checks against the caller's rules too) sends with a queue login, with the *roles*
of the keys one call may name and where the client sends it. `rules()` turns the table
into ACL SETUSER rules: the key-less commands at the root, one selector per distinct set
of roles (Redis 7 selectors: a command passes when one selector allows the command and
all of its keys). tests/service/test_queue_login_rules.py checks the table against what
the client really sends, and that everything else is refused.

Key roles (patterns come from lambdas/core/identity/queue_acl.py):
- queue:   the streams the login consumes (an endpoint: its task and control streams and
           its lanes' task streams; a lane: its own task stream)
- leases:  those streams' `:leases` sorted sets
- dead:    those streams' `:dlq` streams (a receive dead-letters an over-delivered message)
- feeds:   streams the login hands messages to (an endpoint: its lanes' task streams)
- results: the stream results go back on, write-only (`%W~`), XADD and nothing else

What is not in the table is refused (NOPERM): no EVAL, EVALSHA, SCRIPT, FUNCTION (an
agent runs the library's functions with FCALL, never code of its own), no XAUTOCLAIM,
XSETID, XTRIM, XGROUP other than CREATE, no reads at all of the results stream, no KEYS,
SCAN, FLUSH*, CONFIG, DEBUG, ACL, CLIENT, pub/sub or any other key.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Mapping

import redis

log = logging.getLogger("skyfn.queue_logins")

QUEUE, LEASES, DEAD, FEEDS, RESULTS = "queue", "leases", "dead", "feeds", "results"
ROLES = (QUEUE, LEASES, DEAD, FEEDS, RESULTS)
WRITE_ONLY = frozenset({RESULTS})  # %W~: the command may add, never read


@dataclass(frozen=True)
class Grant:
    command: str               # as ACL SETUSER names it ("xgroup|create": that subcommand only)
    keys: tuple[str, ...]      # roles one call's keys may have (all in one selector); () no key
    sent_by: str               # where the queue client sends it


# fmt: off
QUEUE_LOGIN_COMMANDS: tuple[Grant, ...] = (
    Grant("ping", (), "connection checks"),
    Grant("multi", (), "RedisStreamQueue.delete (one MULTI)"),
    Grant("exec", (), "RedisStreamQueue.delete"),
    Grant("discard", (), "redis-py, a MULTI given up"),
    Grant("time", (), "skyfn_q1_receive, skyfn_q1_extend: lease deadlines on the server's clock"),
    Grant("fcall", (QUEUE, LEASES, DEAD), "RedisStreamQueue.receive, extend (redis_lib functions)"),
    Grant("xgroup|create", (QUEUE,), "RedisStreamQueue.ensure"),
    Grant("xread", (QUEUE,), "RedisStreamQueue.receive: the long poll"),
    Grant("xreadgroup", (QUEUE,), "skyfn_q1_receive: new messages"),
    Grant("xpending", (QUEUE,), "skyfn_q1_receive, skyfn_q1_extend: who holds a message"),
    Grant("xclaim", (QUEUE,), "skyfn_q1_receive (an expired lease), skyfn_q1_extend"),
    Grant("xrange", (QUEUE,), "skyfn_q1_receive: the body of a message it dead-letters"),
    Grant("xinfo|stream", (QUEUE,), "skyfn_q1_receive: where a long poll waits from"),
    Grant("xack", (QUEUE,), "RedisStreamQueue.delete, skyfn_q1_receive"),
    Grant("xdel", (QUEUE,), "RedisStreamQueue.delete, skyfn_q1_receive"),
    Grant("xlen", (QUEUE,), "RedisStreamQueue.depth"),
    Grant("zadd", (LEASES,), "skyfn_q1_receive, skyfn_q1_extend"),
    Grant("zrem", (LEASES,), "RedisStreamQueue.delete, skyfn_q1_receive"),
    Grant("zrangebyscore", (LEASES,), "skyfn_q1_receive: expired leases"),
    Grant("zrange", (LEASES,), "skyfn_q1_receive: the next lease to expire"),
    Grant("zscore", (LEASES,), "skyfn_q1_extend"),
    Grant("xadd", (DEAD,), "skyfn_q1_receive: dead-lettering"),
    Grant("xadd", (FEEDS,), "RedisStreamQueue.send: the endpoint hands a lane its first tasks"),
    Grant("xadd", (RESULTS,), "RedisStreamQueue.send: result packs (the outbox)"),
)
# fmt: on


def rules(digest: str, keys: Mapping[str, Iterable[str]]) -> list[str]:
    """ACL SETUSER rules of a queue login with password hash `digest`; `keys` maps each role
    to its key patterns (a role without patterns grants nothing)."""
    unknown = set(keys) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown key roles {sorted(unknown)}: expected some of {ROLES}")
    out = ["reset", "on", f"#{digest}", "resetchannels", "resetkeys", "-@all"]
    out += [f"+{g.command}" for g in QUEUE_LOGIN_COMMANDS if not g.keys]
    groups: dict[tuple[str, ...], list[str]] = {}
    for g in QUEUE_LOGIN_COMMANDS:
        if g.keys:
            groups.setdefault(g.keys, []).append(g.command)
    for roles, commands in groups.items():
        patterns = [f"{'%W' if role in WRITE_ONLY else ''}~{p}" for role in roles for p in keys.get(role, ())]
        if not all(keys.get(role) for role in roles):
            continue  # a call needs keys of every role: none of this login's calls has them
        out.append("(" + " ".join([*patterns, *(f"+{c}" for c in commands)]) + ")")
    return out


def set_user(r: redis.Redis, user: str, digest: str, keys: Mapping[str, Iterable[str]]) -> None:
    """Create or replace the login (its open connections keep working until it is deleted)."""
    r.execute_command("ACL", "SETUSER", user, *rules(digest, keys))
    save(r)


def delete_users(r: redis.Redis, *users: str) -> None:
    """Remove the logins (any that do not exist are skipped); Redis also closes their
    connections. A failure is logged, not raised."""
    if not users:
        return
    try:
        r.execute_command("ACL", "DELUSER", *users)
        save(r)
    except redis.ResponseError as exc:
        log.warning("could not remove the Redis users %s: %s", ", ".join(users), exc)


def existing(r: redis.Redis, prefixes: tuple[str, ...]) -> dict[str, tuple[list[str], list[str]]]:
    """The users whose names start with one of `prefixes`: name -> (password hashes, the
    patterns of keys it may read, root and selectors)."""
    out = {}
    for raw in r.execute_command("ACL", "USERS"):
        user = raw.decode() if isinstance(raw, bytes) else raw
        if not user.startswith(prefixes):
            continue
        info = _pairs(r.execute_command("ACL", "GETUSER", user))
        if not info:
            continue  # deleted meanwhile
        parts = [info, *(_pairs(sel) for sel in info.get("selectors") or [])]
        patterns = [p[1:] for part in parts for p in _text(part.get("keys", "")).split() if p.startswith("~")]
        out[user] = ([_text(h) for h in info.get("passwords") or []], patterns)
    return out


def _pairs(flat) -> dict:
    if isinstance(flat, dict):
        return {_text(k): v for k, v in flat.items()}
    return {_text(flat[i]): flat[i + 1] for i in range(0, len(flat or []), 2)}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def save(r: redis.Redis) -> None:
    """Persist users in the server's ACL file, so they survive a restart of Redis (the
    embedded runtime starts redis-server with one). Without an ACL file users live until
    the server restarts; agents then get fresh ones by registering (or binding) again."""
    try:
        r.execute_command("ACL", "SAVE")
    except redis.ResponseError as exc:
        if "ACL file" not in str(exc) and "aclfile" not in str(exc).lower():
            raise
