"""Multi-user endpoints (DESIGN.md section 12; docs/multi-user.md): one endpoint, run by its
administrator as root, that serves many users, each user's tasks in a *user agent* running as
that user's own POSIX account.

- `endpoint`   the privileged process (`skyfn-endpoint start NAME` on a multi-user config)
- `router`     packs in by submitting identity, results back, cancels across, audit records
- `router_redis` the queues between the privileged process and its user agents (an ACL user each)
- `user_agents` start, supervise, idle-stop and adopt user agents; `user_agent` is their process

- `identity`   the submitting identity (id, username, email, identity_provider) -> a local
               account name, with the globus-identity-mapping library (expression rules or an
               external program), or the reason there is none
- `accounts`   an account name -> what a user agent runs as (uid, gid, groups, home); root, gid
               0 and denied accounts refused; a working directory of the admin's choosing; a
               process started as the account with a clean environment (the admin's env file)
- `templates`  the user config template: sandboxed Jinja2, user variables checked against a
               JSON schema, every inserted value a quoted YAML scalar; the rendered config and
               a stable digest of (user, config) that keys user agents
- `audit`      the endpoint's audit log: JSON lines, 0600, one write per record
- `routes`     the routing record (task -> user agent, identity, function) audit lines come from;
               `lane_routes` reads it from the service's messages in lanes; `audit_copies`
               judges what a lane's agent reports (its outcome only; disagreements logged)
- `configure`  `skyfn-endpoint configure --multi-user NAME`: the admin's settings
               (`MultiUserConfig`) and the example files it writes
- `errors`     `TaskRefused`, the base of every refusal a task is FAILED with
"""
