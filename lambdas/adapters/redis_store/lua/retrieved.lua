#!lua flags=allow-oom
-- retrieved: results handed over by the push count as read (expire_read). Runs at maxmemory.
-- KEYS[1..]    t:<task>                  the task records handed over
-- ARGV[1]      now                       time, '%.6f'
-- ARGV[2]      result_ttl                seconds a read record stays once archived
-- include: expire_read
local now = ARGV[1]
local ttl_ms = math.floor(tonumber(ARGV[2]) * 1000)
for _, key in ipairs(KEYS) do read_now(key, now, ttl_ms) end
return #KEYS
