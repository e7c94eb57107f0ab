-- settle_batch: move a batch's finished tasks out of its pending set and count their final
-- states, atomically (two concurrent checks never count a task twice); a task whose record
-- is gone from the hot store (retrieved and purged) counts as PURGED. Returns how many settled.
-- KEYS[1]    batch:<batch>:pending   set of routed task ids not yet seen final
-- KEYS[2]    batch:<batch>:counts    hash: final state -> tasks
-- KEYS[3..]  t:<task>                the record of each task of ARGV, in its order
-- ARGV[1..]  task ids                the pending tasks to look at
local pending, counts = KEYS[1], KEYS[2]
local settled = 0
for i, id in ipairs(ARGV) do
  local s = redis.call('HGET', KEYS[i + 2], 's')
  local final = nil
  if not s then final = 'PURGED'
  elseif s == 'SUCCEEDED' or s == 'FAILED' or s == 'TIMED_OUT' or s == 'CANCELLED' then final = s end
  if final and redis.call('SREM', pending, id) == 1 then
    redis.call('HINCRBY', counts, final, 1)
    settled = settled + 1
  end
end
return settled
