#!lua flags=allow-oom
-- unpark: parked dependents their agent (of endpoint `from`: only its own) handed back: no
-- longer parked. One still waiting for an input stays WAITING (settle releases it); one
-- whose inputs are done, or that its agent had started and lost, is QUEUED and put on
-- `release`, to be sent with its inputs' results. Ended ones are left alone. Runs at
-- maxmemory. Returns how many were put on `release`.
-- KEYS[1]      leases          zset task -> lease deadline
-- KEYS[2]      release         released tasks to send
-- KEYS[3..]    t:<task>        each task's record, in ARGV[3..]'s order
-- ARGV[1]      now
-- ARGV[2]      from            the endpoint whose agent hands them back
-- ARGV[3..]    task_ids        the tasks handed back
-- include: ready
local now, from = ARGV[1], ARGV[2]
local n = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local key = KEYS[i]
  local v = redis.call('HMGET', key, 's', 'pk', 'dn', 'ev', 'wp', 'e')
  local parked = v[2] and v[6] == from
  if parked then redis.call('HDEL', key, 'pk') end
  if parked and v[5] then
    if v[1] == 'WAITING' then
      if tonumber(v[3] or '0') <= 0 then
        ready(key, id, now, KEYS[2])
        n = n + 1
      end
    elseif v[1] == 'QUEUED' or v[1] == 'DISPATCHED' or v[1] == 'RUNNING' then
      redis.call('ZREM', KEYS[1], id)
      if v[1] ~= 'QUEUED' then redis.call('HSET', key, 's', 'QUEUED', 'ev', (v[4] or '') .. 'QUEUED@' .. now .. ';') end
      redis.call('RPUSH', KEYS[2], id)
      n = n + 1
    end
  end
end
return n
