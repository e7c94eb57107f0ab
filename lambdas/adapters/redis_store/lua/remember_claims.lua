-- remember_claims: keep a user's identity claims, rewriting the hash only when a claim
-- differs (an absent claim counts as ''); returns 1 when they changed
-- KEYS[1]  claims:<user>       the user's latest claims (hash: username, email, identity_provider)
-- ARGV[1]  username            '' when the token has none
-- ARGV[2]  email               '' when the token has none
-- ARGV[3]  identity_provider   '' when the token has none
local names = {'username', 'email', 'identity_provider'}
local new = {ARGV[1], ARGV[2], ARGV[3]}
local cur = redis.call('HMGET', KEYS[1], unpack(names))
local same = true
for i = 1, 3 do
  if (cur[i] or '') ~= new[i] then same = false end
end
if same then return 0 end
redis.call('DEL', KEYS[1])
for i = 1, 3 do
  if new[i] ~= '' then redis.call('HSET', KEYS[1], names[i], new[i]) end
end
return 1
