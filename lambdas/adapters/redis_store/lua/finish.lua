#!lua flags=allow-oom
-- finish: final states, each written once (duplicates, from redelivered packs, are counted
-- and ignored). With a sender (ARGV[4], the endpoint lambdas/results.py authenticated), only
-- tasks routed to it are finished, stamped `by` it; the others count as unknown. '' only from
-- the service itself (failing tasks it could not send). One HMGET and one HSET per task; the
-- leases, outbox and load updates once per batch; one completion-stream entry per owner.
-- Runs at maxmemory (allow-oom): tasks taken must still end, which is what frees memory.
-- KEYS[1]      leases                    the lease deadlines (zset)
-- KEYS[2]      outbox                    the history outbox (list)
-- KEYS[3]      settled                   tasks whose dependents are to be told (graph scripts)
-- KEYS[4..]    t:<task>                  a task record per row, in the rows' order; then load:<sender> when ARGV[4] names one
-- ARGV[1]      rows                      JSON list of FinishRow
-- ARGV[2]      now                       time, '%.6f'
-- ARGV[3]      unretrieved_ttl           seconds (a parked dependent's unpinned inputs)
-- ARGV[4]      sender                    the endpoint that sent the results, '' for the service
-- ARGV[5]      memo_ttl                  seconds a memoized result is cached
-- ARGV[6]      result_ttl                seconds (a parked dependent's unpinned inputs)
-- built: load:<endpoint>  without a sender (ARGV[4] ''), each record's endpoint, read from the record
-- built: done:<owner>     the owner is read from each record
-- built: memo:<owner>:<key>  the owner and the memo key are read from the record
-- include: bulk, owner_entries, drop_park
-- row: FinishRow, DoneNotice
local rows = cjson.decode(ARGV[1])
local now = ARGV[2]
local unread_ms = math.floor(tonumber(ARGV[3]) * 1000)
local from = ARGV[4]
local ttl = tonumber(ARGV[6])
local sender_load = KEYS[4 + #rows]
local done, owners = {}, {}
local ended, unload = {}, {}
local stored, dup, unknown = 0, 0, 0
for i, r in ipairs(rows) do
  local key = KEYS[3 + i]
  local tid, state, result = r[FinishRow.task_id], r[FinishRow.state], r[FinishRow.result]
  local v = redis.call('HMGET', key, 's', 'e', 'ev', 'o', 'tg', 'mk', 'wd', 'pk')
  local s = v[1]
  if not s or (s == 'WAITING' and not v[8]) or (from ~= '' and v[2] ~= from) then
    unknown = unknown + 1  -- or routed to another endpoint than the sender's: not its to answer
  elseif s == 'SUCCEEDED' or s == 'FAILED' or s == 'TIMED_OUT' or s == 'CANCELLED' then
    dup = dup + 1
  else
    local f = {'s', state, 'ev', (v[3] or '') .. r[FinishRow.events] .. state .. '@' .. now .. ';STORED@' .. now .. ';'}
    if from ~= '' then f[#f + 1] = 'by'; f[#f + 1] = from end  -- who produced it (the SDK checks)
    if result ~= cjson.null then f[#f + 1] = 'res'; f[#f + 1] = result end
    if r[FinishRow.error] ~= cjson.null then f[#f + 1] = 'err'; f[#f + 1] = r[FinishRow.error] end
    if r[FinishRow.reason] ~= cjson.null then f[#f + 1] = 'why'; f[#f + 1] = r[FinishRow.reason] end
    local so, se = r[FinishRow.stdout], r[FinishRow.stderr]
    if so and so ~= cjson.null then f[#f + 1] = 'so'; f[#f + 1] = so end
    if se and se ~= cjson.null then f[#f + 1] = 'se'; f[#f + 1] = se end
    redis.call('HSET', key, unpack(f))
    if v[8] then drop_park(key, ttl, unread_ms) end  -- released by its agent
    if v[2] and v[2] ~= '' and s ~= 'WAITING' then  -- a parked task loads its endpoint once it runs
      local per = unload[v[2]]
      if not per then per = {}; unload[v[2]] = per end
      local field = v[5] or '_'
      per[field] = (per[field] or 0) + 1
    end
    ended[#ended + 1] = tid
    if v[7] then redis.call('RPUSH', KEYS[3], tid) end  -- its dependents are told (graph scripts)
    local owner = v[4]
    if state == 'SUCCEEDED' and result ~= cjson.null and v[6] then
      redis.call('SET', 'memo:' .. owner .. ':' .. v[6], result, 'EX', ARGV[5])
    end
    if not done[owner] then done[owner] = {}; owners[#owners + 1] = owner end
    table.insert(done[owner], tid)
    stored = stored + 1
  end
end
for ep, per in pairs(unload) do
  local lk = sender_load or ('load:' .. ep)  -- with a sender, only its own tasks end here
  for field, n in pairs(per) do
    if redis.call('HINCRBY', lk, field, -n) <= 0 then redis.call('HDEL', lk, field) end
  end
end
if #ended > 0 then
  bulk('ZREM', KEYS[1], ended, 1)
  bulk('RPUSH', KEYS[2], ended, 1)
end
local notices = owner_entries(owners, done, function(owner) return 'done:' .. owner end,
  function(owner, prev, cursor, csv)
    return {[DoneNotice.owner] = owner, [DoneNotice.prev] = prev, [DoneNotice.cursor] = cursor, [DoneNotice.ids] = csv}
  end)
return {stored, dup, unknown, notices}
