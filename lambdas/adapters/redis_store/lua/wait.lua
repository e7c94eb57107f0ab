-- wait: store tasks with inputs, created if absent, in order (an input may be an earlier
-- row). An input that ended otherwise than SUCCEEDED, or is gone (or not the owner's), ends
-- the task at once (announced); otherwise each input is pinned, each unfinished one gets an
-- edge (w:<input>), and the task is WAITING, or QUEUED and put on `release` when all its
-- inputs had SUCCEEDED. A parkable task (a single-user endpoint's) whose unfinished inputs
-- all go to its own endpoint is parked: WAITING, and on `release` to be sent ahead. New
-- work: refused at maxmemory (no allow-oom). Returns {created, released, NoticeRow rows}.
-- KEYS[1]      outbox          the history outbox (tasks ended at once)
-- KEYS[2]      release         dependents to send (released at once, or parked)
-- KEYS[3]      recent:<owner>  the owner's latest tasks (zset task -> created)
-- KEYS[4]      first:<owner>   the time of the owner's first task
-- KEYS[5]      done:<owner>    the owner's completion stream (tasks ended at once)
-- KEYS[6..]    t:<task>        each row's record, in the rows' order
-- ARGV[1]      rows            JSON list of WaitRow
-- ARGV[2]      now             the creation time
-- ARGV[3]      owner
-- ARGV[4]      submission      the submission's id
-- ARGV[5]      recent_max      how many tasks recent:<owner> keeps
-- built: t:<input>  an input's record: the rows name their inputs, any earlier task of the owner's (the pins piece builds the same key from records)
-- built: w:<input>  an unfinished input's dependents, named like its record
-- include: final, pins, reasons, announce, ready
-- row: WaitRow
local rows = cjson.decode(ARGV[1])
local now, owner, sub = ARGV[2], ARGV[3], ARGV[4]
local recent, ended = {}, {}
local created, released = 0, 0
for i, t in ipairs(rows) do
  local id, ep, inputs = t[WaitRow.task_id], t[WaitRow.endpoint_id], t[WaitRow.inputs]
  local key = KEYS[5 + i]
  if redis.call('EXISTS', key) == 0 then
    local states, ends, bad = {}, {}, nil
    for j, input in ipairs(inputs) do
      local v = redis.call('HMGET', 't:' .. input, 's', 'o', 'why', 'err', 'e')
      if not v[1] or v[2] ~= owner then
        bad = {input = input, state = 'EXPIRED', why = 'its record is no longer kept', err = false}
      elseif v[1] ~= 'SUCCEEDED' and FINAL[v[1]] then
        bad = {input = input, state = v[1], why = v[3], err = v[4]}
      end
      if bad then break end
      states[j] = v[1]
      ends[j] = v[5]
    end
    local f = {'o', owner, 'f', t[WaitRow.function_id], 'e', ep, 'sub', sub, 'r', 0, 'mr', t[WaitRow.max_retries],
               'c', now, 'in', table.concat(inputs, ',')}
    local tag = t[WaitRow.tag]
    if tag and tag ~= cjson.null and tag ~= '' then f[#f + 1] = 'tg'; f[#f + 1] = tag end
    if bad then
      local state = bad.state == 'CANCELLED' and 'CANCELLED' or 'FAILED'
      local why = dependency_reason(bad.input, bad.state, bad.why)
      for _, x in ipairs({'s', state, 'why', why, 'ev', 'CREATED@' .. now .. ';WAITING@' .. now .. ';' .. state .. '@' .. now .. ';'}) do
        f[#f + 1] = x
      end
      if bad.err then f[#f + 1] = 'err'; f[#f + 1] = bad.err end
      redis.call('HSET', key, unpack(f))
      redis.call('RPUSH', KEYS[1], id)
      ended[#ended + 1] = {id = id, state = state, why = why, err = bad.err, owner = owner}
    else
      local pending, park = 0, t[WaitRow.parkable] == true and ep ~= ''
      for j, input in ipairs(inputs) do
        pin(input)
        if states[j] ~= 'SUCCEEDED' then
          redis.call('RPUSH', 'w:' .. input, id)
          redis.call('HSET', 't:' .. input, 'wd', 1)
          pending = pending + 1
          if ends[j] ~= ep then park = false end
        end
      end
      for _, x in ipairs({'s', 'WAITING', 'dn', pending, 'wp', t[WaitRow.pack], 'ev', 'CREATED@' .. now .. ';WAITING@' .. now .. ';'}) do
        f[#f + 1] = x
      end
      redis.call('HSET', key, unpack(f))
      if pending == 0 then
        ready(key, id, now, KEYS[2])
        released = released + 1
      elseif park then
        redis.call('HSET', key, 'pk', 1)
        redis.call('RPUSH', KEYS[2], id)
        released = released + 1
      end
    end
    created = created + 1
    recent[#recent + 1] = now; recent[#recent + 1] = id
  end
end
for i = 1, #recent, 4000 do
  redis.call('ZADD', KEYS[3], unpack(recent, i, math.min(i + 3999, #recent)))
end
if #recent > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -(tonumber(ARGV[5]) + 1))
  redis.call('EXPIRE', KEYS[3], 30 * 86400)
  redis.call('SETNX', KEYS[4], now)
end
return {created, released, announce(ended, function() return KEYS[5] end)}
