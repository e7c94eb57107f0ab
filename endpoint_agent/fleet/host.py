"""FleetHost: N light agents in this process, named `<prefix>-0000` ... and kept under `home`.

Every agent is a LightAgent (endpoint_agent/light/agent.py) running on its own thread:
it registers with the owner's token the first time (its endpoint named after it), keeps
its endpoint credential in `<home>/endpoints/<name>/credential` and connects with it on
every later start -- a host killed (SIGKILL) and started again with the same `home` gets
the same endpoints back, with no new registration. All agents share one config (the
engine forced to inline) and one SharedPool of `threads` threads.

`start()` starts every agent, at most `concurrency` of them registering or connecting at a
time, and waits until all run; `endpoint_ids()` maps names to endpoint ids (also written to
`<home>/fleet.json` as agents come up); `stop_agent(name)` stops one gracefully (its
heartbeats stop: the service sees it go offline) and `start_agent(name)` starts it again
with its credential; `stop()` stops them all, in parallel. Agents write no status file.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Optional, Union

from endpoint_agent.config import EndpointConfig, parse_config
from endpoint_agent.light import LightAgent, SharedPool
from endpoint_agent.paths import EndpointPaths
from endpoint_agent.service import credential

log = logging.getLogger("skyfn.fleet")

FLEET_FILE = "fleet.json"


class FleetHost:
    def __init__(self, count: int, home: Union[str, Path], *, service_url: Optional[str] = None,
                 token: Optional[str] = None, prefix: str = "fleet", config: Optional[dict[str, Any]] = None,
                 threads: int = 8, concurrency: int = 4):
        if count < 1:
            raise ValueError("a fleet has at least one agent")
        if os.environ.get(credential.ENV):
            raise ValueError(f"{credential.ENV} is set: every agent of the fleet would use that one credential; "
                             "unset it (each agent keeps its own under the fleet's home)")
        self.home = Path(home)
        self.names = [f"{prefix}-{i:04d}" for i in range(count)]
        settings = dict(config or {})
        settings["engine"] = {"type": "inline", "threads": threads}
        if service_url:
            settings["service_url"] = service_url
        if token:
            settings["token"] = token
        self.config: EndpointConfig = parse_config(settings, "the fleet's config")
        self.pool = SharedPool(threads)
        self._slots = threading.BoundedSemaphore(max(1, concurrency))
        self._lock = threading.Lock()
        self.agents: dict[str, LightAgent] = {}
        self.threads: dict[str, threading.Thread] = {}
        self.errors: dict[str, str] = {}
        self._holding: set[int] = set()  # agents holding a start slot (by id())
        self._ids: dict[str, str] = self._read_ids()

    # --- one agent -------------------------------------------------------------------
    def paths(self, name: str) -> EndpointPaths:
        return EndpointPaths(name, root=self.home / "endpoints")

    def start_agent(self, name: str, wait: bool = True, timeout: Optional[float] = 120.0) -> Optional[str]:
        """Start the agent `name` (again: with its kept credential); with `wait`, until it runs.
        Its endpoint id (None when it did not come up within `timeout`)."""
        if name not in self.names:
            raise KeyError(f"no agent {name!r} in this fleet")
        old, previous = self.agents.get(name), self.threads.get(name)
        if previous is not None and previous.is_alive():
            if old is None or not old.life.stopping.is_set():
                raise RuntimeError(f"agent {name} is running; stop it first")
            previous.join(timeout)  # still stopping (its last long poll): done first
            if previous.is_alive():
                raise RuntimeError(f"agent {name} is still stopping")
        with self._lock:
            agent = LightAgent(name, self.config, paths=self.paths(name), write_status_file=False, pool=self.pool,
                               on_ready=self._ready)
            thread = threading.Thread(target=self._run, args=(agent,), name=f"fleet-{name}", daemon=True)
            self.agents[name], self.threads[name] = agent, thread
            self.errors.pop(name, None)
        thread.start()
        if wait:
            self._wait_up(agent, thread, timeout)
        return agent.endpoint_id if agent.ready.is_set() else None

    def stop_agent(self, name: str, wait: bool = True, timeout: Optional[float] = 60.0) -> None:
        """Stop the agent `name` gracefully: receiving stops, running tasks finish, results
        leave, heartbeats stop (the service marks it offline). A long poll under way is not
        waited out (what it takes is released); `wait=False` returns at once, and a
        `start_agent` meanwhile waits for the stop to end."""
        agent, thread = self.agents.get(name), self.threads.get(name)
        if agent is None or thread is None:
            return
        agent.stop()
        if wait:
            thread.join(timeout)

    def running(self) -> list[str]:
        """The names of the agents running now."""
        return [n for n, a in list(self.agents.items()) if a.ready.is_set()]

    def endpoint_ids(self) -> dict[str, str]:
        """name -> endpoint id of every agent that ever came up (kept across restarts in fleet.json)."""
        with self._lock:
            return dict(self._ids)

    # --- the fleet -------------------------------------------------------------------
    def start(self, timeout: Optional[float] = None) -> dict[str, str]:
        """Start every agent not running (at most `concurrency` coming up at once) and wait
        until each runs or has failed (`errors`); name -> endpoint id."""
        started = []
        for name in self.names:
            thread = self.threads.get(name)
            if thread is None or not thread.is_alive():
                self.start_agent(name, wait=False)
                started.append(name)
        deadline = None if timeout is None else time.monotonic() + timeout
        for name in started:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._wait_up(self.agents[name], self.threads[name], left)
        if self.errors:
            log.error("%d agent(s) failed to start, e.g. %s", len(self.errors), next(iter(self.errors.items())))
        return self.endpoint_ids()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop every agent (in parallel) and wait for them."""
        for agent in list(self.agents.values()):
            agent.stop()
        deadline = time.monotonic() + timeout
        for thread in list(self.threads.values()):
            thread.join(max(0.0, deadline - time.monotonic()))
        self.pool.shutdown(wait=False)

    def __enter__(self) -> "FleetHost":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- inside ----------------------------------------------------------------------
    def _run(self, agent: LightAgent) -> None:
        self._slots.acquire()  # released once it runs (_ready) or ends
        with self._lock:
            self._holding.add(id(agent))
        try:
            agent.run()
        except Exception as exc:  # noqa: BLE001 - one agent's failure (e.g. a refused token) is its own
            log.error("agent %s failed: %s", agent.name, exc)
            self.errors[agent.name] = f"{type(exc).__name__}: {exc}"
        finally:
            self._release(agent)

    def _ready(self, agent: LightAgent) -> None:
        self._release(agent)
        with self._lock:
            if self._ids.get(agent.name) != agent.endpoint_id:
                self._ids[agent.name] = agent.endpoint_id
                self._write_ids()

    def _release(self, agent: LightAgent) -> None:
        with self._lock:
            held = id(agent) in self._holding
            self._holding.discard(id(agent))
        if held:
            self._slots.release()

    @staticmethod
    def _wait_up(agent: LightAgent, thread: threading.Thread, timeout: Optional[float]) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not agent.ready.wait(0.2) and thread.is_alive():
            if deadline is not None and time.monotonic() >= deadline:
                return

    def _read_ids(self) -> dict[str, str]:
        try:
            return dict(json.loads((self.home / FLEET_FILE).read_text()).get("endpoints") or {})
        except (OSError, ValueError):
            return {}

    def _write_ids(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        tmp = self.home / f".{FLEET_FILE}.tmp"
        tmp.write_text(json.dumps({"endpoints": self._ids}, indent=1, sort_keys=True))
        os.replace(tmp, self.home / FLEET_FILE)
