-- close_lane: unbind everything bound to a lane of an endpoint, then drop the lane's record and
-- its identities; returns {the record existed (1 or 0, from DEL), bindings removed}
-- KEYS[1]  lanes:<ep>          the endpoint's bindings (hash: "<identity> <config key>" -> lane)
-- KEYS[2]  lane:<ep>:<lane>    the lane's record (hash: mac_key, password, created)
-- KEYS[3]  lane:<ep>:<lane>:ids  identities bound to the lane (set)
-- ARGV[1]  lane                the lane's name
local removed = 0
local bindings = redis.call('HGETALL', KEYS[1])
for i = 1, #bindings, 2 do
  if bindings[i + 1] == ARGV[1] then
    redis.call('HDEL', KEYS[1], bindings[i])
    removed = removed + 1
  end
end
return {redis.call('DEL', KEYS[2], KEYS[3]), removed}
