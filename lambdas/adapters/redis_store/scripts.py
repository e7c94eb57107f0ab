"""The Lua scripts of the hot task store (lambdas/adapters/redis_store): every state change
is an atomic compare-and-set that takes a whole batch at once, so a batch of 10,000 tasks
costs a handful of round trips. The key layout is in the package's docstring."""
from __future__ import annotations

from lambdas.adapters.redis_store.graph_scripts import DROP_PARK, EXPIRE_ARCHIVED, PINS

# Scripts that finish, read or archive work already accepted run even when Redis is at its
# maxmemory (noeviction refuses other writes then): the service answers new submissions
# 429 at that point (lambdas/core/tasks/backlog.py), but tasks it took must still end,
# their results be read and their records archived, which is what frees the memory.
# CREATE and MEMO_HIT (new work) are refused. The flag must be the script's first line.
_ALLOW_OOM = "#!lua flags=allow-oom\n"

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
CREATE = _BULK + """
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
# One HMGET and one HSET per task; the leases, outbox and load updates once per batch.
FINISH = _ALLOW_OOM + _BULK + _PREV + DROP_PARK + """
local rows = cjson.decode(ARGV[1])
local now = ARGV[2]
local unread_ms = math.floor(tonumber(ARGV[3]) * 1000)
local from = ARGV[4] or ''
local ttl = tonumber(ARGV[6] or '0')
local done, owners = {}, {}
local ended, unload = {}, {}
local stored, dup, unknown = 0, 0, 0
for i, r in ipairs(rows) do
  local key = 't:' .. r[1]
  local v = redis.call('HMGET', key, 's', 'e', 'ev', 'o', 'tg', 'mk', 'wd', 'pk')
  local s = v[1]
  if not s or (s == 'WAITING' and not v[8]) or (from ~= '' and v[2] ~= from) then
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
    if v[8] then drop_park(key, ttl, unread_ms) end  -- released by its agent
    if v[2] and v[2] ~= '' and s ~= 'WAITING' then  -- a parked task loads its endpoint once it runs
      local per = unload[v[2]]
      if not per then per = {}; unload[v[2]] = per end
      local field = v[5] or '_'
      per[field] = (per[field] or 0) + 1
    end
    ended[#ended + 1] = r[1]
    if v[7] then redis.call('RPUSH', 'settled', r[1]) end  -- its dependents are told (graph_scripts)
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
# dispatched; their events say MEMO_HIT. Like FINISH, they are announced on done:<owner>.
MEMO_HIT = _PREV + """
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
# pack counts duplicates. Indexed like any finished task (recent:, outbox) but never
# announced on done:<owner>: the SDK has the results already, and an entry nobody pushes
# would show its connections a gap. The SDK got each result from the agent: it counts as
# retrieved (rt): once archived, its record expires result_ttl after that.
DIRECT = _ALLOW_OOM + _BULK + """
local rows = cjson.decode(ARGV[1])
local now, from = ARGV[2], ARGV[4]
local sessions, recent, owners = {}, {}, {}
local ended = {}
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
    local per = recent[owner]
    if not per then per = {}; recent[owner] = per; owners[#owners + 1] = owner end
    per[#per + 1] = r[11]; per[#per + 1] = r[1]
    stored = stored + 1
  end
end
if #ended > 0 then bulk('RPUSH', 'outbox', ended, 1) end
for _, owner in ipairs(owners) do
  bulk('ZADD', 'recent:' .. owner, recent[owner], 2)
  redis.call('ZREMRANGEBYRANK', 'recent:' .. owner, 0, -(tonumber(ARGV[5]) + 1))
  redis.call('EXPIRE', 'recent:' .. owner, 30 * 86400)
  redis.call('SETNX', 'first:' .. owner, recent[owner][1])
end
return {stored, dup, unknown}
"""

_RANK = "{CREATED=0, QUEUED=1, DISPATCHED=2, RUNNING=3}"

# Progress never moves a task backwards; LEASE only extends a live lease. A parked task
# (WAITING, released by its agent) ranks as CREATED, and loads its endpoint once it moves.
PROGRESS = _ALLOW_OOM + _BULK + """
local rank = """ + _RANK + """
local rows = cjson.decode(ARGV[1])
local now = tonumber(ARGV[2])
local from = ARGV[3] or ''
local applied = 0
local leases = {}
for i, u in ipairs(rows) do
  local key = 't:' .. u[1]
  local v = redis.call('HMGET', key, 's', 'e', 'ev', 'pk', 'tg')
  local s = v[1]
  if s == 'WAITING' and v[4] then s = 'CREATED' end
  if s and rank[s] ~= nil and (from == '' or v[2] == from) then
    if u[2] ~= 'LEASE' and rank[u[2]] > rank[s] then
      if v[1] == 'WAITING' then redis.call('HINCRBY', 'load:' .. v[2], v[5] or '_', 1) end
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
# failed ones are announced like FINISH's: one completion-stream entry per owner, returned
# with the reasons (for the results push).
EXPIRE = _ALLOW_OOM + _UNLOAD + _PREV + DROP_PARK + """
local now = ARGV[1]
local unread_ms, ttl = math.floor(tonumber(ARGV[3]) * 1000), tonumber(ARGV[4] or '0')
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
      drop_park(key, ttl, unread_ms)
      redis.call('RPUSH', 'outbox', id)
      if redis.call('HEXISTS', key, 'wd') == 1 then redis.call('RPUSH', 'settled', id) end
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
# A WAITING task was not counted in load:<endpoint>; a dependent's inputs are unpinned and its
# own dependents told (graph_scripts).
CANCEL = _ALLOW_OOM + _UNLOAD + _PREV + PINS + """
local key = 't:' .. ARGV[1]
local s = redis.call('HGET', key, 's')
if not s then return false end
if redis.call('HGET', key, 'o') ~= ARGV[2] then return false end
if s == 'CANCELLED' then return {'OK', redis.call('HGET', key, 'e')} end
if s == 'SUCCEEDED' or s == 'FAILED' or s == 'TIMED_OUT' then return {s, false} end
redis.call('HSET', key, 's', 'CANCELLED', 'why', ARGV[5],
           'ev', (redis.call('HGET', key, 'ev') or '') .. 'CANCELLED@' .. ARGV[3] .. ';')
if s ~= 'WAITING' then unload(key) end
redis.call('ZREM', 'leases', ARGV[1])
redis.call('RPUSH', 'outbox', ARGV[1])
local g = redis.call('HMGET', key, 'wp', 'in', 'wd')
if g[1] then
  redis.call('HDEL', key, 'wp', 'dn', 'pk')
  unpin_all(g[2], tonumber(ARGV[4]), math.floor(tonumber(ARGV[6]) * 1000))
end
if g[3] then redis.call('RPUSH', 'settled', ARGV[1]) end
local id = redis.call('XADD', 'done:' .. ARGV[2], 'MAXLEN', '~', 10000, '*', 'ids', ARGV[1])
redis.call('EXPIRE', 'done:' .. ARGV[2], 86400)
return {'OK', redis.call('HGET', key, 'e'), _prev(ARGV[2], id), id}
"""

# A record leaves Redis by its own expiry, set once it is both archived (h) and read (rt):
# result_ttl after the read, or unretrieved_ttl after archival when nobody read it (ARCHIVED);
# not while a dependent will still read its result (pn: graph_scripts sets it when unpinned).
_EXPIRE_READ = """
local function read_now(key, now, ttl_ms)
  if redis.call('HSETNX', key, 'rt', now) == 1 and redis.call('HEXISTS', key, 'h') == 1
     and redis.call('HEXISTS', key, 'pn') == 0 then
    redis.call('PEXPIRE', key, ttl_ms)
  end
end
"""

# Results handed over by the push count as read.
RETRIEVED = _ALLOW_OOM + _EXPIRE_READ + """
local now = ARGV[1]
local ttl_ms = math.floor(tonumber(ARGV[2]) * 1000)
for i = 3, #ARGV do read_now('t:' .. ARGV[i], now, ttl_ms) end
return #ARGV - 2
"""

# The history fields (ARGV[1], comma-separated) of the task records ARGV[2..]: one command
# for a whole drain batch instead of one HMGET each (false for a record that is gone).
HISTORY_READ = _ALLOW_OOM + """
local fields = {}
for f in string.gmatch(ARGV[1], '[^,]+') do fields[#fields + 1] = f end
local out = {}
for i = 2, #ARGV do out[i - 1] = redis.call('HMGET', 't:' .. ARGV[i], unpack(fields)) end
return out
"""

# Records written to the durable history (lambdas/history.py): marked, counted and given
# their expiry: result_ttl after their read (already past: gone now), else unretrieved_ttl.
ARCHIVED = _ALLOW_OOM + EXPIRE_ARCHIVED + """
local now, ttl, unread = tonumber(ARGV[1]), tonumber(ARGV[2]), math.floor(tonumber(ARGV[3]) * 1000)
local n = 0
for i = 4, #ARGV do
  local key = 't:' .. ARGV[i]
  local v = redis.call('HMGET', key, 'o', 'h', 'pn', 'rt')  -- every record has its owner
  if v[1] and not v[2] then
    redis.call('HSET', key, 'h', 1)
    n = n + 1
    -- while a dependent will still read its result, the expiry comes with the last unpin
    if not v[3] then expire_archived(key, ttl, unread, v[4]) end
  end
end
redis.call('INCRBY', 'stats:archived', n)
return n
"""

# Status read: owner-checked; final tasks are marked retrieved (their expiry: _EXPIRE_READ).
STATUS = _ALLOW_OOM + _EXPIRE_READ + """
local ids = cjson.decode(ARGV[1])
local owner, now, ttl_ms, with_events = ARGV[2], ARGV[3], math.floor(tonumber(ARGV[4]) * 1000), ARGV[5] == '1'
local out = {}
for i, id in ipairs(ids) do
  local key = 't:' .. id
  local v = redis.call('HMGET', key, 'o', 's', 'res', 'err', 'why', 'r', 'ev', 'so', 'se')
  if v[1] ~= owner then
    out[i] = false
  else
    local s = v[2]
    if s == 'SUCCEEDED' or s == 'FAILED' or s == 'TIMED_OUT' or s == 'CANCELLED' then
      if ARGV[6] == '1' then read_now(key, now, ttl_ms) end
    end
    if not with_events then v[7] = false end
    out[i] = {s, v[3] or false, v[4] or false, v[5] or false, v[6] or '0', v[7] or false, v[8] or false, v[9] or false}
  end
end
return out
"""
