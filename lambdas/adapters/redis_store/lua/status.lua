#!lua flags=allow-oom
-- status: the owner's tasks' states (false for a task that is not the owner's, or gone);
-- final ones are marked read (expire_read: their record's expiry). Runs at maxmemory.
-- KEYS[1..]    t:<task>                  the task records asked for, in the answer's order
-- ARGV[1]      owner
-- ARGV[2]      now                       time, '%.6f'
-- ARGV[3]      result_ttl                seconds a read record stays once archived
-- ARGV[4]      with_events               '1': the events too
-- ARGV[5]      mark_read                 '1': final tasks count as retrieved
-- include: expire_read
-- row: StatusReply
local owner, now, ttl_ms, with_events = ARGV[1], ARGV[2], math.floor(tonumber(ARGV[3]) * 1000), ARGV[4] == '1'
local out = {}
for i, key in ipairs(KEYS) do
  local v = redis.call('HMGET', key, 'o', 's', 'res', 'err', 'why', 'r', 'ev', 'so', 'se', 'e', 'by')
  if v[1] ~= owner then
    out[i] = false
  else
    local s = v[2]
    if s == 'SUCCEEDED' or s == 'FAILED' or s == 'TIMED_OUT' or s == 'CANCELLED' then
      if ARGV[5] == '1' then read_now(key, now, ttl_ms) end
    end
    out[i] = {[StatusReply.state] = s, [StatusReply.result] = v[3] or false, [StatusReply.error] = v[4] or false,
              [StatusReply.reason] = v[5] or false, [StatusReply.retries] = v[6] or '0',
              [StatusReply.events] = with_events and v[7] or false, [StatusReply.stdout] = v[8] or false,
              [StatusReply.stderr] = v[9] or false, [StatusReply.endpoint_id] = v[10] or false,
              [StatusReply.result_by] = v[11] or false}
  end
end
return out
