-- fill_shares: fill an object's shares from their durable copy, only when its hash is absent
-- (a fill that raced with a revoke cannot bring the revoked grant back); returns 1 when it wrote
-- KEYS[1]    share:<kind>:<id>   principal -> role (hash; the field '-' alone: filled, no shares)
-- ARGV[1..]  principal, role     pairs, at least one
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
