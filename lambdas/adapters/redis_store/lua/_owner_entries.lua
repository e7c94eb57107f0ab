-- owner_entries: the ids that became final in one call, announced as finish's are: one
-- completion-stream entry per owner on done_key(owner) (done:<owner>). `owners`: the owners
-- in the order first seen; `ids`: owner -> its ids. Returns one notice(owner, prev, cursor,
-- csv) per owner, the script's notice row.
-- include: done_entry
local function owner_entries(owners, ids, done_key, notice)
  local notices = {}
  for _, owner in ipairs(owners) do
    local csv = table.concat(ids[owner], ',')
    local prev, cursor = done_entry(done_key(owner), csv)
    notices[#notices + 1] = notice(owner, prev, cursor, csv)
  end
  return notices
end
