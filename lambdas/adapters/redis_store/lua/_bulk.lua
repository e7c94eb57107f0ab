-- bulk: a command over many members, sent in slices (Lua's unpack has a stack limit);
-- `width` members make one item (2 for ZADD's score and member).
local function bulk(cmd, key, items, width)
  local step = 4000 - 4000 % width
  for i = 1, #items, step do
    redis.call(cmd, key, unpack(items, i, math.min(i + step - 1, #items)))
  end
end
