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
log. Whatever one user does to their own account (their working directory replaced by a
symlink, their agent killed) touches that user alone: an agent that cannot be started (a
refusal, an error) or that is given up fails its tasks with the reason, its lane is closed
(its (identity, config) pairs are unbound: their tasks come back through the router), and
it is *backed off* -- tasks of that user agent are refused with the reason, without trying,
for BACKOFF_FIRST_S, doubling on each failure up to BACKOFF_MAX_S -- while every other user
is served. A user agent with an empty task stream and no result for `idle_timeout` seconds is
stopped (SIGTERM: graceful); once stopped, one without a lane is *forgotten* -- its ACL user,
its streams in the router's Redis and its record are removed -- and the next task starts it
again as new.

Lanes (skyfn.protocol.lanes): an agent started when the service has lanes gets one
(`<state dir>/agents/<key>.json` keeps its grant) and reads its tasks from the lane's queue at
the service; each (identity, config key) routed to it is bound to the lane. An idle agent
with a lane stops but is kept: the service goes on sending its users' tasks to the lane, and
supervise() starts it when its lane's queue holds one. Once it has been idle (no task, no
result) for `lane_idle_timeout` seconds its lane is *unbound*: closed at the service (its
bindings, its queue login and its record there are removed: the service sends that user's
tasks to the endpoint's own queue again) and the agent forgotten as above; the user's next
task comes through the router, which binds a lane again and starts the agent. A new
privileged process closes the lanes of agents no longer running (their bindings were made
under the earlier run's mapping). What arrives in a closed lane's queue is taken back and
routed again by the router (`closed_lanes`, multiuser/closed_lanes.py; `take_back`, set by
the endpoint), also just before a lane still watched is bound again.
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
from pathlib import Path
from typing import Any, Callable, Optional

from endpoint_agent.multiuser.accounts import Account, account_environment, lookup_account, prepare_workdir, start_as
from endpoint_agent.multiuser.agent_records import (STOP_TIMEOUT_S, UserAgent, check_peer_gid, end_leftover_agents,
                                                    is_user_agent)
from endpoint_agent.multiuser.closed_lanes import ClosedLanes
from endpoint_agent.multiuser.errors import TaskRefused
from endpoint_agent.multiuser.lanes import Lanes
from endpoint_agent.multiuser.router_redis import RouterRedis
from endpoint_agent.procutil import pid_alive
from skyfn.protocol.lanes import lane_name
from skyfn.protocol.queues.base import TaskQueue
from skyfn.protocol.queues.redis_streams import RedisStreamQueue

__all__ = ["ENDPOINT_KEYS", "StartRefused", "UserAgent", "UserAgents", "end_leftover_agents"]

log = logging.getLogger("skyfn.multiuser.agents")

START_GRACE_S = 5.0
MAX_QUICK_EXITS = 3
UNBIND_RETRY_S = 30.0    # a lane the service would not close (it is down) is tried again after this
BACKOFF_FIRST_S = 2.0    # an agent that could not start is not tried again for this long, then twice as long...
BACKOFF_MAX_S = 120.0
PEER_REFS_ENV = "SKYFN_PEER_REFS_DIR"
PEER_IDENTITIES_ENV = "SKYFN_PEER_IDENTITIES"
# keys of the user agent's config that the endpoint sets: a template may not
ENDPOINT_KEYS = ("endpoint_id", "task_queue", "results_queue", "control_queue", "service_url", "token", "direct")


class StartRefused(TaskRefused):
    """A user agent could not be started, or is backed off after it could not; the message is
    the reason its tasks are FAILED with."""


class UserAgents:
    """The registry of user agents (see the module docstring)."""

    def __init__(self, *, router: RouterRedis, state_dir: Path, runtime_dir: Path, endpoint_id: str, name: str,
                 python: str, environment: dict[str, str], working_directory: str, idle_timeout: float,
                 lease_seconds: float, deny: list[str], min_uid: int,
                 fail_tasks: Callable[[UserAgent, str], None], lanes: Optional[Lanes] = None,
                 peer_gid: Optional[int] = None, lane_idle_timeout: float = 3600.0):
        self.router = router
        self.dir = Path(state_dir) / "agents"
        self.runtime_dir = Path(runtime_dir)
        self.endpoint_id = endpoint_id
        self.name = name
        self.python = python
        self.environment = environment
        self.working_directory = working_directory
        self.idle_timeout = idle_timeout
        self.lane_idle_timeout = lane_idle_timeout
        self.lease_seconds = lease_seconds
        self.deny, self.min_uid = deny, min_uid
        self.fail_tasks = fail_tasks  # called with an agent given up and the reason
        self.lanes = lanes  # None: no service link, every task goes through the router's Redis
        # the extra group of user agents, the only one that reads identities.json (MultiUserConfig.peer_gid)
        self.peer_gid = peer_gid
        # lanes closed, watched a while (the service may have been sending to one as it closed):
        # the router takes back what is in them (`take_back`, set by the endpoint)
        self.closed_lanes = ClosedLanes()
        self.take_back: Callable[[TaskQueue], int] = lambda queue: 0
        self.agents: dict[str, UserAgent] = {}
        self.lock = threading.RLock()
        self.identities: dict[int, set[str]] = {}  # uid -> skyfn user ids mapped to it (the peer-ref brokers read it)
        self.started_count = 0
        self.stopped_idle = 0
        self.unbound_idle = 0
        self.may_hold: Callable[[UserAgent], bool] = lambda ua: True  # lane_routes.LaneRoutes.may_hold
        self.lane_closed: Callable[[str], None] = lambda stream: None  # lane_routes.LaneRoutes.forget

    # --- start-up --------------------------------------------------------------------
    def prepare(self) -> None:
        if self.peer_gid is not None:
            check_peer_gid(self.peer_gid)
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
            # re-made after a restart of the router's Redis; a kept one gets today's rules
            self.router.ensure_user(ua.acl_user, ua.password, ua.prefix)
            alive = ua.pid is not None and pid_alive(ua.pid) and is_user_agent(ua.pid, account.uid)
            if ua.lane is not None and not alive:
                self._close_lane(ua)
            self._open_queues(ua)
            with self.lock:
                self.agents[ua.key] = ua
            if alive:
                log.info("adopted user agent %s (pid %d) of the previous run", ua.key, ua.pid)
            elif ua.tasks.depth() > 0:
                ua.pid = None
                self._restart(ua)
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
            self._before_binding_again(key)
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
            starts = not ua.alive() and not ua.stopping
            if starts:
                self._check_backoff(ua)  # before binding: a backed-off agent's pairs stay unbound
            changed = self._bind(ua, identity_id, config_key)
            if identity_id not in ua.identities:
                ua.identities.add(identity_id)
                changed = True
            if changed and ua.alive():
                self._save(ua)
            if starts:
                self._start(ua)
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

    def _before_binding_again(self, key: str) -> None:
        """A lane of `key` closed lately may still get a task the service sent as it closed:
        what is in it is routed again now, before the lane is bound again and its agent reads
        it (a task of an identity not bound again would find its result refused)."""
        queue = self.closed_lanes.take(lane_name(key))
        if queue is not None:
            taken = self.take_back(queue)
            if taken:
                log.info("routed again %d pack(s) left in the closed lane of %s before binding it again", taken, key)

    def _close_lane(self, ua: UserAgent, save: bool = True) -> bool:
        """Close the lane of an agent that is not running (its bindings were made under the
        mapping of an earlier run, it is backed off, or it has been idle for
        lane_idle_timeout); what is left in its queue is routed again. False when the
        service did not close it (it is kept)."""
        assert ua.lane is not None
        if self.lanes is None or not self.lanes.close(ua.lane["lane"]):
            return False  # kept: the service still sends there, and the agent reads it when started
        queue = ua.lane_queue or self.lanes.queue(ua.lane["task_queue"]["name"])
        self.closed_lanes.add(ua.lane["lane"], queue)
        stream = ua.lane["task_queue"]["name"]
        ua.lane, ua.lane_queue, ua.bindings = None, None, set()
        self.lane_closed(stream)
        if save:
            self._save(ua)
        return True

    # --- starting, and backing off when it cannot -------------------------------------
    def _check_backoff(self, ua: UserAgent) -> None:
        left = ua.retry_at - time.monotonic()
        if ua.refusal is not None and left > 0:
            raise StartRefused(f"{ua.refusal} (not tried again for another {left:.0f} s)")

    def _start(self, ua: UserAgent) -> None:
        """Start the agent; StartRefused with the reason when it cannot (it is then backed off
        and its lane closed)."""
        try:
            self._spawn(ua)
        except Exception as exc:  # noqa: BLE001 - whatever one account's state makes fail is that account's alone
            reason = (f"the user agent of {ua.account.name} on endpoint {self.name} could not be started: "
                      f"{exc}")
            self.back_off(ua, reason)
            raise StartRefused(reason) from None

    def back_off(self, ua: UserAgent, reason: str) -> None:
        """Not start `ua` again for a while (doubling), refusing its tasks with `reason`, and
        close its lane: its (identity, config) pairs are unbound, their tasks come through
        the router, and what is left in the lane is routed again (and refused meanwhile)."""
        ua.start_failures += 1
        delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (ua.start_failures - 1))
        ua.retry_at, ua.refusal = time.monotonic() + delay, reason
        log.error("%s; backing off user agent %s for %.0f s (other users are not affected)", reason, ua.key, delay)
        if ua.lane is not None:
            self._close_lane(ua)

    def _restart(self, ua: UserAgent) -> None:
        """Start `ua` for the tasks it has (supervision): unless backed off; when it cannot
        start, its tasks end FAILED with the reason."""
        if ua.refusal is not None and time.monotonic() < ua.retry_at:
            return
        try:
            self._start(ua)
        except StartRefused as exc:
            self.fail_tasks(ua, str(exc))

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
                           "audit_queue": self._descriptor(ua, "results"), "seen_key": ua.stream("seen")}
        fd = os.open(self.dir / f"{ua.key}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = start_as(account, [self.python, "-m", "endpoint_agent.multiuser.user_agent"], workdir=workdir,
                            environment=env, stdin=subprocess.PIPE, stdout=fd, stderr=fd,
                            extra_gids=[self.peer_gid] if self.peer_gid is not None else [])
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
        """identities.json: root's, 0640, group peer_gid (only user agents read it; without a
        peer_gid, root's alone: 0600)."""
        path = self.runtime_dir / "identities.json"
        tmp = path.with_suffix(".tmp")
        mode = 0o640 if self.peer_gid is not None else 0o600
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            if self.peer_gid is not None:
                os.fchown(f.fileno(), os.geteuid(), self.peer_gid)
            os.fchmod(f.fileno(), mode)
            json.dump({str(uid): sorted(ids) for uid, ids in self.identities.items()}, f)
        os.replace(tmp, path)

    # --- supervision -------------------------------------------------------------------
    def supervise(self) -> None:
        """One round over the user agents (see the module docstring). Nothing one agent's
        state raises escapes: it is logged, and the others are supervised."""
        now = time.monotonic()
        with self.lock:
            agents = list(self.agents.values())
        for ua in agents:
            try:
                self._supervise_one(ua, now)
            except Exception:  # noqa: BLE001 - e.g. the router's Redis restarting: next round
                log.exception("supervising user agent %s failed; trying again in the next round", ua.key)

    def _supervise_one(self, ua: UserAgent, now: float) -> None:
        if ua.alive():
            if now - ua.started > START_GRACE_S:
                ua.quick_exits = 0
                ua.start_failures, ua.refusal = 0, None
            if not ua.stopping and now - ua.last_active > self.idle_timeout and self._idle(ua):
                self._stop_idle(ua)
            return
        if ua.stopping:
            self._forget(ua)
            return
        if ua.pid is None and ua.proc is None:
            if self.may_hold(ua) and ua.tasks.depth() > 0:  # tasks routed or sent to it: start it for them
                self._restart(ua)
            elif ua.lane is not None and now - ua.last_active > self.lane_idle_timeout and now >= ua.unbind_at:
                self._unbind_idle(ua, now)
            return  # else: nothing to do; started by the next task
        code = ua.proc.returncode if ua.proc is not None else None
        quick = ua.started and now - ua.started < START_GRACE_S
        ua.proc, ua.pid = None, None
        if ua.tasks.depth() == 0:
            log.info("user agent %s ended (exit %s) with no task left", ua.key, code)
            return
        ua.quick_exits = ua.quick_exits + 1 if quick else 0
        if ua.quick_exits >= MAX_QUICK_EXITS:
            reason = (f"the user agent of {ua.account.name} on endpoint {self.name} could not start: it exited "
                      f"{ua.quick_exits} times within {START_GRACE_S:g} s (last exit code {code}); "
                      f"last lines of its log: {self.log_tail(ua)}")
            ua.quick_exits = 0
            self.back_off(ua, reason)
            self.fail_tasks(ua, reason)
            return
        log.warning("user agent %s exited (code %s) with tasks left: starting it again", ua.key, code)
        self._restart(ua)

    def _idle(self, ua: UserAgent) -> bool:
        return ua.tasks.depth() == 0 and ua.queues["results"].depth() == 0

    def _stop_idle(self, ua: UserAgent) -> None:
        log.info("user agent %s idle for %.0f s: stopping it", ua.key, self.idle_timeout)
        ua.stopping = True
        self.stopped_idle += 1
        self._signal(ua, signal.SIGTERM)

    def _forget(self, ua: UserAgent) -> None:
        """An idle agent has stopped: forget it (the next task makes a new one). Under the lock
        the router routes with, so a pack is never routed to a forgotten agent; one routed
        while it stopped keeps it (supervise() starts it again). An agent with a lane is kept
        until lane_idle_timeout: the service sends its users' tasks to the lane, and
        supervise() starts it when one arrives."""
        with self.lock:
            if ua.lane is None and self._idle(ua):
                self._drop(ua)
            ua.proc, ua.pid, ua.stopping = None, None, False

    def _unbind_idle(self, ua: UserAgent, now: float) -> None:
        """A stopped agent idle for lane_idle_timeout: close its lane at the service (its users'
        tasks come to the endpoint's queue again, and the router binds a lane again for the
        next one), then forget it. Under the lock the router routes with."""
        with self.lock:
            if self.agents.get(ua.key) is not ua or ua.lane is None or ua.pid is not None or ua.proc is not None:
                return
            lane = ua.lane["lane"]
            if not self._close_lane(ua, save=False):
                ua.unbind_at = now + UNBIND_RETRY_S
                log.warning("cannot unbind the lane of idle user agent %s now; trying again in %.0f s", ua.key,
                            UNBIND_RETRY_S)
                return
            self.unbound_idle += 1
            log.info("user agent %s idle for %.0f s: unbound its lane %s", ua.key, now - ua.last_active, lane)
            if self._idle(ua):
                self._drop(ua)
            else:  # something is left in its router streams: kept, and started for it
                self._save(ua)

    def _drop(self, ua: UserAgent) -> None:
        """Remove a stopped, idle agent from the registry with its ACL user, its streams in the
        router's Redis and its record."""
        self.agents.pop(ua.key, None)
        try:
            self.router.drop_user(ua.acl_user)
            self.router.drop_streams(ua.prefix)
        except Exception as exc:  # noqa: BLE001
            log.warning("cannot drop the ACL user and streams of %s: %s", ua.key, exc)
        (self.dir / f"{ua.key}.json").unlink(missing_ok=True)

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
                     "alive": ua.alive(), "stopping": ua.stopping, "lane": ua.lane is not None}
                    for ua in self.agents.values()]

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
