"""`python -m endpoint_agent.fleet --count N --home DIR [--service URL] [--token JWT] ...`

Runs a FleetHost (host.py) until SIGTERM or SIGINT, then stops every agent gracefully and
exits 0. Once all agents run it prints one JSON line on stdout:
  {"event": "ready", "pid": ..., "endpoints": {name: endpoint id, ...}, "failed": {name: why}}
then reads commands on stdin, one a line, each answered by one JSON line:
  stop NAME    the agent stops gracefully ({"event": "stopped", "name": ...} once it has:
               up to --receive-wait, its long poll under way ends first)
  start NAME   it starts again with its credential ({"event": "started", "name", "endpoint_id"})
Commands are taken at once (stops and starts run on threads of their own), so answers may
come in another order than the commands; a start of an agent still stopping waits for it.
  ids          {"event": "ids", "endpoints": {...}, "running": [...]}
  quit         as SIGTERM
The end of stdin is not a stop: a host started with no stdin runs until signalled.
--service and --token default to SKYFN_SERVICE_URL / SKYFN_TOKEN (or the client config);
--config is an endpoint config.yaml applied to every agent (its engine made inline).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading

import yaml

from endpoint_agent.fleet.host import FleetHost


_out = threading.Lock()


def _say(event: str, **fields) -> None:
    with _out:
        sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
        sys.stdout.flush()


def _stop(host: FleetHost, name: str) -> None:
    host.stop_agent(name)
    _say("stopped", name=name)


def _start(host: FleetHost, name: str) -> None:
    try:
        _say("started", name=name, endpoint_id=host.start_agent(name))
    except (KeyError, RuntimeError) as exc:
        _say("error", name=name, message=str(exc))


def _commands(host: FleetHost, done: threading.Event) -> None:
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        cmd, arg = words[0], (words[1] if len(words) > 1 else "")
        try:
            if cmd in ("stop", "start"):  # each on its own thread: a stop waits out a long poll
                if arg not in host.names:
                    raise KeyError(f"no agent {arg!r} in this fleet")
                threading.Thread(target=_stop if cmd == "stop" else _start, args=(host, arg), daemon=True).start()
            elif cmd == "ids":
                _say("ids", endpoints=host.endpoint_ids(), running=host.running())
            elif cmd == "quit":
                done.set()
                return
            else:
                _say("error", message=f"unknown command {cmd!r} (stop NAME, start NAME, ids, quit)")
        except (KeyError, RuntimeError) as exc:
            _say("error", message=str(exc))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m endpoint_agent.fleet", description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, required=True, help="agents (endpoints) to run")
    ap.add_argument("--home", required=True, help="where the agents keep their credentials (and fleet.json)")
    ap.add_argument("--service", help="the service URL (default: SKYFN_SERVICE_URL)")
    ap.add_argument("--token", help="the owner's token, to register (default: SKYFN_TOKEN)")
    ap.add_argument("--prefix", default="fleet", help="agents are named PREFIX-0000, PREFIX-0001, ...")
    ap.add_argument("--threads", type=int, default=8, help="the shared pool's threads")
    ap.add_argument("--concurrency", type=int, default=4, help="agents registering or connecting at once")
    ap.add_argument("--config", help="an endpoint config.yaml for every agent")
    ap.add_argument("--heartbeat-period", type=float)
    ap.add_argument("--receive-wait", type=float)
    ap.add_argument("--lease-seconds", type=float)
    ap.add_argument("--log-level", default="WARNING")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d %(threadName)s]: %(message)s")
    config = {}
    if args.config:
        with open(args.config) as f:
            config = yaml.safe_load(f) or {}
    for key in ("heartbeat_period", "receive_wait", "lease_seconds"):
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    host = FleetHost(args.count, args.home, service_url=args.service, token=args.token, prefix=args.prefix,
                     config=config, threads=args.threads, concurrency=args.concurrency)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    host.start()
    _say("ready", pid=os.getpid(), endpoints=host.endpoint_ids(), failed=dict(host.errors))
    threading.Thread(target=_commands, args=(host, done), name="fleet-stdin", daemon=True).start()
    while not done.wait(1.0):
        pass
    host.stop()
    _say("stopped-all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
