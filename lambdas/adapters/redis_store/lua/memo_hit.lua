-- memo_hit: tasks answered from the memo cache, created already SUCCEEDED with the cached
-- result, never queued or dispatched (their events say MEMO_HIT); ids that exist are left
-- alone (a retried submission). Announced on done:<owner> like finish's; returns the
-- DoneNotice of those created, or an empty list. New work: refused at maxmemory.
-- KEYS[1]      recent:<owner>            the owner's latest tasks (zset task -> created)
-- KEYS[2]      outbox                    the history outbox (list)
-- KEYS[3]      done:<owner>              the owner's completion stream
-- KEYS[4..]    t:<task>                  a task record per row, in the rows' order
-- ARGV[1]      rows                      JSON list of MemoHitRow
-- ARGV[2]      created                   time, '%.6f'
-- ARGV[3]      now                       time, '%.6f'
-- ARGV[4]      owner
-- ARGV[5]      submission                its id
-- include: done_entry
-- row: MemoHitRow, DoneNotice
local rows = cjson.decode(ARGV[1])
local created, now, owner, sub = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local ids = {}
for i, t in ipairs(rows) do
  local key = KEYS[3 + i]
  local tid = t[MemoHitRow.task_id]
  if redis.call('EXISTS', key) == 0 then
    redis.call('HSET', key, 'o', owner, 'f', t[MemoHitRow.function_id], 'e', t[MemoHitRow.endpoint_id], 'sub', sub,
               's', 'SUCCEEDED', 'r', 0, 'mr', 0, 'c', created, 'res', t[MemoHitRow.result], 'mk', t[MemoHitRow.memo_key],
               'ev', 'CREATED@' .. created .. ';MEMO_HIT@' .. now .. ';SUCCEEDED@' .. now .. ';STORED@' .. now .. ';')
    local tag = t[MemoHitRow.tag]
    if tag and tag ~= cjson.null and tag ~= '' then redis.call('HSET', key, 'tg', tag) end
    redis.call('RPUSH', KEYS[2], tid)
    redis.call('ZADD', KEYS[1], created, tid)
    table.insert(ids, tid)
  end
end
if #ids == 0 then return {} end
local csv = table.concat(ids, ',')
local prev, id = done_entry(KEYS[3], csv)
return {[DoneNotice.owner] = owner, [DoneNotice.prev] = prev, [DoneNotice.cursor] = id, [DoneNotice.ids] = csv}
