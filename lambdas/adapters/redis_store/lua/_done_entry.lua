-- done_entry: one completion-stream entry on `stream` (done:<owner>) for the ids that became
-- final together (comma-separated); returns the entry just before it and the entry's id.
-- include: prev
local function done_entry(stream, csv)
  local id = redis.call('XADD', stream, 'MAXLEN', '~', 10000, '*', 'ids', csv)
  redis.call('EXPIRE', stream, 86400)
  return prev_entry(stream, id), id
end
