"""The hosted service: one module per Lambda handler (api, results, reaper, history),
the service core they share (lambdas/core) and adapters for DynamoDB and Redis."""
