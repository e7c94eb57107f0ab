#!lua flags=allow-oom
-- settle: tells the dependents of up to `limit` settled tasks: SUCCEEDED counts an input off
-- (QUEUED and on `release` at the last, unless parked: its agent releases it); any other
-- end (or a record gone) ends the WAITING ones too, which settle in turn when they have
-- dependents of their own. Runs at maxmemory: it ends or sends work already taken.
-- Returns {settled, released, NoticeRow rows, left on `settled`}.
-- KEYS[1]      settled         tasks whose dependents are to be told
-- KEYS[2]      outbox          the history outbox (dependents ended here)
-- KEYS[3]      release         dependents to send
-- ARGV[1]      now
-- ARGV[2]      limit           settled tasks taken in this call
-- ARGV[3]      result_ttl      seconds a read result is kept (an unpinned archived input)
-- ARGV[4]      unretrieved_ttl seconds an unread archived result is kept
-- built: t:<task>  a settled task's and its dependents' records: the ids are popped from `settled` and read from w:<task>
-- built: w:<task>  a settled task's dependents: its id is popped from `settled`
-- built: done:<owner>  a dependent's owner is read from its record
-- include: final, pins, reasons, announce, ready
local now, limit = ARGV[1], tonumber(ARGV[2])
local ttl, unread_ms = tonumber(ARGV[3]), math.floor(tonumber(ARGV[4]) * 1000)
local ids = redis.call('LPOP', KEYS[1], limit)
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
          ready(dk, d, now, KEYS[3])
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
        redis.call('RPUSH', KEYS[2], d)
        if dv[5] then redis.call('RPUSH', KEYS[1], d) end
        ended[#ended + 1] = {id = d, state = state, why = why, err = v[2] or false, owner = dv[2]}
      end
    end
  end
end
return {#ids, released, announce(ended, function(owner) return 'done:' .. owner end), redis.call('LLEN', KEYS[1])}
