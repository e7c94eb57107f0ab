"""Multi-user endpoints (issue 23; DESIGN.md section 12): the building blocks of one endpoint,
run by its administrator as root, that serves many users, each user's tasks in a *user agent*
running as that user's own POSIX account.

Not wired into the agent's task path yet: these are the parts, each tested on its own.

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
- `configure`  `skyfn-endpoint configure --multi-user NAME`: the admin's settings
               (`MultiUserConfig`) and the example files it writes
- `errors`     `TaskRefused`, the base of every refusal a task is FAILED with
"""
