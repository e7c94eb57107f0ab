#!lua flags=allow-oom
-- release_take: takes up to `limit` released tasks to send, each held in `releasing` for
-- `hold` seconds: a ReleasedRow for each (its inputs' results: false for one gone, and for a
-- parked task one not SUCCEEDED yet). One that moved on meanwhile (cancelled; or sent, and
-- its sender died before saying so) is let go: its pack dropped and its inputs unpinned,
-- unless parked. Runs at maxmemory: it sends work already taken.
-- KEYS[1]      release         released tasks to send
-- KEYS[2]      releasing       zset task -> deadline of the taken ones
-- ARGV[1]      now
-- ARGV[2]      limit           tasks taken in this call
-- ARGV[3]      hold            seconds a taken task waits to be marked sent (released.lua)
-- ARGV[4]      result_ttl      seconds a read result is kept (an unpinned archived input)
-- ARGV[5]      unretrieved_ttl seconds an unread archived result is kept
-- built: t:<task>  a released task's record and its inputs': the ids are popped from `release` and read from the record (in)
-- include: pins
-- row: ReleasedRow
local now, limit, hold = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl, unread_ms = tonumber(ARGV[4]), math.floor(tonumber(ARGV[5]) * 1000)
local ids = redis.call('LPOP', KEYS[1], limit)
if not ids then return {} end
local out = {}
for _, id in ipairs(ids) do
  local v = redis.call('HMGET', 't:' .. id, 's', 'o', 'e', 'wp', 'in', 'pk')
  local parked = v[1] == 'WAITING' and v[6]
  if (v[1] == 'QUEUED' or parked) and v[4] then
    redis.call('ZADD', KEYS[2], now + hold, id)
    local results = {}
    for input in string.gmatch(v[5] or '', '[^,]+') do
      local r = redis.call('HMGET', 't:' .. input, 's', 'res')
      results[#results + 1] = ((not parked or r[1] == 'SUCCEEDED') and r[2]) or false
    end
    out[#out + 1] = {[ReleasedRow.task_id] = id, [ReleasedRow.owner] = v[2], [ReleasedRow.endpoint_id] = v[3],
                     [ReleasedRow.pack] = v[4], [ReleasedRow.inputs] = v[5], [ReleasedRow.results] = results,
                     [ReleasedRow.parked] = parked and 1 or 0}
  elseif v[4] and not v[6] then
    redis.call('HDEL', 't:' .. id, 'wp')
    unpin_all(v[5], ttl, unread_ms)
  end
end
return out
