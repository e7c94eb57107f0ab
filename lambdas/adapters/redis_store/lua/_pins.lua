-- pins: a dependent pins its inputs' records (pn: no expiry while a dependent will still
-- read the result); unpinning the last pin gives an archived record the expiry a read or
-- its archival would have given it.
-- built: t:<task>  an input of a dependent: its id comes from the dependent's record (in) or row
-- include: expire_archived
local function pin(id)
  local key = 't:' .. id
  redis.call('HINCRBY', key, 'pn', 1)
  redis.call('PERSIST', key)
end
local function unpin(id, ttl, unread_ms)
  local key = 't:' .. id
  if redis.call('EXISTS', key) == 0 then return end
  if redis.call('HINCRBY', key, 'pn', -1) <= 0 then
    redis.call('HDEL', key, 'pn')
    if redis.call('HEXISTS', key, 'h') == 1 then expire_archived(key, ttl, unread_ms) end
  end
end
local function unpin_all(csv, ttl, unread_ms)
  for input in string.gmatch(csv or '', '[^,]+') do unpin(input, ttl, unread_ms) end
end
