"""The user agents of a multi-user endpoint: start one per (account, rendered config), keep it
alive while it has work, stop it when idle, and take it up again after a restart of the
privileged process.

A user agent is keyed by `<account>-<digest[:12]>` (the digest of the rendered config, so a
user with two configs has two agents). Starting one:
- an ACL user of the router's Redis for it (endpoint_agent/multiuser/router_redis.py) with a
  fresh password, allowed only its own streams `mu:<account>:<digest12>:{tasks,results,control}`;
- its working directory (accounts.prepare_workdir) and, under the runtime directory, its
  account's peer-ref directory (owned by the account: only it can put sockets there);
- the process, started as the account (accounts.start_as) with the admin's environment, the
  account's SKYFN_HOME (its working directory) and the peer-ref settings, stderr appended to
  `<state dir>/agents/<key>.log` (root's); its config -- the rendered one plus the queues and
  an endpoint id of its own -- written on its stdin.
A record of each (0600 JSON in `<state dir>/agents/`, holding the queue password) lets a
privileged process started again after SIGKILL adopt the agents still running, and start the
ones whose streams still hold tasks.

Supervision (`supervise()`, from the endpoint's loop): a user agent that exited while its
task stream holds tasks is started again (the stream's leases give its unfinished tasks to
the new one, so nothing is lost); one that exits within START_GRACE_S of starting
MAX_QUICK_EXITS times in a row is given up, and its tasks end FAILED with the end of its
log. A user agent with an empty task stream and no result for `idle_timeout` seconds is
stopped (SIGTERM: graceful) and its ACL user dropped; the next task starts it again.

Lanes (skyfn.protocol.lanes): an agent started when the service has lanes gets one
(`<state dir>/agents/<key>.json` keeps its grant) and reads its tasks from the lane's queue at
the service; each (identity, config key) routed to it is bound to the lane. An idle agent
with a lane stops but is kept: the service goes on sending its users' tasks to the lane, and
supervise() starts it when its lane's queue holds one. A new privileged process closes the
lanes of agents no longer running (their bindings were made under the earlier run's mapping)
and the router routes again what they held (`closed_lanes`).
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from endpoint_agent.multiuser.accounts import Account, account_environment, lookup_account, prepare_workdir, start_as
from endpoint_agent.multiuser.lanes import Lanes
from endpoint_agent.multiuser.router_redis import RouterRedis, prefix_of
from endpoint_agent.procutil import pid_alive
from skyfn.protocol.lanes import lane_name
from skyfn.protocol.queues.redis_streams import RedisStreamQueue

log = logging.getLogger("skyfn.multiuser.agents")

START_GRACE_S = 5.0
MAX_QUICK_EXITS = 3
STOP_TIMEOUT_S = 60.0
CLOSED_LANE_WATCH_S = 60.0
PEER_REFS_ENV = "SKYFN_PEER_REFS_DIR"
PEER_IDENTITIES_ENV = "SKYFN_PEER_IDENTITIES"
# keys of the user agent's config that the endpoint sets: a template may not
ENDPOINT_KEYS = ("endpoint_id", "task_queue", "results_queue", "control_queue", "service_url", "token", "direct")


@dataclass
class UserAgent:
    """One user agent: what it runs as, its queues, its process."""

    key: str
    account: Account
    digest: str
    config: dict
    acl_user: str
    password: str
    endpoint_id: str
    pid: Optional[int] = None
    proc: Optional[subprocess.Popen] = None
    started: float = 0.0
    last_active: float = field(default_factory=time.monotonic)
    quick_exits: int = 0
    stopping: bool = False
    identities: set[str] = field(default_factory=set)  # skyfn user ids whose tasks it ran
    queues: dict[str, RedisStreamQueue] = field(default_factory=dict)
    lane: Optional[dict] = None  # LaneGranted (skyfn.protocol.lanes) when the service sends its tasks directly
    bindings: set[str] = field(default_factory=set)  # "<identity id> <config key>" bound to its lane
    lane_queue: Optional[RedisStreamQueue] = None  # the endpoint's handle on the lane's task queue

    @property
    def tasks(self) -> RedisStreamQueue:
        """Where its tasks wait: its lane's queue at the service, or its stream in the router's Redis."""
        return self.lane_queue if self.lane_queue is not None else self.queues["tasks"]

    @property
    def prefix(self) -> str:
        return prefix_of(self.account.name, self.digest[:12])

    def stream(self, kind: str) -> str:
        return self.prefix + kind

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return self.pid is not None and pid_alive(self.pid)

    def record(self) -> dict[str, Any]:
        return {"key": self.key, "account": self.account.name, "digest": self.digest, "config": self.config,
                "acl_user": self.acl_user, "password": self.password, "endpoint_id": self.endpoint_id,
                "pid": self.pid, "identities": sorted(self.identities), "lane": self.lane,
                "bindings": sorted(self.bindings)}


class UserAgents:
    """The registry of user agents (see the module docstring)."""

    def __init__(self, *, router: RouterRedis, state_dir: Path, runtime_dir: Path, endpoint_id: str, name: str,
                 python: str, environment: dict[str, str], working_directory: str, idle_timeout: float,
                 lease_seconds: float, deny: list[str], min_uid: int,
                 fail_tasks: Callable[[UserAgent, str], None], lanes: Optional[Lanes] = None):
        self.router = router
        self.dir = Path(state_dir) / "agents"
        self.runtime_dir = Path(runtime_dir)
        self.endpoint_id = endpoint_id
        self.name = name
        self.python = python
        self.environment = environment
        self.working_directory = working_directory
        self.idle_timeout = idle_timeout
        self.lease_seconds = lease_seconds
        self.deny, self.min_uid = deny, min_uid
        self.fail_tasks = fail_tasks  # called with an agent given up and the reason
        self.lanes = lanes  # None: no service link, every task goes through the router's Redis
        # queues of lanes closed at start, with when to stop looking (the service may have been
        # sending to one as it closed): the router takes back what is in them
        self.closed_lanes: list[tuple[RedisStreamQueue, float]] = []
        self.agents: dict[str, UserAgent] = {}
        self.lock = threading.RLock()
        self.identities: dict[int, set[str]] = {}  # uid -> skyfn user ids mapped to it (the peer-ref brokers read it)
        self.started_count = 0
        self.stopped_idle = 0

    # --- start-up --------------------------------------------------------------------
    def prepare(self) -> None:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self.runtime_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(self.runtime_dir, 0o755)
        (self.runtime_dir / "refs").mkdir(mode=0o755, exist_ok=True)
        os.chmod(self.runtime_dir / "refs", 0o755)
        self._write_identities()

    def adopt(self) -> list[UserAgent]:
        """Take up the user agents of records left by an earlier run: a live one is kept, one
        whose process is gone is started again when its streams still hold tasks."""
        adopted = []
        known_users = self.router.users()
        for path in sorted(self.dir.glob("*.json")):
            try:
                rec = json.loads(path.read_text())
                account = lookup_account(rec["account"], self.deny, self.min_uid)
            except Exception as exc:  # noqa: BLE001 - a record we cannot use: its account changed
                log.warning("dropping user agent record %s: %s", path.name, exc)
                path.unlink(missing_ok=True)
                continue
            ua = UserAgent(key=rec["key"], account=account, digest=rec["digest"], config=rec["config"],
                           acl_user=rec["acl_user"], password=rec["password"], endpoint_id=rec["endpoint_id"],
                           pid=rec.get("pid"), identities=set(rec.get("identities", [])), lane=rec.get("lane"),
                           bindings=set(rec.get("bindings", [])))
            for identity_id in ua.identities:  # the peer-ref brokers trust them again
                self._note_identity(account.uid, identity_id)
            if ua.acl_user not in known_users:  # re-made after a restart of the router's Redis
                self.router.ensure_user(ua.acl_user, ua.password, ua.prefix)
            alive = ua.pid is not None and pid_alive(ua.pid) and _is_user_agent(ua.pid, account.uid)
            if ua.lane is not None and not alive:
                self._close_lane(ua)
            self._open_queues(ua)
            with self.lock:
                self.agents[ua.key] = ua
            if alive:
                log.info("adopted user agent %s (pid %d) of the previous run", ua.key, ua.pid)
            elif ua.tasks.depth() > 0:
                ua.pid = None
                self._spawn(ua)
            else:
                ua.pid = None
            adopted.append(ua)
        return adopted

    # --- getting one -----------------------------------------------------------------
    def get(self, account: Account, identity_id: str, rendered_config: dict, digest: str,
            config_key: str = "none") -> UserAgent:
        """The running user agent of (account, config), started if needed, with (identity,
        config key) bound to its lane when the service has lanes."""
        key = f"{account.name}-{digest[:12]}"
        with self.lock:
            self._note_identity(account.uid, identity_id)
            ua = self.agents.get(key)
            if ua is None:
                ua = UserAgent(key=key, account=account, digest=digest, config=rendered_config,
                               acl_user=f"mu-{key}", password=secrets.token_hex(24),
                               endpoint_id=f"{self.endpoint_id}.{key}")
                self.router.ensure_user(ua.acl_user, ua.password, ua.prefix)
                self._open_queues(ua)
                self.agents[key] = ua
            ua.last_active = time.monotonic()
            changed = self._bind(ua, identity_id, config_key)
            if identity_id not in ua.identities:
                ua.identities.add(identity_id)
                changed = True
            if changed and ua.alive():
                self._save(ua)
            if not ua.alive() and not ua.stopping:
                self._spawn(ua)
            return ua

    def _bind(self, ua: UserAgent, identity_id: str, config_key: str) -> bool:
        """Bind (identity, config key) to the agent's lane, opening it for an agent not yet
        running (a running agent without a lane reads only the router's stream)."""
        binding = f"{identity_id} {config_key}"
        if self.lanes is None or binding in ua.bindings or (ua.lane is None and ua.alive()):
            return False
        grant = self.lanes.bind(lane_name(ua.key), identity_id, config_key)
        if grant is None:
            return False
        if ua.lane is None:
            ua.lane = grant.model_dump()
            ua.lane_queue = self.lanes.queue(grant.task_queue.name)
        ua.bindings.add(binding)
        return True

    def _close_lane(self, ua: UserAgent) -> None:
        """Close the lane of an agent that is not running (its bindings were made under the
        mapping of an earlier run); what is left in its queue is routed again."""
        assert ua.lane is not None
        if self.lanes is None or not self.lanes.close(ua.lane["lane"]):
            return  # kept: the service still sends there, and the agent reads it when started
        queue = self.lanes.queue(ua.lane["task_queue"]["name"])
        self.closed_lanes.append((queue, time.monotonic() + CLOSED_LANE_WATCH_S))
        ua.lane, ua.lane_queue, ua.bindings = None, None, set()
        self._save(ua)

    def _open_queues(self, ua: UserAgent) -> None:
        for kind in ("tasks", "results", "control"):
            q = RedisStreamQueue(ua.stream(kind), client=self.router.client, consumer="router",
                                 visibility_timeout=self.lease_seconds)
            q.ensure()
            ua.queues[kind] = q
        if ua.lane is not None and self.lanes is not None:
            ua.lane_queue = self.lanes.queue(ua.lane["task_queue"]["name"])

    def _spawn(self, ua: UserAgent) -> None:
        account = ua.account
        workdir = prepare_workdir(account, self.working_directory)
        refs = self.runtime_dir / "refs" / account.name
        refs.mkdir(mode=0o755, exist_ok=True)
        os.chown(refs, account.uid, account.gid)
        os.chmod(refs, 0o755)
        env = account_environment(account, {**self.environment, "SKYFN_HOME": str(workdir),
                                            PEER_REFS_ENV: str(self.runtime_dir / "refs"),
                                            PEER_IDENTITIES_ENV: str(self.runtime_dir / "identities.json")})
        config = {**ua.config, "endpoint_id": ua.endpoint_id, "lease_seconds": self.lease_seconds,
                  "task_queue": self._descriptor(ua, "tasks"), "results_queue": self._descriptor(ua, "results"),
                  "control_queue": self._descriptor(ua, "control")}
        doc: dict[str, Any] = {"name": f"{self.name}.{ua.key}", "config": config}
        if ua.lane is not None:  # tasks from the lane, results to the service; audit copies to the router
            config.update(task_queue=ua.lane["task_queue"], results_queue=ua.lane["results_queue"])
            doc["lane"] = {"lane": ua.lane["lane"], "mac_key": ua.lane["mac_key"],
                           "endpoint_id": ua.lane["endpoint_id"],
                           "audit_queue": self._descriptor(ua, "results")}
        fd = os.open(self.dir / f"{ua.key}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = start_as(account, [self.python, "-m", "endpoint_agent.multiuser.user_agent"], workdir=workdir,
                            environment=env, stdin=subprocess.PIPE, stdout=fd, stderr=fd)
        finally:
            os.close(fd)
        try:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(doc).encode())
            proc.stdin.close()
        except OSError as exc:  # it died at once: supervise() reads its log
            log.warning("user agent %s exited before it read its config (%s)", ua.key, exc)
        ua.proc, ua.pid, ua.started, ua.stopping = proc, proc.pid, time.monotonic(), False
        self.started_count += 1
        self._save(ua)
        log.info("started user agent %s as %s (pid %d)", ua.key, account.describe(), proc.pid)

    def _descriptor(self, ua: UserAgent, kind: str) -> dict[str, str]:
        return {"kind": "redis", "name": ua.stream(kind), "url": self.router.url(ua.acl_user, ua.password)}

    def _save(self, ua: UserAgent) -> None:
        path = self.dir / f"{ua.key}.json"
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(ua.record(), f)
        os.replace(tmp, path)

    def _note_identity(self, uid: int, identity_id: str) -> None:
        ids = self.identities.setdefault(uid, set())
        if identity_id not in ids:
            ids.add(identity_id)
            self._write_identities()

    def _write_identities(self) -> None:
        path = self.runtime_dir / "identities.json"
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump({str(uid): sorted(ids) for uid, ids in self.identities.items()}, f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)

    # --- supervision -------------------------------------------------------------------
    def supervise(self) -> None:
        now = time.monotonic()
        with self.lock:
            agents = list(self.agents.values())
        for ua in agents:
            if ua.alive():
                if ua.quick_exits and now - ua.started > START_GRACE_S:
                    ua.quick_exits = 0
                if not ua.stopping and now - ua.last_active > self.idle_timeout and self._idle(ua):
                    self._stop_idle(ua)
                continue
            if ua.stopping:
                self._forget(ua)
                continue
            if ua.pid is None and ua.proc is None:
                if ua.tasks.depth() > 0:  # tasks routed or sent to it as it stopped: start it for them
                    self._spawn(ua)
                continue  # else: nothing to do; started by the next task
            code = ua.proc.returncode if ua.proc is not None else None
            quick = ua.started and now - ua.started < START_GRACE_S
            ua.proc, ua.pid = None, None
            if ua.tasks.depth() == 0:
                log.info("user agent %s ended (exit %s) with no task left", ua.key, code)
                continue
            ua.quick_exits = ua.quick_exits + 1 if quick else 0
            if ua.quick_exits >= MAX_QUICK_EXITS:
                reason = (f"the user agent of {ua.account.name} on endpoint {self.name} could not start: it exited "
                          f"{ua.quick_exits} times within {START_GRACE_S:g} s (last exit code {code}); "
                          f"last lines of its log: {self.log_tail(ua)}")
                log.error("%s", reason)
                ua.quick_exits = 0
                self.fail_tasks(ua, reason)
                continue
            log.warning("user agent %s exited (code %s) with tasks left: starting it again", ua.key, code)
            self._spawn(ua)

    def _idle(self, ua: UserAgent) -> bool:
        return ua.tasks.depth() == 0 and ua.queues["results"].depth() == 0

    def _stop_idle(self, ua: UserAgent) -> None:
        log.info("user agent %s idle for %.0f s: stopping it", ua.key, self.idle_timeout)
        ua.stopping = True
        self.stopped_idle += 1
        self._signal(ua, signal.SIGTERM)

    def _forget(self, ua: UserAgent) -> None:
        """An idle agent has stopped: drop its ACL user and record (the next task makes new ones).
        Under the lock the router routes with, so a pack is never routed to a forgotten agent;
        one routed while it stopped keeps it (supervise() starts it again). An agent with a
        lane is kept: the service sends its users' tasks to the lane, and supervise() starts
        it when one arrives."""
        with self.lock:
            if ua.lane is None and self._idle(ua):
                self.agents.pop(ua.key, None)
                try:
                    self.router.drop_user(ua.acl_user)
                except Exception as exc:  # noqa: BLE001
                    log.warning("cannot drop ACL user of %s: %s", ua.key, exc)
                (self.dir / f"{ua.key}.json").unlink(missing_ok=True)
            ua.proc, ua.pid, ua.stopping = None, None, False

    def _signal(self, ua: UserAgent, sig: int) -> None:
        pid = ua.proc.pid if ua.proc is not None else ua.pid
        if pid is None:
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def log_tail(self, ua: UserAgent, lines: int = 6) -> str:
        try:
            text = (self.dir / f"{ua.key}.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:]) or "(empty log)"

    def by_prefix(self, ua_key: str) -> Optional[UserAgent]:
        with self.lock:
            return self.agents.get(ua_key)

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return [{"key": ua.key, "account": ua.account.name, "uid": ua.account.uid, "pid": ua.pid,
                     "alive": ua.alive(), "stopping": ua.stopping} for ua in self.agents.values()]

    def stop_all(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop every user agent gracefully (they finish what they run and return the results)."""
        with self.lock:
            agents = list(self.agents.values())
        for ua in agents:
            if ua.alive():
                ua.stopping = True
                self._signal(ua, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for ua in agents:
            while ua.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            if ua.alive():
                log.warning("user agent %s did not stop within %.0f s: killing it", ua.key, timeout)
                self._signal(ua, signal.SIGKILL)
            ua.pid, ua.proc = None, None
            if ua.lane is None and ua.tasks.depth() == 0:
                (self.dir / f"{ua.key}.json").unlink(missing_ok=True)
            else:  # tasks routed to it wait in the router's Redis, or its lane is still bound: the
                self._save(ua)  # next run starts it for them, or closes the lane and routes again
            try:
                self.router.drop_user(ua.acl_user)
            except Exception:  # noqa: BLE001 - the router may be gone already
                pass


def _is_user_agent(pid: int, uid: int) -> bool:
    """pid is a user agent process of the account (not a reused pid)."""
    try:
        st = os.stat(f"/proc/{pid}")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return st.st_uid == uid and b"endpoint_agent.multiuser.user_agent" in cmd


def end_leftover_agents(state_dir: Path, timeout: float = STOP_TIMEOUT_S) -> list[int]:
    """Stop (SIGTERM, then SIGKILL after `timeout`) the user agents a privileged process killed
    hard left running; their records stay, so tasks left in their streams are taken up at the
    next start. Returns their pids."""
    pids = []
    for path in sorted((Path(state_dir) / "agents").glob("*.json")):
        try:
            rec = json.loads(path.read_text())
            uid = pwd_uid(rec["account"])
        except (OSError, ValueError, KeyError):
            continue
        pid = rec.get("pid")
        if pid and _is_user_agent(pid, uid):
            os.kill(pid, signal.SIGTERM)
            pids.append(pid)
    deadline = time.monotonic() + timeout
    for pid in pids:
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    return pids


def pwd_uid(account: str) -> int:
    import pwd

    return pwd.getpwnam(account).pw_uid
