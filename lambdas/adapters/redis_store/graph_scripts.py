"""The Lua scripts of task graphs (skyfn.protocol.dataflow): tasks WAITING for their inputs,
the edges between them, their release and the failures and cancels that flow along them.

Keys and fields (besides the package docstring's):
  t:<task>   in  the task's inputs, comma-separated, in placeholder order
             dn  inputs not yet SUCCEEDED (while WAITING)
             wp  what its pack needs once released (JSON, never parsed here), until sent
             wd  1 while it has dependents not yet told of its end
             pn  unreleased dependents that will read its result: while above 0 the record
                 gets no expiry (a read or its archival would otherwise start one)
  w:<task>   list of the dependents waiting for it (one entry per edge)
  settled    list of tasks with dependents that reached a final state: SETTLE tells the
             dependents (release on SUCCEEDED; FAILED / CANCELLED along the edges otherwise)
             pk  1 while the dependent is parked: sent to its endpoint ahead of its inputs,
                 which all run there, for the agent to release (it keeps wp and its pins
                 until it ends, or until the agent hands it back: UNPARK)
  release    list of dependents whose inputs all SUCCEEDED (now QUEUED), to send; and of
             parked dependents (still WAITING), to send ahead
  releasing  zset task -> deadline: taken by a sender; back to `release` if not sent by then

Everything a client adds here has an owner that ends it: a dependent ends with its inputs'
ends, `w:` goes when its task settles, a pin when its dependent is sent or ends.
"""
from __future__ import annotations

# Everything but WAIT (new work) runs at maxmemory too: it ends or sends work already taken
# (scripts._ALLOW_OOM); the flag must be a script's first line.
_ALLOW_OOM = "#!lua flags=allow-oom\n"
_FINAL = "local FINAL = {SUCCEEDED=true, FAILED=true, TIMED_OUT=true, CANCELLED=true}\n"

# An archived record's expiry (scripts.ARCHIVED): result_ttl after its read, which may be
# past (gone now), else unretrieved_ttl. `rt`: the read time when the caller has it.
EXPIRE_ARCHIVED = """
local function expire_archived(key, ttl, unread_ms, rt)
  if rt == nil then rt = redis.call('HGET', key, 'rt') end  -- false: read already, none
  if rt then
    redis.call('PEXPIREAT', key, math.floor((tonumber(rt) + ttl) * 1000))
  else
    redis.call('PEXPIRE', key, unread_ms)
  end
end
"""

# Unpinning the last pin gives an archived record the expiry ARCHIVED / a read would have given it.
PINS = EXPIRE_ARCHIVED + """
local function pin(id)
  local key = 't:' .. id
  redis.call('HINCRBY', key, 'pn', 1)
  redis.call('PERSIST', key)
end
local function unpin(id, ttl, unread_ms)
  local key = 't:' .. id
  if redis.call('EXISTS', key) == 0 then return end
  if redis.call('HINCRBY', key, 'pn', -1) <= 0 then
    redis.call('HDEL', key, 'pn')
    if redis.call('HEXISTS', key, 'h') == 1 then expire_archived(key, ttl, unread_ms) end
  end
end
local function unpin_all(csv, ttl, unread_ms)
  for input in string.gmatch(csv or '', '[^,]+') do unpin(input, ttl, unread_ms) end
end
"""

# A parked dependent that ends (or is sent again in full) drops its park, and with its pack
# its pins (the pack goes with the pins: RELEASE_TAKE may have dropped both already).
DROP_PARK = PINS + """
local function drop_park(key, ttl, unread_ms)
  local g = redis.call('HMGET', key, 'pk', 'wp', 'in')
  if not g[1] then return end
  redis.call('HDEL', key, 'pk')
  if g[2] then
    redis.call('HDEL', key, 'wp', 'dn')
    unpin_all(g[3], ttl, unread_ms)
  end
end
"""

# The reason a dependent gets when its input did not succeed; the input's own reason follows,
# cut short so that a failure passed down a long chain does not grow with it.
_REASONS = """
local function dependency_reason(input, state, why)
  if state == 'CANCELLED' then return 'cancelled: input task ' .. input .. ' was cancelled' end
  local r = 'DependencyFailed: input task ' .. input .. ' ended ' .. state
  if why and why ~= '' then r = r .. ': ' .. string.sub(why, 1, 300) end
  return r
end
"""

# Announced like FINISH's final states: one completion-stream entry per owner.
_ANNOUNCE = """
local function announce(ended)
  local by, owners = {}, {}
  for _, e in ipairs(ended) do
    local o = e[5]
    if not by[o] then by[o] = {}; owners[#owners + 1] = o end
    table.insert(by[o], e)
  end
  local notices = {}
  for _, o in ipairs(owners) do
    local ids = {}
    for _, e in ipairs(by[o]) do ids[#ids + 1] = e[1] end
    local csv = table.concat(ids, ',')
    local id = redis.call('XADD', 'done:' .. o, 'MAXLEN', '~', 10000, '*', 'ids', csv)
    redis.call('EXPIRE', 'done:' .. o, 86400)
    local before = redis.call('XREVRANGE', 'done:' .. o, '(' .. id, '-', 'COUNT', 1)
    local rows = {}
    for _, e in ipairs(by[o]) do rows[#rows + 1] = {e[1], e[2], e[3], e[4]} end
    table.insert(notices, {o, before[1] and before[1][1] or '0-0', id, rows})
  end
  return notices
end
"""

# Queued now: it loads its endpoint (load:<endpoint>) from here on, as CREATE's tasks do.
_READY = """
local function ready(id, now)
  local key = 't:' .. id
  local v = redis.call('HMGET', key, 'e', 'tg', 'ev')
  redis.call('HSET', key, 's', 'QUEUED', 'ev', (v[3] or '') .. 'QUEUED@' .. now .. ';')
  redis.call('HDEL', key, 'dn')
  if v[1] and v[1] ~= '' then redis.call('HINCRBY', 'load:' .. v[1], v[2] or '_', 1) end
  redis.call('RPUSH', 'release', id)
end
"""

# Tasks with inputs: rows [task_id, function_id, endpoint_id, max_retries, tag, [inputs],
# pack JSON, parkable], created if absent, in order (an input may be an earlier row). An
# input that ended otherwise than SUCCEEDED, or is gone, ends the task at once; otherwise
# each input is pinned, each unfinished one gets an edge, and the task is WAITING, or QUEUED
# and put on `release` when all its inputs had SUCCEEDED. A parkable task (a single-user
# endpoint's) whose unfinished inputs all go to its own endpoint is parked: WAITING, and on
# `release` to be sent ahead. Returns {created, released, notices}.
WAIT = _FINAL + PINS + _REASONS + _ANNOUNCE + _READY + """
local rows = cjson.decode(ARGV[1])
local now, owner, sub = ARGV[2], ARGV[3], ARGV[4]
local recent, ended = {}, {}
local created, released = 0, 0
for _, t in ipairs(rows) do
  local key = 't:' .. t[1]
  if redis.call('EXISTS', key) == 0 then
    local states, ends, bad = {}, {}, nil
    for j, input in ipairs(t[6]) do
      local v = redis.call('HMGET', 't:' .. input, 's', 'o', 'why', 'err', 'e')
      if not v[1] or v[2] ~= owner then
        bad = {input, 'EXPIRED', 'its record is no longer kept', false}
      elseif v[1] ~= 'SUCCEEDED' and FINAL[v[1]] then
        bad = {input, v[1], v[3], v[4]}
      end
      if bad then break end
      states[j] = v[1]
      ends[j] = v[5]
    end
    local f = {'o', owner, 'f', t[2], 'e', t[3], 'sub', sub, 'r', 0, 'mr', t[4], 'c', now,
               'in', table.concat(t[6], ',')}
    if t[5] and t[5] ~= cjson.null and t[5] ~= '' then f[#f + 1] = 'tg'; f[#f + 1] = t[5] end
    if bad then
      local state = bad[2] == 'CANCELLED' and 'CANCELLED' or 'FAILED'
      local why = dependency_reason(bad[1], bad[2], bad[3])
      for _, x in ipairs({'s', state, 'why', why, 'ev', 'CREATED@' .. now .. ';WAITING@' .. now .. ';' .. state .. '@' .. now .. ';'}) do
        f[#f + 1] = x
      end
      if bad[4] then f[#f + 1] = 'err'; f[#f + 1] = bad[4] end
      redis.call('HSET', key, unpack(f))
      redis.call('RPUSH', 'outbox', t[1])
      ended[#ended + 1] = {t[1], state, why, bad[4], owner}
    else
      local pending, park = 0, t[8] == true and t[3] ~= ''
      for j, input in ipairs(t[6]) do
        pin(input)
        if states[j] ~= 'SUCCEEDED' then
          redis.call('RPUSH', 'w:' .. input, t[1])
          redis.call('HSET', 't:' .. input, 'wd', 1)
          pending = pending + 1
          if ends[j] ~= t[3] then park = false end
        end
      end
      for _, x in ipairs({'s', 'WAITING', 'dn', pending, 'wp', t[7], 'ev', 'CREATED@' .. now .. ';WAITING@' .. now .. ';'}) do
        f[#f + 1] = x
      end
      redis.call('HSET', key, unpack(f))
      if pending == 0 then
        ready(t[1], now)
        released = released + 1
      elseif park then
        redis.call('HSET', key, 'pk', 1)
        redis.call('RPUSH', 'release', t[1])
        released = released + 1
      end
    end
    created = created + 1
    recent[#recent + 1] = now; recent[#recent + 1] = t[1]
  end
end
for i = 1, #recent, 4000 do
  redis.call('ZADD', 'recent:' .. owner, unpack(recent, i, math.min(i + 3999, #recent)))
end
if #recent > 0 then
  redis.call('ZREMRANGEBYRANK', 'recent:' .. owner, 0, -(tonumber(ARGV[5]) + 1))
  redis.call('EXPIRE', 'recent:' .. owner, 30 * 86400)
  redis.call('SETNX', 'first:' .. owner, now)
end
return {created, released, announce(ended)}
"""

# Tells the dependents of up to ARGV[2] settled tasks: SUCCEEDED counts an input off (QUEUED
# and on `release` at the last, unless parked: its agent releases it); any other end (or a
# record gone) ends the WAITING ones too, which settle in turn when they have dependents of
# their own. Returns {settled, released, notices, left on `settled`}.
SETTLE = _ALLOW_OOM + _FINAL + DROP_PARK + _REASONS + _ANNOUNCE + _READY + """
local now, limit = ARGV[1], tonumber(ARGV[2])
local ttl, unread_ms = tonumber(ARGV[3]), math.floor(tonumber(ARGV[4]) * 1000)
local ids = redis.call('LPOP', 'settled', limit)
if not ids then return {0, 0, {}, 0} end
local released, ended = 0, {}
for _, id in ipairs(ids) do
  local key = 't:' .. id
  local v = redis.call('HMGET', key, 's', 'err', 'why')
  local deps = redis.call('LRANGE', 'w:' .. id, 0, -1)
  redis.call('DEL', 'w:' .. id)
  if v[1] then redis.call('HDEL', key, 'wd') end
  for _, d in ipairs(deps) do
    local dk = 't:' .. d
    local dv = redis.call('HMGET', dk, 's', 'o', 'ev', 'in', 'wd', 'pk')
    if dv[1] == 'WAITING' then
      if v[1] == 'SUCCEEDED' then
        if redis.call('HINCRBY', dk, 'dn', -1) <= 0 and not dv[6] then
          ready(d, now)
          released = released + 1
        end
      else
        local from = (v[1] and FINAL[v[1]]) and v[1] or 'EXPIRED'
        local state = from == 'CANCELLED' and 'CANCELLED' or 'FAILED'
        local why = dependency_reason(id, from, v[3] or (v[1] and '' or 'its record is no longer kept'))
        local f = {'s', state, 'why', why, 'ev', (dv[3] or '') .. state .. '@' .. now .. ';'}
        if v[2] then f[#f + 1] = 'err'; f[#f + 1] = v[2] end
        redis.call('HSET', dk, unpack(f))
        redis.call('HDEL', dk, 'wp', 'dn', 'pk')
        unpin_all(dv[4], ttl, unread_ms)
        redis.call('RPUSH', 'outbox', d)
        if dv[5] then redis.call('RPUSH', 'settled', d) end
        ended[#ended + 1] = {d, state, why, v[2] or false, dv[2]}
      end
    end
  end
end
return {#ids, released, announce(ended), redis.call('LLEN', 'settled')}
"""

# Takes up to ARGV[2] released tasks to send, each held in `releasing` for ARGV[3] s: for each
# {task_id, owner, endpoint, pack JSON, inputs csv, {input results (false: gone; for a parked
# task, not SUCCEEDED yet)}, parked}. One that moved on meanwhile (cancelled; or sent, and its
# sender died before saying so) is let go.
RELEASE_TAKE = _ALLOW_OOM + PINS + """
local now, limit, hold = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl, unread_ms = tonumber(ARGV[4]), math.floor(tonumber(ARGV[5]) * 1000)
local ids = redis.call('LPOP', 'release', limit)
if not ids then return {} end
local out = {}
for _, id in ipairs(ids) do
  local v = redis.call('HMGET', 't:' .. id, 's', 'o', 'e', 'wp', 'in', 'pk')
  local parked = v[1] == 'WAITING' and v[6]
  if (v[1] == 'QUEUED' or parked) and v[4] then
    redis.call('ZADD', 'releasing', now + hold, id)
    local results = {}
    for input in string.gmatch(v[5] or '', '[^,]+') do
      local r = redis.call('HMGET', 't:' .. input, 's', 'res')
      results[#results + 1] = ((not parked or r[1] == 'SUCCEEDED') and r[2]) or false
    end
    out[#out + 1] = {id, v[2], v[3], v[4], v[5], results, parked and 1 or 0}
  elseif v[4] and not v[6] then
    redis.call('HDEL', 't:' .. id, 'wp')
    unpin_all(v[5], ttl, unread_ms)
  end
end
return out
"""

# Sent: the pack is dropped and the inputs unpinned (once: a second call finds no pack); a
# parked task keeps both until it ends or comes back (UNPARK).
RELEASED = _ALLOW_OOM + PINS + """
local ttl, unread_ms = tonumber(ARGV[1]), math.floor(tonumber(ARGV[2]) * 1000)
local n = 0
for i = 3, #ARGV do
  local key = 't:' .. ARGV[i]
  redis.call('ZREM', 'releasing', ARGV[i])
  local v = redis.call('HMGET', key, 'wp', 'in', 'pk')
  if v[3] then
    n = n + 1
  elseif v[1] then
    redis.call('HDEL', key, 'wp')
    unpin_all(v[2], ttl, unread_ms)
    n = n + 1
  end
end
return n
"""

# Releases whose sender died (past their deadline in `releasing`) go back on `release`.
RELEASE_SWEEP = _ALLOW_OOM + """
local ids = redis.call('ZRANGEBYSCORE', 'releasing', '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  redis.call('ZREM', 'releasing', id)
  redis.call('RPUSH', 'release', id)
end
return #ids
"""

# Parked dependents their agent (of endpoint ARGV[2]: only its own) handed back (ARGV[3..]):
# no longer parked. One still waiting
# for an input stays WAITING (SETTLE releases it); one whose inputs are done, or that its
# agent had started and lost, is QUEUED and put on `release`, to be sent with its inputs'
# results. Ended ones are left alone. Returns how many were put on `release`.
UNPARK = _ALLOW_OOM + _READY + """
local now, from = ARGV[1], ARGV[2]
local n = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local key = 't:' .. id
  local v = redis.call('HMGET', key, 's', 'pk', 'dn', 'ev', 'wp', 'e')
  local parked = v[2] and v[6] == from
  if parked then redis.call('HDEL', key, 'pk') end
  if parked and v[5] then
    if v[1] == 'WAITING' then
      if tonumber(v[3] or '0') <= 0 then
        ready(id, now)
        n = n + 1
      end
    elseif v[1] == 'QUEUED' or v[1] == 'DISPATCHED' or v[1] == 'RUNNING' then
      redis.call('ZREM', 'leases', id)
      if v[1] ~= 'QUEUED' then redis.call('HSET', key, 's', 'QUEUED', 'ev', (v[4] or '') .. 'QUEUED@' .. now .. ';') end
      redis.call('RPUSH', 'release', id)
      n = n + 1
    end
  end
end
return n
"""
