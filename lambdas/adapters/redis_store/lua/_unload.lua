-- unload: a task leaving for a final state no longer loads its endpoint (load:<endpoint>,
-- one count per function tag, '_' untagged).
-- built: load:<endpoint>  the endpoint is read from the task's record
local function unload(key)
  local v = redis.call('HMGET', key, 'e', 'tg')
  if v[1] and v[1] ~= '' then
    local field = v[2] or '_'
    if redis.call('HINCRBY', 'load:' .. v[1], field, -1) <= 0 then redis.call('HDEL', 'load:' .. v[1], field) end
  end
end
