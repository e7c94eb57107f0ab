#!lua flags=allow-oom
-- archived: records written to the durable history (lambdas/history.py): marked (h),
-- counted, and given their expiry: result_ttl after their read (already past: gone now),
-- else unretrieved_ttl; while a dependent will still read a result (pn), the expiry comes
-- with its last unpin. Runs at maxmemory: archiving is what frees memory.
-- KEYS[1]      stats:archived            records archived since the store began
-- KEYS[2..]    t:<task>                  the task records written
-- ARGV[1]      result_ttl                seconds
-- ARGV[2]      unretrieved_ttl           seconds
-- include: expire_archived
local ttl, unread = tonumber(ARGV[1]), math.floor(tonumber(ARGV[2]) * 1000)
local n = 0
for i = 2, #KEYS do
  local key = KEYS[i]
  local v = redis.call('HMGET', key, 'o', 'h', 'pn', 'rt')  -- every record has its owner
  if v[1] and not v[2] then
    redis.call('HSET', key, 'h', 1)
    n = n + 1
    if not v[3] then expire_archived(key, ttl, unread, v[4]) end
  end
end
redis.call('INCRBY', KEYS[1], n)
return n
