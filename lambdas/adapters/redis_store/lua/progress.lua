#!lua flags=allow-oom
-- progress: tasks' progress from their agents: a state never moves backwards; LEASE only
-- extends a live lease (DISPATCHED or RUNNING). A parked task (WAITING, released by its
-- agent) ranks as CREATED, and loads its endpoint once it moves. With a sender (ARGV[3]),
-- only tasks routed to it move. Returns how many were applied. Runs at maxmemory.
-- KEYS[1]      leases                    the lease deadlines (zset)
-- KEYS[2..]    t:<task>                  a task record per row, in the rows' order; then load:<sender> when ARGV[3] names one
-- ARGV[1]      rows                      JSON list of ProgressRow
-- ARGV[2]      now                       time, '%.6f'
-- ARGV[3]      sender                    the endpoint that sent the updates, '' for any
-- built: load:<endpoint>  without a sender (ARGV[3] ''), a parked task's endpoint, read from its record
-- include: bulk
-- row: ProgressRow
local rank = {CREATED=0, QUEUED=1, DISPATCHED=2, RUNNING=3}
local rows = cjson.decode(ARGV[1])
local now = tonumber(ARGV[2])
local from = ARGV[3]
local sender_load = KEYS[2 + #rows]
local applied = 0
local leases = {}
for i, u in ipairs(rows) do
  local key = KEYS[1 + i]
  local state = u[ProgressRow.state]
  local v = redis.call('HMGET', key, 's', 'e', 'ev', 'pk', 'tg')
  local s = v[1]
  if s == 'WAITING' and v[4] then s = 'CREATED' end
  if s and rank[s] ~= nil and (from == '' or v[2] == from) then
    if state ~= 'LEASE' and rank[state] > rank[s] then
      if v[1] == 'WAITING' then redis.call('HINCRBY', sender_load or ('load:' .. v[2]), v[5] or '_', 1) end
      redis.call('HSET', key, 's', state, 'ev', (v[3] or '') .. state .. '@' .. u[ProgressRow.ts] .. ';')
      leases[#leases + 1] = now + u[ProgressRow.lease_seconds]; leases[#leases + 1] = u[ProgressRow.task_id]
      applied = applied + 1
    elseif s == 'DISPATCHED' or s == 'RUNNING' then
      leases[#leases + 1] = now + u[ProgressRow.lease_seconds]; leases[#leases + 1] = u[ProgressRow.task_id]
      applied = applied + 1
    end
  end
end
if #leases > 0 then bulk('ZADD', KEYS[1], leases, 2) end  -- a task listed twice: its last lease wins
return applied
