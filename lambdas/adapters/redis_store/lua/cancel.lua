#!lua flags=allow-oom
-- cancel: the owner cancels a task not yet final. Returns a CancelReply: 'OK' with the
-- task's endpoint, and its completion-stream entry (prev, cursor) when cancelled now (a
-- retried cancel: none); the final state when it ended otherwise; false when it is not the
-- owner's. A WAITING task was not counted in load:<endpoint>; a dependent's inputs are
-- unpinned and its own dependents told (graph scripts). Runs at maxmemory.
-- KEYS[1]      t:<task>                  the task record
-- KEYS[2]      leases                    the lease deadlines (zset)
-- KEYS[3]      outbox                    the history outbox (list)
-- KEYS[4]      settled                   tasks whose dependents are to be told (graph scripts)
-- KEYS[5]      done:<owner>              the owner's completion stream
-- ARGV[1]      task                      its id
-- ARGV[2]      owner
-- ARGV[3]      now                       time, '%.6f'
-- ARGV[4]      result_ttl                seconds (its unpinned inputs)
-- ARGV[5]      reason                    why it was cancelled
-- ARGV[6]      unretrieved_ttl           seconds (its unpinned inputs)
-- include: unload, done_entry, pins
-- row: CancelReply
local key = KEYS[1]
local s = redis.call('HGET', key, 's')
if not s then return false end
if redis.call('HGET', key, 'o') ~= ARGV[2] then return false end
if s == 'CANCELLED' then return {[CancelReply.outcome] = 'OK', [CancelReply.endpoint_id] = redis.call('HGET', key, 'e')} end
if s == 'SUCCEEDED' or s == 'FAILED' or s == 'TIMED_OUT' then return {[CancelReply.outcome] = s, [CancelReply.endpoint_id] = false} end
redis.call('HSET', key, 's', 'CANCELLED', 'why', ARGV[5],
           'ev', (redis.call('HGET', key, 'ev') or '') .. 'CANCELLED@' .. ARGV[3] .. ';')
if s ~= 'WAITING' then unload(key) end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('RPUSH', KEYS[3], ARGV[1])
local g = redis.call('HMGET', key, 'wp', 'in', 'wd')
if g[1] then
  redis.call('HDEL', key, 'wp', 'dn', 'pk')
  unpin_all(g[2], tonumber(ARGV[4]), math.floor(tonumber(ARGV[6]) * 1000))
end
if g[3] then redis.call('RPUSH', KEYS[4], ARGV[1]) end
local prev, id = done_entry(KEYS[5], ARGV[1])
return {[CancelReply.outcome] = 'OK', [CancelReply.endpoint_id] = redis.call('HGET', key, 'e'),
        [CancelReply.prev] = prev, [CancelReply.cursor] = id}
