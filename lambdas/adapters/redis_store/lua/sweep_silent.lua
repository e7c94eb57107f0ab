-- sweep_silent: endpoints whose last heartbeat is older than the cutoff go offline (st in
-- ep:<endpoint>, where it still says online with that old a heartbeat) and leave ep-beats;
-- returns the ids marked offline. One range read of the index plus the endpoints it takes:
-- an endpoint that heartbeats is never read here, so the sweep's cost is not the fleet's.
-- KEYS[1]      ep-beats                  zset endpoint -> its last heartbeat (endpoints online)
-- ARGV[1]      cutoff                    time: a heartbeat before it is silent
-- ARGV[2]      limit                     at most this many endpoints a call
-- built: ep:<endpoint>  the endpoints are read from KEYS[1]
local cutoff = tonumber(ARGV[1])
local silent = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, ep in ipairs(silent) do
  local key = 'ep:' .. ep
  local v = redis.call('HMGET', key, 'hb', 'st')
  local hb = tonumber(v[1])
  if v[2] == 'online' and hb and hb < cutoff then
    redis.call('HSET', key, 'st', 'offline')
    out[#out + 1] = ep
    redis.call('ZREM', KEYS[1], ep)
  elseif v[2] == 'online' and hb then
    redis.call('ZADD', KEYS[1], hb, ep)  -- the record's heartbeat is newer: kept, at that time
  else
    redis.call('ZREM', KEYS[1], ep)
  end
end
return out
