#!lua flags=allow-oom
-- history_read: the history fields of many task records in one command (a drain batch),
-- false for a record that is gone. Runs at maxmemory.
-- KEYS[1..]    t:<task>                  the task records, in the answer's order
-- ARGV[1..]    fields                    the record's fields to read
local out = {}
for i, key in ipairs(KEYS) do out[i] = redis.call('HMGET', key, unpack(ARGV)) end
return out
