"""A user agent: the process a multi-user endpoint starts as a mapped account.

    python -m endpoint_agent.multiuser.user_agent      (as the account; config on stdin)

It is an ordinary skyfn agent (endpoint_agent.agent.Agent) whose queues are not the
service's: the privileged process writes one JSON document on its stdin, `{"name": ...,
"config": {...}}`, the user's rendered config with the queues the router made for this
user agent (task, results and control streams in the router's Redis, reached with this
agent's own ACL user) and its endpoint id, then closes it. Nothing reaches the process
through its command line or a file the privileged process wrote (the queue password is a
secret). The agent's directory is `$SKYFN_HOME/endpoints/<name>/`, under the account's
working directory: its data Redis, stores file and secrets are the account's own (0600
files in 0700 directories). It logs to stderr, which the privileged process keeps.
SIGTERM stops it gracefully, as any agent.
"""
from __future__ import annotations

import json
import logging
import sys

from endpoint_agent.agent import Agent
from endpoint_agent.config import parse_config
from endpoint_agent.errors import ConfigError
from endpoint_agent.paths import EndpointPaths


def main() -> int:
    try:
        doc = json.loads(sys.stdin.read())
        name, data = doc["name"], doc["config"]
    except (ValueError, KeyError, TypeError) as exc:
        print(f"user agent: expected {{\"name\", \"config\"}} as JSON on stdin ({exc})", file=sys.stderr)
        return 2
    try:
        config = parse_config(data, f"the user config of {name}")
    except ConfigError as exc:
        print(f"user agent {name}: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.log_level, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s {name} %(name)s[%(process)d]: %(message)s")
    paths = EndpointPaths(name).ensure()
    return Agent(name, config, paths=paths).run()


if __name__ == "__main__":
    sys.exit(main())
