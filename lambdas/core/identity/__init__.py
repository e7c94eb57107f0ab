"""Who the caller is and what they may do: verifying user JWTs (jwt_keys), endpoint
credentials (agent_keys) and the AWS agent role sessions they buy (agent_credentials),
sharing with users and teams (access, teams), endpoint allowlists (allowlist), the direct
channel and session key an agent publishes (direct_info), per-caller rate limits (limits),
what an agent may reach before routing (guard), secrets loaded at cold start
(secret_env), and the submitter's identity claims kept per user for the task packs
(submitters). Imports nothing of lambdas.core.tasks or lambdas.core.runs.
"""
