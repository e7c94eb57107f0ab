-- drop_park: a parked dependent that ends (or is sent again in full) drops its park, and
-- with its pack its pins (the pack goes with the pins: release_take may have dropped both).
-- include: pins
local function drop_park(key, ttl, unread_ms)
  local g = redis.call('HMGET', key, 'pk', 'wp', 'in')
  if not g[1] then return end
  redis.call('HDEL', key, 'pk')
  if g[2] then
    redis.call('HDEL', key, 'wp', 'dn')
    unpin_all(g[3], ttl, unread_ms)
  end
end
