"""The hot task store in Redis: task records (payload, state, events, result), the
idempotency keys, lease deadlines, completion notifications and the history outbox.

Every state change is an atomic compare-and-set in a Lua script that takes a whole
batch at once, so a batch of 10,000 tasks costs a handful of round trips. Key layout:

  t:<task>         hash: o owner, f function, e endpoint, sub submission, s state,
                   r retries, mr max retries, c created, ev events
                   ('STATE@ts;' appended), res result, err error, why reason,
                   rt retrieved at, h 1 once written to the durable history
  leases           zset task -> lease deadline (DISPATCHED/RUNNING tasks)
  purge            zset task -> time its record may be dropped from Redis
  done:<owner>     stream of completed task ids, read by long-polling status calls; every
                   script that writes final states adds one entry per owner and returns it
                   (prev, id, ids) as a Notice, which the results push announces
  outbox           list of history records to write to DynamoDB off the hot path
  idem:<owner>:<k> cached answer of a submission with an idempotency key
  load:<endpoint>  hash: function tag ('_' untagged) -> tasks queued to or running on the
                   endpoint, not yet final; changed in the same scripts as the states
                   (placement's live state at service level: lambdas/core/groups.py)
  memo:<owner>:<k> a memoized task's result (skyfn.protocol.memo key k), written by the
                   script that stores the SUCCEEDED result of a task created with 'mk' = k
  recent:<owner>   zset task -> created: the owner's latest RECENT_MAX tasks (GET /tasks,
                   reports and the status page; older ones come from the durable history);
                   first:<owner> the time of the owner's first task (tells whether it is complete)
  ds:<session>     hash: o owner, e endpoint, f:<function> 1: a direct session
                   (lambdas/core/sessions.py), whose reported results _DIRECT records
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import orjson
import redis

from skyfn.protocol.queues.redis_streams import SOCKET_TIMEOUT_S
from skyfn.protocol.states import parse_events

# Commands over many members go out in slices (Lua's unpack has a stack limit).
_BULK = """
local function bulk(cmd, key, items, width)
  local step = 4000 - 4000 % width
  for i = 1, #items, step do
    redis.call(cmd, key, unpack(items, i, math.min(i + step - 1, #items)))
  end
end
"""

# Each redis.call costs a few microseconds inside a script: one HSET per task, the index
# updates (recent:, load:) once per batch.
_CREATE = _BULK + """
local now = ARGV[2]
local tasks = cjson.decode(ARGV[1])
-- a keyed retry of an attempt that created its tasks (all in one script: all or none)
if ARGV[7] == '1' and tasks[1] and redis.call('EXISTS', 't:' .. tasks[1][1]) == 1 then return -1 end
local owner, sub = ARGV[3], ARGV[4]
local ev = 'CREATED@' .. now .. ';QUEUED@' .. ARGV[5] .. ';'
local recent, load = {}, {}
for i, t in ipairs(tasks) do
  local f = {'o', owner, 'f', t[2], 'e', t[3], 'sub', sub, 's', 'QUEUED', 'r', 0, 'mr', t[4], 'c', now, 'ev', ev}
  if t[6] and t[6] ~= cjson.null then f[#f + 1] = 'mk'; f[#f + 1] = t[6] end
  local tag = t[5]
  if tag and tag ~= cjson.null and tag ~= '' then
    f[#f + 1] = 'tg'; f[#f + 1] = tag
  else
    tag = '_'
  end
  redis.call('HSET', 't:' .. t[1], unpack(f))
  if t[3] ~= '' then
    local per = load[t[3]]
    if not per then per = {}; load[t[3]] = per end
    per[tag] = (per[tag] or 0) + 1
  end
  recent[#recent + 1] = now; recent[#recent + 1] = t[1]
end
for ep, per in pairs(load) do
  for tag, n in pairs(per) do redis.call('HINCRBY', 'load:' .. ep, tag, n) end
end
bulk('ZADD', 'recent:' .. owner, recent, 2)
redis.call('ZREMRANGEBYRANK', 'recent:' .. owner, 0, -(tonumber(ARGV[6] or '100000') + 1))
redis.call('EXPIRE', 'recent:' .. owner, 30 * 86400)
redis.call('SETNX', 'first:' .. owner, now)
if ARGV[8] then redis.call('RPUSH', 'outbox', ARGV[8]) end  -- the submission's history record
return #tasks
"""

# A task leaving for a final state no longer loads its endpoint (see load:<endpoint>).
_UNLOAD = """
local function unload(key)
  local v = redis.call('HMGET', key, 'e', 'tg')
  if v[1] and v[1] ~= '' then
    local field = v[2] or '_'
    if redis.call('HINCRBY', 'load:' .. v[1], field, -1) <= 0 then redis.call('HDEL', 'load:' .. v[1], field) end
  end
end
"""

# The completion-stream entry just before `id` ('0-0' if none): pushes carry it so that a
# client sees a gap in what it was told (skyfn.protocol.push).
_PREV = """
local function _prev(owner, id)
  local before = redis.call('XREVRANGE', 'done:' .. owner, '(' .. id, '-', 'COUNT', 1)
  if before[1] then return before[1][1] end
  return '0-0'
end
"""

# A final state is written once; duplicates (redelivered packs) are counted and ignored.
# One HMGET and one HSET per task; the leases, purge, outbox and load updates once per batch.
_FINISH = _BULK + _PREV + """
local rows = cjson.decode(ARGV[1])
local now = ARGV[2]
local from = ARGV[4] or ''
local purge_at = tonumber(now) + tonumber(ARGV[3])
local done, owners = {}, {}
local ended, purge, unload = {}, {}, {}
local stored, dup, unknown = 0, 0, 0
for i, r in ipairs(rows) do
  local key = 't:' .. r[1]
  local v = redis.call('HMGET', key, 's', 'e', 'ev', 'o', 'tg', 'mk')
  local s = v[1]
  if not s or (from ~= '' and v[2] ~= from) then
    unknown = unknown + 1  -- or routed to another endpoint than the sender's: not its to answer
  elseif s == 'SUCCEEDED' or s == 'FAILED' or s == 'TIMED_OUT' or s == 'CANCELLED' then
    dup = dup + 1
  else
    local f = {'s', r[2], 'ev', (v[3] or '') .. r[6] .. r[2] .. '@' .. now .. ';STORED@' .. now .. ';'}
    if r[3] ~= cjson.null then f[#f + 1] = 'res'; f[#f + 1] = r[3] end
    if r[4] ~= cjson.null then f[#f + 1] = 'err'; f[#f + 1] = r[4] end
    if r[5] ~= cjson.null then f[#f + 1] = 'why'; f[#f + 1] = r[5] end
    if r[7] and r[7] ~= cjson.null then f[#f + 1] = 'so'; f[#f + 1] = r[7] end
    if r[8] and r[8] ~= cjson.null then f[#f + 1] = 'se'; f[#f + 1] = r[8] end
    redis.call('HSET', key, unpack(f))
    if v[2] and v[2] ~= '' then
      local per = unload[v[2]]
      if not per then per = {}; unload[v[2]] = per end
      local field = v[5] or '_'
      per[field] = (per[field] or 0) + 1
    end
    ended[#ended + 1] = r[1]
    purge[#purge + 1] = purge_at; purge[#purge + 1] = r[1]
    local owner = v[4]
    if r[2] == 'SUCCEEDED' and r[3] ~= cjson.null and ARGV[5] and v[6] then
      redis.call('SET', 'memo:' .. owner .. ':' .. v[6], r[3], 'EX', ARGV[5])
    end
    if not done[owner] then done[owner] = {}; owners[#owners + 1] = owner end
    table.insert(done[owner], r[1])
    stored = stored + 1
  end
end
for ep, per in pairs(unload) do
  for field, n in pairs(per) do
    if redis.call('HINCRBY', 'load:' .. ep, field, -n) <= 0 then redis.call('HDEL', 'load:' .. ep, field) end
  end
end
if #ended > 0 then
  bulk('ZREM', 'leases', ended, 1)
  bulk('ZADD', 'purge', purge, 2)
  bulk('RPUSH', 'outbox', ended, 1)
end
local notices = {}
for _, owner in ipairs(owners) do
  local csv = table.concat(done[owner], ',')
  local id = redis.call('XADD', 'done:' .. owner, 'MAXLEN', '~', 10000, '*', 'ids', csv)
  redis.call('EXPIRE', 'done:' .. owner, 86400)
  table.insert(notices, {owner, _prev(owner, id), id, csv})
end
return {stored, dup, unknown, notices}
"""

# Memo hits: tasks created already SUCCEEDED with the cached result, never queued or
# dispatched; their events say MEMO_HIT. Like _FINISH, they are announced on done:<owner>.
_MEMO_HIT = _PREV + """
local rows = cjson.decode(ARGV[1])
local created, now, owner, sub = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local ids = {}
for i, t in ipairs(rows) do
  local key = 't:' .. t[1]
  if redis.call('EXISTS', key) == 0 then
    redis.call('HSET', key, 'o', owner, 'f', t[2], 'e', t[3], 'sub', sub, 's', 'SUCCEEDED', 'r', 0, 'mr', 0,
               'c', created, 'res', t[4], 'mk', t[5],
               'ev', 'CREATED@' .. created .. ';MEMO_HIT@' .. now .. ';SUCCEEDED@' .. now .. ';STORED@' .. now .. ';')
    if t[6] and t[6] ~= cjson.null and t[6] ~= '' then redis.call('HSET', key, 'tg', t[6]) end
    redis.call('ZADD', 'purge', tonumber(now) + tonumber(ARGV[6]), t[1])
    redis.call('RPUSH', 'outbox', t[1])
    redis.call('ZADD', 'recent:' .. owner, created, t[1])
    table.insert(ids, t[1])
  end
end
if #ids > 0 then
  local csv = table.concat(ids, ',')
  local id = redis.call('XADD', 'done:' .. owner, 'MAXLEN', '~', 10000, '*', 'ids', csv)
  redis.call('EXPIRE', 'done:' .. owner, 86400)
  return {#ids, _prev(owner, id), id, csv}
end
return {0}
"""

# Results of direct sessions (skyfn.protocol.direct): tasks the service never queued, created
# here in their final state for the owner of their session record ds:<session>, only if the
# session is the sending endpoint's and names the function. Create-if-absent: a redelivered
# pack counts duplicates. Indexed like any finished task (recent:, purge, outbox) but never
# announced on done:<owner>: the SDK has the results already, and an entry nobody pushes
# would show its connections a gap. The SDK got each result from the agent: it counts as
# retrieved, purged result_ttl from now.
_DIRECT = _BULK + """
local rows = cjson.decode(ARGV[1])
local now, from = ARGV[2], ARGV[4]
local purge_at = tonumber(now) + tonumber(ARGV[3])
local sessions, recent, owners = {}, {}, {}
local ended, purge = {}, {}
local stored, dup, unknown = 0, 0, 0
for i, r in ipairs(rows) do
  local sk = 'ds:' .. r[2]
  local owner = sessions[r[2]]
  if owner == nil then
    local v = redis.call('HMGET', sk, 'o', 'e')
    owner = (v[1] and v[2] == from) and v[1] or false
    sessions[r[2]] = owner
  end
  local key = 't:' .. r[1]
  if not owner or redis.call('HEXISTS', sk, 'f:' .. r[3]) == 0 then
    unknown = unknown + 1
  elseif redis.call('EXISTS', key) == 1 then
    dup = dup + 1
  else
    local f = {'o', owner, 'f', r[3], 'e', from, 'sub', r[2], 's', r[4], 'r', 0, 'mr', 0, 'c', r[11], 'rt', now,
               'ev', r[8] .. r[4] .. '@' .. now .. ';STORED@' .. now .. ';'}
    if r[5] ~= cjson.null then f[#f + 1] = 'res'; f[#f + 1] = r[5] end
    if r[6] ~= cjson.null then f[#f + 1] = 'err'; f[#f + 1] = r[6] end
    if r[7] ~= cjson.null then f[#f + 1] = 'why'; f[#f + 1] = r[7] end
    if r[9] ~= cjson.null then f[#f + 1] = 'so'; f[#f + 1] = r[9] end
    if r[10] ~= cjson.null then f[#f + 1] = 'se'; f[#f + 1] = r[10] end
    redis.call('HSET', key, unpack(f))
    ended[#ended + 1] = r[1]
    purge[#purge + 1] = purge_at; purge[#purge + 1] = r[1]
    local per = recent[owner]
    if not per then per = {}; recent[owner] = per; owners[#owners + 1] = owner end
    per[#per + 1] = r[11]; per[#per + 1] = r[1]
    stored = stored + 1
  end
end
if #ended > 0 then
  bulk('ZADD', 'purge', purge, 2)
  bulk('RPUSH', 'outbox', ended, 1)
end
for _, owner in ipairs(owners) do
  bulk('ZADD', 'recent:' .. owner, recent[owner], 2)
  redis.call('ZREMRANGEBYRANK', 'recent:' .. owner, 0, -(tonumber(ARGV[5]) + 1))
  redis.call('EXPIRE', 'recent:' .. owner, 30 * 86400)
  redis.call('SETNX', 'first:' .. owner, recent[owner][1])
end
return {stored, dup, unknown}
"""

_RANK = "{CREATED=0, QUEUED=1, DISPATCHED=2, RUNNING=3}"

# Progress never moves a task backwards; LEASE only extends a live lease.
_PROGRESS = _BULK + """
local rank = """ + _RANK + """
local rows = cjson.decode(ARGV[1])
local now = tonumber(ARGV[2])
local from = ARGV[3] or ''
local applied = 0
local leases = {}
for i, u in ipairs(rows) do
  local key = 't:' .. u[1]
  local v = redis.call('HMGET', key, 's', 'e', 'ev')
  local s = v[1]
  if s and rank[s] ~= nil and (from == '' or v[2] == from) then
    if u[2] ~= 'LEASE' and rank[u[2]] > rank[s] then
      redis.call('HSET', key, 's', u[2], 'ev', (v[3] or '') .. u[2] .. '@' .. u[3] .. ';')
      leases[#leases + 1] = now + u[4]; leases[#leases + 1] = u[1]
      applied = applied + 1
    elseif s == 'DISPATCHED' or s == 'RUNNING' then
      leases[#leases + 1] = now + u[4]; leases[#leases + 1] = u[1]
      applied = applied + 1
    end
  end
end
if #leases > 0 then bulk('ZADD', 'leases', leases, 2) end  -- a task listed twice: its last lease wins
return applied
"""

# Expired leases: back to QUEUED with one more retry, or FAILED past the retry budget. The
# failed ones are announced like _FINISH's: one completion-stream entry per owner, returned
# with the reasons (for the results push).
_EXPIRE = _UNLOAD + _PREV + """
local now = ARGV[1]
local ids = redis.call('ZRANGEBYSCORE', 'leases', '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local requeued, failed = 0, 0
local done, why, owners = {}, {}, {}
for i, id in ipairs(ids) do
  redis.call('ZREM', 'leases', id)
  local key = 't:' .. id
  local s = redis.call('HGET', key, 's')
  if s == 'DISPATCHED' or s == 'RUNNING' then
    local r = redis.call('HINCRBY', key, 'r', 1)
    local mr = tonumber(redis.call('HGET', key, 'mr') or '0')
    if r > mr then
      local reason = 'lease expired ' .. r .. ' times (the endpoint agent running it was lost); retry budget max_retries=' .. mr .. ' exhausted'
      redis.call('HSET', key, 's', 'FAILED', 'why', reason,
                 'ev', (redis.call('HGET', key, 'ev') or '') .. 'FAILED@' .. now .. ';')
      unload(key)
      redis.call('ZADD', 'purge', tonumber(now) + tonumber(ARGV[3]), id)
      redis.call('RPUSH', 'outbox', id)
      local owner = redis.call('HGET', key, 'o')
      if not done[owner] then done[owner], why[owner] = {}, {}; table.insert(owners, owner) end
      table.insert(done[owner], id)
      table.insert(why[owner], reason)
      failed = failed + 1
    else
      redis.call('HSET', key, 's', 'QUEUED', 'ev', (redis.call('HGET', key, 'ev') or '') .. 'QUEUED@' .. now .. ';')
      requeued = requeued + 1
    end
  end
end
local notices = {}
for _, owner in ipairs(owners) do
  local csv = table.concat(done[owner], ',')
  local id = redis.call('XADD', 'done:' .. owner, 'MAXLEN', '~', 10000, '*', 'ids', csv)
  redis.call('EXPIRE', 'done:' .. owner, 86400)
  table.insert(notices, {owner, _prev(owner, id), id, csv, why[owner]})
end
return {requeued, failed, notices}
"""

# A cancel newly written returns its completion-stream entry (prev, id); a retried one none.
_CANCEL = _UNLOAD + _PREV + """
local key = 't:' .. ARGV[1]
local s = redis.call('HGET', key, 's')
if not s then return false end
if redis.call('HGET', key, 'o') ~= ARGV[2] then return false end
if s == 'CANCELLED' then return {'OK', redis.call('HGET', key, 'e')} end
if s == 'SUCCEEDED' or s == 'FAILED' or s == 'TIMED_OUT' then return {s, false} end
redis.call('HSET', key, 's', 'CANCELLED', 'why', ARGV[5],
           'ev', (redis.call('HGET', key, 'ev') or '') .. 'CANCELLED@' .. ARGV[3] .. ';')
unload(key)
redis.call('ZREM', 'leases', ARGV[1])
redis.call('ZADD', 'purge', tonumber(ARGV[3]) + tonumber(ARGV[4]), ARGV[1])
redis.call('RPUSH', 'outbox', ARGV[1])
local id = redis.call('XADD', 'done:' .. ARGV[2], 'MAXLEN', '~', 10000, '*', 'ids', ARGV[1])
redis.call('EXPIRE', 'done:' .. ARGV[2], 86400)
return {'OK', redis.call('HGET', key, 'e'), _prev(ARGV[2], id), id}
"""

# Results handed over by the push count as read: purged result_ttl from then.
_RETRIEVED = _BULK + """
local now = ARGV[1]
local at = tonumber(now) + tonumber(ARGV[2])
local purge = {}
for i = 3, #ARGV do
  redis.call('HSETNX', 't:' .. ARGV[i], 'rt', now)
  purge[#purge + 1] = at; purge[#purge + 1] = ARGV[i]
end
bulk('ZADD', 'purge', purge, 2)
return #ARGV - 2
"""

# Status read: owner-checked; final tasks are marked retrieved and scheduled for purge.
_STATUS = """
local ids = cjson.decode(ARGV[1])
local owner, now, ttl, with_events = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5] == '1'
local out = {}
for i, id in ipairs(ids) do
  local key = 't:' .. id
  local v = redis.call('HMGET', key, 'o', 's', 'res', 'err', 'why', 'r', 'ev', 'so', 'se')
  if v[1] ~= owner then
    out[i] = false
  else
    local s = v[2]
    if s == 'SUCCEEDED' or s == 'FAILED' or s == 'TIMED_OUT' or s == 'CANCELLED' then
      if ARGV[6] == '1' and redis.call('HSETNX', key, 'rt', now) == 1 then
        redis.call('ZADD', 'purge', now + ttl, id)
      end
    end
    if not with_events then v[7] = false end
    out[i] = {s, v[3] or false, v[4] or false, v[5] or false, v[6] or '0', v[7] or false, v[8] or false, v[9] or false}
  end
end
return out
"""


@dataclass
class TaskRow:
    task_id: str
    state: str
    result: str | None
    error: str | None
    reason: str | None
    retries: int
    events: list[tuple[str, float]] | None
    stdout: str | None = None
    stderr: str | None = None


Status = tuple[str, Any, Any, Any]  # state, result, error, reason


@dataclass
class Notice:
    """One entry of an owner's completion stream (done:<owner>): what the results push
    announces: the task ids that became final together. Every store method that writes a
    final state returns the notices of what it wrote; `statuses` (task id -> Status) are
    what the push may carry inline, filled in by all but the results function's hot path
    (finish_notify: its caller has them)."""
    owner: str
    prev: str
    cursor: str
    ids: list[str]
    statuses: dict[str, Status] = field(default_factory=dict)


FINAL = frozenset({"SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED"})
CANCEL_REASON = "cancelled by its owner"
RECENT_MAX = 100_000  # tasks per owner in recent:<owner>


def _s(v: Any) -> str | None:
    if v is None or v is False:
        return None
    return v.decode() if isinstance(v, bytes) else v


class TaskStore:
    """Batch operations on the hot task store."""

    def __init__(self, client: redis.Redis, result_ttl: float = 600.0, unretrieved_ttl: float = 7 * 86400.0,
                 memo_ttl: float = 7 * 86400.0):
        self.r = client
        self.result_ttl = result_ttl
        self.unretrieved_ttl = unretrieved_ttl
        self.memo_ttl = memo_ttl
        self._memo_hit = client.register_script(_MEMO_HIT)
        self._create = client.register_script(_CREATE)
        self._finish = client.register_script(_FINISH)
        self._progress = client.register_script(_PROGRESS)
        self._expire = client.register_script(_EXPIRE)
        self._cancel = client.register_script(_CANCEL)
        self._status = client.register_script(_STATUS)
        self._retrieved = client.register_script(_RETRIEVED)
        self._direct = client.register_script(_DIRECT)

    @classmethod
    def from_url(cls, url: str, **kw: Any) -> "TaskStore":
        return cls(redis.Redis.from_url(url, socket_keepalive=True, health_check_interval=30,
                                        socket_timeout=SOCKET_TIMEOUT_S), **kw)

    # --- submission -------------------------------------------------------------
    def create(self, owner: str, submission_id: str, rows: list[list[Any]], created: float, queued: float,
               submission_record: dict[str, Any] | None = None, only_if_new: bool = False) -> int:
        """rows: [task_id, function_id, endpoint_id, max_retries(, function tag(, memo key))];
        all start QUEUED and count in load:<endpoint> until final (an empty
        endpoint_id: none). A task with a memo key caches its result when it SUCCEEDS.
        `submission_record` goes to the history outbox in the same script (see
        enqueue_submission_record). Returns how many were created, or -1, creating
        nothing, when `only_if_new` and the first task exists (a retried submission)."""
        args = [orjson.dumps(rows), f"{created:.6f}", owner, submission_id, f"{queued:.6f}", RECENT_MAX,
                "1" if only_if_new else "0"]
        if submission_record is not None:
            args.append(b"sub:" + orjson.dumps(submission_record))
        return int(self._create(args=args))

    # --- memoization (skyfn.protocol.memo) -----------------------------------------
    def memo_lookup(self, owner: str, keys: list[str]) -> list[str | None]:
        """The cached result for each memo key, or None."""
        if not keys:
            return []
        return [_s(v) for v in self.r.mget([f"memo:{owner}:{k}" for k in keys])]

    def create_memo_hits(self, owner: str, submission_id: str, rows: list[list[Any]], created: float) -> int:
        """rows: [task_id, function_id, endpoint_id, cached result, memo key, function tag]:
        tasks answered from the cache, stored SUCCEEDED at once (ids that exist are left
        alone: a retried submission). Returns how many were created."""
        return self.create_memo_hits_notify(owner, submission_id, rows, created)[0]

    def create_memo_hits_notify(self, owner: str, submission_id: str, rows: list[list[Any]],
                                created: float) -> tuple[int, list[Notice]]:
        """create_memo_hits, and the completion-stream entry it added (for the results push)."""
        if not rows:
            return 0, []
        out = self._memo_hit(args=[orjson.dumps(rows), f"{created:.6f}", f"{time.time():.6f}", owner,
                                   submission_id, self.unretrieved_ttl])
        if int(out[0]) == 0:
            return 0, []
        ids = _s(out[3]).split(",")  # those created: ids that existed (a retried submission) are not in it
        created = set(ids)
        return len(ids), [Notice(owner, _s(out[1]), _s(out[2]), ids,
                                 {r[0]: ("SUCCEEDED", r[3], None, None) for r in rows if r[0] in created})]

    def fail_unqueued(self, task_ids: list[str], reason: str) -> list[Notice]:
        """Tasks stored but never enqueued (the queue refused them) are failed, not left
        hanging. Returns the notices of those it failed (for push.notify)."""
        return self.finish([[tid, "FAILED", None, None, reason, ""] for tid in task_ids])[3]

    def idempotent_claim_or_get(self, owner: str, key: str, seconds: int = 300) -> bytes | None:
        """Claim the key (None: claimed now) or get what it holds: b'pending' while another
        attempt holds the claim, else that attempt's stored answer. One round trip
        (SET NX GET, Redis 7)."""
        return self.r.set(f"idem:{owner}:{key}", b"pending", nx=True, ex=seconds, get=True)

    def idempotent_claim(self, owner: str, key: str, seconds: int = 300) -> bool:
        return bool(self.r.set(f"idem:{owner}:{key}", b"pending", nx=True, ex=seconds))

    def idempotent_store(self, owner: str, key: str, answer: bytes, seconds: int = 86400) -> None:
        self.r.set(f"idem:{owner}:{key}", answer, ex=seconds)

    def idempotent_release(self, owner: str, key: str) -> None:
        self.r.delete(f"idem:{owner}:{key}")

    # --- results and progress from agents ---------------------------------------
    def finish(self, rows: list[list[Any]], endpoint_id: str = "") -> tuple[int, int, int, list[Notice]]:
        """rows: [task_id, state, result, error, reason, agent events 'S@ts;...'
        (, stdout, stderr)]. With `endpoint_id` (results from an agent), only tasks routed
        to that endpoint are finished; others count as unknown. Returns (stored, duplicates
        ignored, unknown ids, notices): one notice per owner, with the statuses stored."""
        stored, dup, unknown, notices = self.finish_notify(rows, endpoint_id)
        if notices:
            by_id = {r[0]: r for r in rows}
            for n in notices:
                n.statuses = {tid: (by_id[tid][1], by_id[tid][2], by_id[tid][3], by_id[tid][4]) for tid in n.ids}
        return stored, dup, unknown, notices

    def finish_notify(self, rows: list[list[Any]], endpoint_id: str = "") -> tuple[int, int, int, list[Notice]]:
        """finish for the results function's hot path: the notices come without statuses
        (the caller passes its rows' to push.notify)."""
        stored, dup, unknown, raw = self._finish(args=[orjson.dumps(rows), f"{time.time():.6f}", self.unretrieved_ttl,
                                                       endpoint_id, int(self.memo_ttl)])
        notices = [Notice(_s(owner), _s(prev), _s(entry), _s(csv).split(","))
                   for owner, prev, entry, csv in raw or ()]
        return int(stored), int(dup), int(unknown), notices

    def record_direct(self, rows: list[list[Any]], endpoint_id: str) -> tuple[int, int, int]:
        """Tasks of direct sessions, created final: rows [task_id, session, function_id,
        state, result, error, reason, events 'S@ts;...' from CREATED on, stdout, stderr,
        created]. Only rows whose session record ds:<session> is `endpoint_id`'s and names
        the function are stored, with the session's owner; the others count as unknown,
        tasks that exist already as duplicates. Returns (stored, duplicates, unknown)."""
        stored, dup, unknown = self._direct(args=[orjson.dumps(rows), f"{time.time():.6f}", self.result_ttl,
                                                  endpoint_id, RECENT_MAX])
        return int(stored), int(dup), int(unknown)

    def mark_retrieved(self, task_ids: list[str]) -> None:
        """Results handed to their owner by the push: purged result_ttl from now, as if read."""
        if not task_ids:
            return
        self._retrieved(args=[f"{time.time():.6f}", self.result_ttl, *task_ids])

    def progress(self, rows: list[list[Any]], endpoint_id: str = "") -> int:
        """rows: [task_id, DISPATCHED|RUNNING|LEASE, ts, lease_seconds]; with `endpoint_id`,
        only tasks routed to that endpoint move."""
        return int(self._progress(args=[orjson.dumps(rows), f"{time.time():.6f}", endpoint_id]))

    def expire_leases(self, limit: int = 5000) -> tuple[int, int, list[Notice]]:
        """Expired leases: (requeued, failed past their retry budget, notices of the failed)."""
        requeued, failed, raw = self._expire(args=[f"{time.time():.6f}", limit, self.unretrieved_ttl])
        notices = []
        for owner, prev, entry, csv, reasons in raw or ():
            ids = _s(csv).split(",")
            notices.append(Notice(_s(owner), _s(prev), _s(entry), ids,
                                  {tid: ("FAILED", None, None, _s(why)) for tid, why in zip(ids, reasons)}))
        return int(requeued), int(failed), notices

    def cancel(self, owner: str, task_id: str) -> tuple[str, str | None, list[Notice]] | None:
        """('OK', endpoint, notices) when cancelled (the notice only when cancelled now: a
        retried cancel succeeds again, unannounced), (final state, None, []) when it finished
        otherwise, None when unknown."""
        out = self._cancel(args=[task_id, owner, f"{time.time():.6f}", self.result_ttl, CANCEL_REASON])
        if not out:
            return None
        notices = []
        if len(out) > 2:
            notices.append(Notice(owner, _s(out[2]), _s(out[3]), [task_id],
                                  {task_id: ("CANCELLED", None, None, CANCEL_REASON)}))
        return _s(out[0]), _s(out[1]), notices

    # --- reads ---------------------------------------------------------------------
    def status(self, owner: str, task_ids: list[str], with_events: bool = False,
               mark_retrieved: bool = True) -> dict[str, TaskRow | None]:
        raw = self._status(args=[orjson.dumps(task_ids), owner, f"{time.time():.6f}", self.result_ttl,
                                 "1" if with_events else "0", "1" if mark_retrieved else "0"])
        out: dict[str, TaskRow | None] = {}
        for tid, v in zip(task_ids, raw):
            if not v:
                out[tid] = None
                continue
            ev = _s(v[5])
            out[tid] = TaskRow(tid, _s(v[0]), _s(v[1]), _s(v[2]), _s(v[3]), int(v[4]),
                               parse_events(ev) if ev is not None else None, _s(v[6]), _s(v[7]))
        return out

    def recent(self, owner: str, since: float, limit: int) -> tuple[list[dict[str, str]], list[str], float | None]:
        """The owner's tasks created at or after `since`, newest first (at most `limit`):
        (records still in the hot store, with 'task_id'; ids whose record was purged; the
        time from which the index is complete, None when it may miss older ones)."""
        key = f"recent:{owner}"
        pipe = self.r.pipeline(transaction=False)
        pipe.zrevrangebyscore(key, "+inf", since, start=0, num=limit)
        pipe.zrange(key, 0, 0, withscores=True)
        pipe.zcard(key)
        pipe.get(f"first:{owner}")
        got, oldest, size, first = pipe.execute()
        ids = [i.decode() for i in got]
        if not oldest:  # nothing indexed: complete if the owner never submitted anything
            complete_from = 0.0 if first is None else None
        elif size >= RECENT_MAX or (first is not None and float(first) < float(oldest[0][1]) - 1):
            complete_from = float(oldest[0][1])  # trimmed, or expired after a month idle
        else:
            complete_from = 0.0  # every task the owner ever submitted is in it
        fields = ("o", "f", "e", "s", "c", "ev", "r", "why")
        pipe = self.r.pipeline(transaction=False)
        for tid in ids:
            pipe.hmget(f"t:{tid}", fields)
        out = []
        missing = []
        for tid, values in zip(ids, pipe.execute() if ids else []):
            if values[0] is not None:
                rec = {k: v.decode() for k, v in zip(fields, values) if v is not None}
                rec["task_id"] = tid
                out.append(rec)
            else:
                missing.append(tid)
        return out, missing, complete_from

    def record(self, task_id: str) -> dict[str, str]:
        raw = self.r.hgetall(f"t:{task_id}")
        return {k.decode(): v.decode() for k, v in raw.items()}

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

    # --- housekeeping ----------------------------------------------------------------
    def purge(self, limit: int = 5000) -> int:
        """Drop records whose time is up, but only once they are in the durable history."""
        now = time.time()
        ids = [i.decode() for i in self.r.zrangebyscore("purge", "-inf", now, start=0, num=limit)]
        if not ids:
            return 0
        pipe = self.r.pipeline(transaction=False)
        for tid in ids:
            pipe.hget(f"t:{tid}", "h")
        flags = pipe.execute()
        ready = [tid for tid, h in zip(ids, flags) if h is not None]
        gone = [tid for tid, h in zip(ids, flags) if h is None and not self.r.exists(f"t:{tid}")]
        pipe = self.r.pipeline(transaction=False)
        for tid in ready:
            pipe.delete(f"t:{tid}")
        if ready or gone:
            pipe.zrem("purge", *(ready + gone))
        pipe.execute()
        return len(ready)

    def outbox_take(self, count: int) -> list[str]:
        items = self.r.lpop("outbox", count)
        return [i.decode() for i in items or []]

    def outbox_return(self, items: Iterable[str]) -> None:
        items = list(items)
        if items:
            self.r.lpush("outbox", *reversed(items))

    def records(self, task_ids: list[str]) -> list[dict[str, str]]:
        pipe = self.r.pipeline(transaction=False)
        for tid in task_ids:
            pipe.hgetall(f"t:{tid}")
        out = []
        for tid, raw in zip(task_ids, pipe.execute()):
            rec = {k.decode(): v.decode() for k, v in raw.items()}
            if rec:
                rec["task_id"] = tid
                out.append(rec)
        return out

    def mark_historized(self, task_ids: list[str]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for tid in task_ids:
            pipe.hset(f"t:{tid}", "h", 1)
        pipe.execute()

    def enqueue_submission_record(self, record: dict[str, Any]) -> None:
        self.r.rpush("outbox", b"sub:" + orjson.dumps(record))
