#!lua flags=allow-oom
-- released: the tasks were sent: each one's pack is dropped and its inputs unpinned (once: a
-- second call finds no pack); a parked task keeps both until it ends or comes back (unpark).
-- Runs at maxmemory. Returns how many were sent or parked.
-- KEYS[1]      releasing       zset task -> deadline of the taken ones
-- KEYS[2..]    t:<task>        each task's record, in ARGV[3..]'s order
-- ARGV[1]      result_ttl      seconds a read result is kept (an unpinned archived input)
-- ARGV[2]      unretrieved_ttl seconds an unread archived result is kept
-- ARGV[3..]    task_ids        the tasks sent
-- include: pins
local ttl, unread_ms = tonumber(ARGV[1]), math.floor(tonumber(ARGV[2]) * 1000)
local n = 0
for i = 3, #ARGV do
  local key = KEYS[i - 1]
  redis.call('ZREM', KEYS[1], ARGV[i])
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
