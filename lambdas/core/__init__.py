"""The service core shared by the handlers, in three parts over a small base.

  identity/  who the caller is and what they may do: user JWTs, endpoint credentials and
             agent role sessions, sharing with users and teams, endpoint allowlists, the
             published direct channel keys, rate limits and the agent-route guard.
  tasks/     the task path: the registry of functions and endpoints, endpoint groups,
             submission, status and cancellation, memoization, idempotency, large payloads
             in S3, the results push, direct sessions and their results, task lists and audit.
  runs/      what runs as Step Functions executions (runs) for a user: batches, flows and
             SPMD groups with their settings and rendezvous tokens, and Globus Flows actions.

deps (process-wide clients), errors and ids are the base every part uses. The imports go
one way: runs -> tasks -> identity -> base.
"""
