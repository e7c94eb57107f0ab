#!lua flags=allow-oom
-- direct: results of direct sessions (skyfn.protocol.direct): tasks the service never
-- queued, created here final for the owner of their session record ds:<session>, only if
-- the session is the sending endpoint's and names the function. Create-if-absent: a
-- redelivered pack counts duplicates. Indexed like any finished task (recent:, outbox) but
-- never announced on done:<owner>: the SDK has the results already, and an entry nobody
-- pushes would show its connections a gap. The SDK got each result from the agent: it
-- counts as retrieved (rt): once archived, its record expires result_ttl after that.
-- Returns {stored, duplicates, unknown}.
-- KEYS[1]      outbox                    the history outbox (list)
-- KEYS[2..]    t:<task>                  a task record per row, in the rows' order; then ds:<session> per row, in the same order
-- ARGV[1]      rows                      JSON list of DirectRow
-- ARGV[2]      now                       time, '%.6f'
-- ARGV[3]      sender                    the endpoint that sent the results
-- ARGV[4]      recent_max                tasks kept in recent:<owner>
-- built: recent:<owner>   the owner is read from the session record
-- built: first:<owner>    the owner is read from the session record
-- include: bulk
-- row: DirectRow
local rows = cjson.decode(ARGV[1])
local now, from = ARGV[2], ARGV[3]
local sessions, recent, owners = {}, {}, {}
local ended = {}
local stored, dup, unknown = 0, 0, 0
for i, r in ipairs(rows) do
  local key, sk = KEYS[1 + i], KEYS[1 + #rows + i]
  local session, fn, state = r[DirectRow.session], r[DirectRow.function_id], r[DirectRow.state]
  local owner = sessions[session]
  if owner == nil then
    local v = redis.call('HMGET', sk, 'o', 'e')
    owner = (v[1] and v[2] == from) and v[1] or false
    sessions[session] = owner
  end
  if not owner or redis.call('HEXISTS', sk, string.format('f:%s', fn)) == 0 then  -- a field of the session, not a key
    unknown = unknown + 1
  elseif redis.call('EXISTS', key) == 1 then
    dup = dup + 1
  else
    local f = {'o', owner, 'f', fn, 'e', from, 'by', from, 'sub', session, 's', state, 'r', 0, 'mr', 0,
               'c', r[DirectRow.created], 'rt', now, 'ev', r[DirectRow.events] .. state .. '@' .. now .. ';STORED@' .. now .. ';'}
    if r[DirectRow.result] ~= cjson.null then f[#f + 1] = 'res'; f[#f + 1] = r[DirectRow.result] end
    if r[DirectRow.error] ~= cjson.null then f[#f + 1] = 'err'; f[#f + 1] = r[DirectRow.error] end
    if r[DirectRow.reason] ~= cjson.null then f[#f + 1] = 'why'; f[#f + 1] = r[DirectRow.reason] end
    if r[DirectRow.stdout] ~= cjson.null then f[#f + 1] = 'so'; f[#f + 1] = r[DirectRow.stdout] end
    if r[DirectRow.stderr] ~= cjson.null then f[#f + 1] = 'se'; f[#f + 1] = r[DirectRow.stderr] end
    redis.call('HSET', key, unpack(f))
    ended[#ended + 1] = r[DirectRow.task_id]
    local per = recent[owner]
    if not per then per = {}; recent[owner] = per; owners[#owners + 1] = owner end
    per[#per + 1] = r[DirectRow.created]; per[#per + 1] = r[DirectRow.task_id]
    stored = stored + 1
  end
end
if #ended > 0 then bulk('RPUSH', KEYS[1], ended, 1) end
for _, owner in ipairs(owners) do
  local rk = 'recent:' .. owner
  bulk('ZADD', rk, recent[owner], 2)
  redis.call('ZREMRANGEBYRANK', rk, 0, -(tonumber(ARGV[4]) + 1))
  redis.call('EXPIRE', rk, 30 * 86400)
  redis.call('SETNX', 'first:' .. owner, recent[owner][1])
end
return {stored, dup, unknown}
