"""One fleet host process of the fleet benchmark, counting what its agents ask the service.

    python -m benchmarks.fleet_agents --counts FILE <the arguments of python -m endpoint_agent.fleet>

Runs `python -m endpoint_agent.fleet` (endpoint_agent/fleet/__main__.py: the same stdin
commands and JSON lines) in this process, with two additions the benchmark reads from
FILE (rewritten atomically every second):

- `requests`: every HTTP answer the agents received, by "METHOD /path" with endpoint and
  task ids replaced by {id}, counted from urllib3's own debug record of each response
  (the agents' ServiceLink speaks through requests/urllib3; nothing of it is wrapped);
- `ready_at`: name -> wall-clock time each agent last came up (FleetHost's on-ready hook),
  for the heartbeat-to-online lag.

The queue long polls do not go through HTTP (Redis streams in the embedded runtime, SQS
on AWS): the benchmark counts them at Redis (XREADGROUP in INFO commandstats).
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time

_ID = re.compile(r"^[0-9a-fA-F-]{16,}$")


class RequestCounter(logging.Handler):
    """Counts urllib3's '%s://%s:%s "%s %s %s" %s %s' records (scheme, host, port, method,
    url, version, status, length) by method and path template."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.counts: dict[str, int] = {}
        self._mu = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if not isinstance(args, tuple) or len(args) != 8:
            return
        key = f"{args[3]} {path_template(str(args[4]))}"
        with self._mu:
            self.counts[key] = self.counts.get(key, 0) + 1

    def snapshot(self) -> dict[str, int]:
        with self._mu:
            return dict(self.counts)


def path_template(path: str) -> str:
    return "/".join("{id}" if _ID.match(p) else p for p in path.split("?")[0].split("/"))


def _writer(path: str, counter: RequestCounter, ready_at: dict[str, float]) -> None:
    tmp = f"{path}.tmp"
    while True:
        try:
            with open(tmp, "w") as f:
                json.dump({"t": time.time(), "pid": os.getpid(), "requests": counter.snapshot(),
                           "ready_at": dict(ready_at)}, f)
            os.replace(tmp, path)
        except OSError:
            pass
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    counts_file = None
    if "--counts" in argv:
        k = argv.index("--counts")
        counts_file = argv[k + 1]
        del argv[k:k + 2]
    counter = RequestCounter()
    logger = logging.getLogger("urllib3.connectionpool")
    logger.addHandler(counter)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # counted here, printed nowhere
    ready_at: dict[str, float] = {}

    from endpoint_agent.fleet import __main__ as fleet_main
    from endpoint_agent.fleet.host import FleetHost

    original = FleetHost._ready

    def _ready(self, agent) -> None:
        ready_at[agent.name] = time.time()
        original(self, agent)

    FleetHost._ready = _ready
    if counts_file:
        threading.Thread(target=_writer, args=(counts_file, counter, ready_at), name="fleet-counts",
                         daemon=True).start()
    return fleet_main.main(argv)


if __name__ == "__main__":
    sys.exit(main())
