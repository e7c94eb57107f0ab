-- ready: a dependent whose inputs all SUCCEEDED is QUEUED now: it loads its endpoint
-- (load:<endpoint>) from here on, as create's tasks do, and goes on `release` to be sent.
-- `key`: its record t:<id>; `release_key`: the list `release`.
-- built: load:<endpoint>  the endpoint is read from the dependent's record
local function ready(key, id, now, release_key)
  local v = redis.call('HMGET', key, 'e', 'tg', 'ev')
  redis.call('HSET', key, 's', 'QUEUED', 'ev', (v[3] or '') .. 'QUEUED@' .. now .. ';')
  redis.call('HDEL', key, 'dn')
  if v[1] and v[1] ~= '' then redis.call('HINCRBY', 'load:' .. v[1], v[2] or '_', 1) end
  redis.call('RPUSH', release_key, id)
end
