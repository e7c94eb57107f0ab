-- take_token: take one token from a caller's bucket, refilled at `rate` per second up to
-- `burst` on the Redis server's clock (every API process shares the limit); returns
-- {1 taken or 0 empty, the tokens left}
-- KEYS[1]  rl:<principal>   the caller's bucket (hash: tokens, ts), expires once it would be full
-- ARGV[1]  rate             tokens per second
-- ARGV[2]  burst            the bucket's size
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local v = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(v[1]) or burst
local ts = tonumber(v[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local ok = 0
if tokens >= 1 then
  tokens = tokens - 1
  ok = 1
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 60)
return {ok, tostring(tokens)}
