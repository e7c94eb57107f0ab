-- create: new tasks, stored QUEUED, each counted in its endpoint's load until final; indexed
-- in the owner's recent tasks; the submission's history record queued in the same script.
-- One HSET per task, the index updates once per batch (each redis.call costs a few
-- microseconds inside a script).
-- KEYS[1]      recent:<owner>            the owner's latest tasks (zset task -> created)
-- KEYS[2]      first:<owner>             the time of the owner's first task
-- KEYS[3]      outbox                    the history outbox (list)
-- KEYS[4..]    t:<task>                  a task record per row, in the rows' order; then load:<endpoint> of each endpoint ARGV[9..] names, in that order
-- ARGV[1]      rows                      JSON list of CreateRow
-- ARGV[2]      created                   time, '%.6f'
-- ARGV[3]      owner
-- ARGV[4]      submission                its id
-- ARGV[5]      queued                    time, '%.6f'
-- ARGV[6]      recent_max                tasks kept in recent:<owner>
-- ARGV[7]      only_if_new               '1': a keyed retry; nothing is created when the first task exists (returns -1)
-- ARGV[8]      submission_record         'sub:<json>' for the outbox, '' for none
-- ARGV[9..]    endpoints                 the rows' endpoints, each once, whose load keys follow the task keys
-- include: bulk
-- row: CreateRow
local tasks = cjson.decode(ARGV[1])
local now = ARGV[2]
-- a keyed retry of an attempt that created its tasks (all in one script: all or none)
if ARGV[7] == '1' and tasks[1] and redis.call('EXISTS', KEYS[4]) == 1 then return -1 end
local owner, sub = ARGV[3], ARGV[4]
local ev = 'CREATED@' .. now .. ';QUEUED@' .. ARGV[5] .. ';'
local load_key = {}
for j = 9, #ARGV do load_key[ARGV[j]] = KEYS[3 + #tasks + j - 8] end
local recent, load = {}, {}
for i, t in ipairs(tasks) do
  local ep = t[CreateRow.endpoint_id]
  local f = {'o', owner, 'f', t[CreateRow.function_id], 'e', ep, 'sub', sub, 's', 'QUEUED', 'r', 0,
             'mr', t[CreateRow.max_retries], 'c', now, 'ev', ev}
  local mk = t[CreateRow.memo_key]
  if mk and mk ~= cjson.null then f[#f + 1] = 'mk'; f[#f + 1] = mk end
  local tag = t[CreateRow.tag]
  if tag and tag ~= cjson.null and tag ~= '' then
    f[#f + 1] = 'tg'; f[#f + 1] = tag
  else
    tag = '_'
  end
  redis.call('HSET', KEYS[3 + i], unpack(f))
  if ep ~= '' then
    local per = load[ep]
    if not per then per = {}; load[ep] = per end
    per[tag] = (per[tag] or 0) + 1
  end
  recent[#recent + 1] = now; recent[#recent + 1] = t[CreateRow.task_id]
end
for ep, per in pairs(load) do
  for tag, n in pairs(per) do redis.call('HINCRBY', load_key[ep], tag, n) end
end
bulk('ZADD', KEYS[1], recent, 2)
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[6]) + 1))
redis.call('EXPIRE', KEYS[1], 30 * 86400)
redis.call('SETNX', KEYS[2], now)
if ARGV[8] ~= '' then redis.call('RPUSH', KEYS[3], ARGV[8]) end  -- the submission's history record
return #tasks
