-- expire_read: a final record read now (rt). A record leaves Redis by its own expiry, set
-- once it is both archived (h) and read: result_ttl after the read (archived.lua sets
-- unretrieved_ttl when nobody read it); not while a dependent will still read its result
-- (pn: the graph scripts set it when unpinned).
local function read_now(key, now, ttl_ms)
  if redis.call('HSETNX', key, 'rt', now) == 1 and redis.call('HEXISTS', key, 'h') == 1
     and redis.call('HEXISTS', key, 'pn') == 0 then
    redis.call('PEXPIRE', key, ttl_ms)
  end
end
