-- announce: the dependents ended here, announced like finish's final states: one
-- completion-stream entry per owner. `ended`: tables of fields id, state, why, err (false:
-- none) and owner, in the order they ended; `done_key(owner)`: that owner's stream,
-- done:<owner> (a script that knows the owner passes its key from KEYS). Returns the
-- NoticeRow rows, one per owner, each with its EndedRow rows.
-- row: NoticeRow, EndedRow
local function announce(ended, done_key)
  local by, owners = {}, {}
  for _, e in ipairs(ended) do
    local o = e.owner
    if not by[o] then by[o] = {}; owners[#owners + 1] = o end
    table.insert(by[o], e)
  end
  local notices = {}
  for _, o in ipairs(owners) do
    local key = done_key(o)
    local ids = {}
    for _, e in ipairs(by[o]) do ids[#ids + 1] = e.id end
    local id = redis.call('XADD', key, 'MAXLEN', '~', 10000, '*', 'ids', table.concat(ids, ','))
    redis.call('EXPIRE', key, 86400)
    local before = redis.call('XREVRANGE', key, '(' .. id, '-', 'COUNT', 1)
    local rows = {}
    for _, e in ipairs(by[o]) do
      rows[#rows + 1] = {[EndedRow.task_id] = e.id, [EndedRow.state] = e.state, [EndedRow.reason] = e.why,
                         [EndedRow.error] = e.err}
    end
    notices[#notices + 1] = {[NoticeRow.owner] = o, [NoticeRow.prev] = before[1] and before[1][1] or '0-0',
                             [NoticeRow.cursor] = id, [NoticeRow.ended] = rows}
  end
  return notices
end
