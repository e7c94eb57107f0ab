"""The task path: functions and endpoints (registry) and endpoint groups (groups);
submission, status and cancellation (tasks) with memoization (memo), idempotency keys
(idempotency) and large arguments and results in S3 (blobs); the results push to the
owners' WebSocket connections (push); direct sessions (sessions) and the direct tasks their
agents report (direct_results); the caller's task list (task_list), a task's audit record
(audit) and per-stage latency metrics (stage_metrics). Uses lambdas.core.identity for
access checks; imports nothing of lambdas.core.runs.
"""
