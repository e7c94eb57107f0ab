-- prev: the completion-stream entry of `stream` (done:<owner>) just before `id` ('0-0' if
-- none): pushes carry it so that a client sees a gap in what it was told (skyfn.protocol.push).
local function prev_entry(stream, id)
  local before = redis.call('XREVRANGE', stream, '(' .. id, '-', 'COUNT', 1)
  if before[1] then return before[1][1] end
  return '0-0'
end
