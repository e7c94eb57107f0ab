#!lua flags=allow-oom
-- expire: expired leases: back to QUEUED with one more retry, or FAILED past the retry
-- budget. The failed ones are announced like finish's: one completion-stream entry per
-- owner, returned with the reasons (for the results push). Runs at maxmemory.
-- Returns {requeued, failed, ExpiredNotice rows}.
-- KEYS[1]      leases                    the lease deadlines (zset)
-- KEYS[2]      outbox                    the history outbox (list)
-- KEYS[3]      settled                   tasks whose dependents are to be told (graph scripts)
-- ARGV[1]      now                       time, '%.6f'
-- ARGV[2]      limit                     leases taken per call
-- ARGV[3]      unretrieved_ttl           seconds (a parked dependent's unpinned inputs)
-- ARGV[4]      result_ttl                seconds (a parked dependent's unpinned inputs)
-- built: t:<task>         the tasks are those whose leases expired, read from leases
-- built: done:<owner>     the owner is read from each record
-- include: unload, owner_entries, drop_park
-- row: ExpiredNotice
local now = ARGV[1]
local unread_ms, ttl = math.floor(tonumber(ARGV[3]) * 1000), tonumber(ARGV[4])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local requeued, failed = 0, 0
local done, why, owners = {}, {}, {}
for i, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local key = 't:' .. id
  local s = redis.call('HGET', key, 's')
  if s == 'DISPATCHED' or s == 'RUNNING' then
    local r = redis.call('HINCRBY', key, 'r', 1)
    local mr = tonumber(redis.call('HGET', key, 'mr') or '0')
    if r > mr then
      local reason = 'lease expired ' .. r .. ' times (the endpoint agent running it was lost); retry budget max_retries=' .. mr .. ' exhausted'
      redis.call('HSET', key, 's', 'FAILED', 'why', reason,
                 'ev', (redis.call('HGET', key, 'ev') or '') .. 'FAILED@' .. now .. ';')
      unload(key)
      drop_park(key, ttl, unread_ms)
      redis.call('RPUSH', KEYS[2], id)
      if redis.call('HEXISTS', key, 'wd') == 1 then redis.call('RPUSH', KEYS[3], id) end
      local owner = redis.call('HGET', key, 'o')
      if not done[owner] then done[owner], why[owner] = {}, {}; table.insert(owners, owner) end
      table.insert(done[owner], id)
      table.insert(why[owner], reason)
      failed = failed + 1
    else
      redis.call('HSET', key, 's', 'QUEUED', 'ev', (redis.call('HGET', key, 'ev') or '') .. 'QUEUED@' .. now .. ';')
      requeued = requeued + 1
    end
  end
end
local notices = owner_entries(owners, done, function(owner) return 'done:' .. owner end,
  function(owner, prev, cursor, csv)
    return {[ExpiredNotice.owner] = owner, [ExpiredNotice.prev] = prev, [ExpiredNotice.cursor] = cursor,
            [ExpiredNotice.ids] = csv, [ExpiredNotice.reasons] = why[owner]}
  end)
return {requeued, failed, notices}
