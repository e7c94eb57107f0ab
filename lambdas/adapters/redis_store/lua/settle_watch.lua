-- settle_watch: an endpoint leaves the dead-letter watch, unless a pack was sent to it (or one
-- of its lanes closed) after the cutoff; returns 1 when it left
-- KEYS[1]      dl-watch                  zset endpoint -> when it was last sent a pack
-- ARGV[1]      endpoint
-- ARGV[2]      cutoff                    time: a later send keeps the endpoint watched
local at = redis.call('ZSCORE', KEYS[1], ARGV[1])
if at and tonumber(at) <= tonumber(ARGV[2]) then return redis.call('ZREM', KEYS[1], ARGV[1]) end
return 0
