-- forget_lane: a closed lane whose task queue and dead letters are empty leaves the set the
-- reaper watches (atomic: a lane opened again meanwhile stays); returns 1 when it left
-- KEYS[1]  lanes:<ep>:queues    lanes whose queues the reaper watches (set)
-- KEYS[2]  lane:<ep>:<lane>     the lane's record (present while it is open)
-- KEYS[3]  <lane queue>         the lane's task stream (Settings.lane_queue_name)
-- KEYS[4]  <lane queue>:dlq     its dead letters (stream)
-- ARGV[1]  lane                 the lane's name
if redis.call('EXISTS', KEYS[2]) == 0 and redis.call('XLEN', KEYS[3]) == 0 and redis.call('XLEN', KEYS[4]) == 0 then
  return redis.call('SREM', KEYS[1], ARGV[1])
end
return 0
