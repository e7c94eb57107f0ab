#!lua flags=allow-oom
-- release_sweep: releases whose sender died (past their deadline in `releasing`) go back on
-- `release`. Runs at maxmemory. Returns how many.
-- KEYS[1]      releasing       zset task -> deadline of the taken ones
-- KEYS[2]      release         released tasks to send
-- ARGV[1]      now
-- ARGV[2]      limit           releases moved in this call
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('RPUSH', KEYS[2], id)
end
return #ids
