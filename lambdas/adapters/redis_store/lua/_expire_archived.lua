-- expire_archived: an archived record's expiry (archived.lua): result_ttl after its read,
-- which may be past (gone now), else unretrieved_ttl. `rt`: the read time when the caller
-- has it (nil: read it here; false: never read).
local function expire_archived(key, ttl, unread_ms, rt)
  if rt == nil then rt = redis.call('HGET', key, 'rt') end
  if rt then
    redis.call('PEXPIREAT', key, math.floor((tonumber(rt) + ttl) * 1000))
  else
    redis.call('PEXPIRE', key, unread_ms)
  end
end
