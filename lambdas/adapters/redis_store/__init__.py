"""The hot task store in Redis: task records (payload, state, events, result), the
idempotency keys, lease deadlines, completion notifications and the history outbox.

Every state change is an atomic compare-and-set in a Lua script that takes a whole
batch at once, so a batch of 10,000 tasks costs a handful of round trips. Key layout:

  t:<task>         hash: o owner, f function, e endpoint, sub submission, s state,
                   r retries, mr max retries, c created, ev events
                   ('STATE@ts;' appended), res result, err error, why reason,
                   rt retrieved at, h 1 once written to the durable history; a
                   final record expires (Redis's own TTL) once archived: result_ttl
                   after rt, or unretrieved_ttl after archival if never read
  leases           zset task -> lease deadline (DISPATCHED/RUNNING tasks)
  done:<owner>     stream of completed task ids, read by long-polling status calls; every
                   script that writes final states adds one entry per owner and returns it
                   (prev, id, ids) as a Notice, which the results push announces
  outbox           list of history records to write to DynamoDB off the hot path
                   (task ids, 'sub:<json>' submission records); stats:archived counts
                   the task records archived
  idem:<owner>:<k> cached answer of a submission with an idempotency key
  load:<endpoint>  hash: function tag ('_' untagged) -> tasks queued to or running on the
                   endpoint, not yet final; changed in the same scripts as the states
                   (placement's live state at service level: lambdas/core/tasks/groups.py)
  memo:<owner>:<k> a memoized task's result (skyfn.protocol.memo key k), written by the
                   script that stores the SUCCEEDED result of a task created with 'mk' = k
  recent:<owner>   zset task -> created: the owner's latest RECENT_MAX tasks (GET /tasks,
                   reports and the status page; older ones come from the durable history);
                   first:<owner> the time of the owner's first task (tells whether it is complete)
  ds:<session>     hash: o owner, e endpoint, f:<function> 1: a direct session
                   (lambdas/core/tasks/sessions.py), whose reported results lua/direct.lua records
  w:<task>, settled, release, releasing, and the fields in/dn/wp/wd/pn of a task record:
                   task graphs (tasks WAITING for their inputs), laid out in graph

Modules, one concern each: rows (what the store returns: TaskRow, Notice, states),
lua/*.lua (the Lua scripts of every state change, each with a header naming its keys;
lua_files loads them, lua_rows names the rows they take and return), store (TaskStore: the task records'
lifecycle, memoization and reads), done (the completion streams done:<owner> that the
status long-poll and the results push read), idempotency (idem:<owner>:<k>) and outbox
(the history outbox and the expiry of archived records), graph (tasks
waiting for inputs, their release and the ends along their edges). TaskStore combines them.

The service's other hot state, one port each, created once per process in
lambdas/core/deps.py: registry_store (the registry's cache: fn:, ep:, epname:, eps:,
ep-index, and epdirect: as the heartbeat writes it), liveness_store (ep-beats: the endpoints
online by last heartbeat, swept by lua/sweep_silent.lua), dead_letter_watch (dl-watch: the
endpoints whose dead letters the reaper looks at; lua/settle_watch.lua), group_store (grp:, grp:<id>:rr and the
members' load:), task_fields (one field of many task records in a round trip), batch_store
(batch:<id> and its chunks, pending and counts; settle_batch.lua), run_store (run:),
action_store (ap:, apreq:), session_store (ds:), push_channel (PUBLISH push:<owner>) and
backlog_store (the backlog gauge's figures); each module's docstring lays out its keys.
"""
