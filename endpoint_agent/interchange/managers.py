"""The interchange's manager registry and supervision.

Managers register (REG), heartbeat every `manager_heartbeat_period` (answered with HB so
they know the interchange lives) and leave after a drain (BYE). One silent for 2
periods, or a local one whose process died, is lost: its tasks go back to the front of
the line, except the ones it was running at its last heartbeat, which are charged a
retry (FAILED with the reason past `max_task_retries`); a manager's own LOST reports
(timeouts, failures, dead workers) are charged the same way, and its BACK reports (tasks
given back unstarted) are requeued. Messages from a manager the interchange does not
know (declared lost, or from before a restart) are answered with STOP.

Managers started by the agent itself (`managers` local ones when no provider starts
them) live in slots and are restarted when they die, with a backoff when they die right
after starting; a drained one is not. The registry also gives the snapshots the scaling
strategy and status read. The methods take the interchange's state (state.py); the
registry keeps the local slots, the drained blocks and the identities told to stop.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from typing import Any

import zmq

from endpoint_agent import wire
from endpoint_agent.config import EndpointConfig
from endpoint_agent.interchange.results import ResultBatcher
from endpoint_agent.interchange.state import LOCAL_BLOCK, IxState, ManagerHandle
from endpoint_agent.procutil import child_env, describe_exit
from endpoint_agent.task_record import T_ID, T_MGR, T_PACK, T_RECV, T_TRIES

log = logging.getLogger("skyfn.agent.interchange")


class ManagerRegistry:
    def __init__(self, config: EndpointConfig, results: ResultBatcher):
        self.out = results
        self.drained_blocks: set[str] = set()
        self.local_slots: list[dict[str, Any]] = []
        self.local_gen = 0
        self.told_to_stop: dict[bytes, float] = {}
        self.hb_timeout = 2.0 * config.manager_heartbeat_period

    # --- messages -----------------------------------------------------------------
    def unknown(self, st: IxState, identity: bytes, op: bytes, mono: float) -> ManagerHandle | None:
        """A message from an identity not in the registry: a new manager (REG), else STOP."""
        if op == wire.REG and identity not in self.told_to_stop:
            m = ManagerHandle(identity)
            st.managers[identity] = m
            return m
        if identity not in self.told_to_stop and op != wire.BYE:
            log.warning("message from unknown manager %s: telling it to stop", identity.decode(errors="replace"))
        self.told_to_stop.setdefault(identity, mono)
        try:
            st.router.send_multipart([identity, wire.STOP, b""], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        return None

    def on_register(self, st: IxState, m: ManagerHandle, info: dict) -> None:
        m.registered = True
        st.roster += 1
        m.hostname = info.get("hostname", "")
        m.pid = info.get("pid")
        m.block = str(info.get("block", m.block))
        m.workers = int(info.get("workers", 0))
        m.cores = int(info.get("cores", m.workers))
        m.accelerators = list(info.get("accelerators") or [])
        m.warm = info.get("warm") or {}
        m.containers = info.get("containers") or {}
        m.cold_starts = int(info.get("cold_starts", 0))
        m.last_heartbeat = time.time()
        if m.slot is not None and m.slot < len(self.local_slots):
            self.local_slots[m.slot]["failures"] = 0
        if m.block in self.drained_blocks:
            self.drain_manager(st, m)
        log.info("manager %s registered: block %s, host %s, %d workers, %d cores, accelerators %s", m.id, m.block,
                 m.hostname, m.workers, m.cores, m.accelerators or "none")
        st._room()

    def on_heartbeat(self, st: IxState, m: ManagerHandle, hb: dict) -> None:
        m.last_heartbeat = time.time()
        m.running = hb.get("running") or []
        m.free_hb = hb.get("free", 0)
        m.warm = hb.get("warm") or {}
        m.containers = hb.get("containers") or {}
        m.cold_starts = hb.get("cold_starts", m.cold_starts)
        m.worker_pids = hb.get("workers") or []
        try:
            st.router.send_multipart([m.identity, wire.HB, b""], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def on_bye(self, st: IxState, m: ManagerHandle) -> None:
        """The manager drained and left."""
        log.info("manager %s (block %s) drained and left", m.id, m.block)
        m.draining = True
        st.managers.pop(m.identity, None)
        st.roster += 1
        self.requeue_from(st, m, f"manager {m.id} left")
        if m.slot is not None and m.slot < len(self.local_slots):
            self.local_slots[m.slot]["handle"] = None
            self.local_slots[m.slot]["retired"] = True

    def on_back(self, st: IxState, m: ManagerHandle, keys: list) -> None:
        """Tasks the manager gives back unstarted: to the front of the line."""
        for key in reversed(keys):
            m.assigned.discard(key)
            t = st.tasks.get(key)
            if t is not None and t[T_MGR] == m.identity:
                t[T_MGR] = None
                st._pend_front(key, t)

    def on_lost(self, st: IxState, m: ManagerHandle, items: list) -> None:
        """[key, kind, reason] items: "timeout" and "fail" end the task; anything else is
        charged a retry and runs again, or fails with no retries left."""
        add = self.out.add
        for key, kind, reason in items:
            t = st.tasks.get(key)
            if t is None:
                continue
            m.assigned.discard(key)
            t[T_MGR] = None
            if kind == "timeout":
                del st.tasks[key]
                add(st, {"task_id": t[T_ID], "state": "TIMED_OUT", "reason": reason,
                         "events": [["DISPATCHED", t[T_RECV]]]}, t[T_PACK])
                continue
            if kind == "fail":
                del st.tasks[key]
                log.warning("task %s failed: %s", t[T_ID], reason)
                add(st, {"task_id": t[T_ID], "state": "FAILED", "reason": reason,
                         "events": [["DISPATCHED", t[T_RECV]]]}, t[T_PACK])
                continue
            t[T_TRIES] += 1
            if t[T_TRIES] > st.config.max_task_retries:
                del st.tasks[key]
                why = f"{reason} ({t[T_TRIES]} time{'s' if t[T_TRIES] > 1 else ''}; no retries left)"
                log.warning("task %s failed: %s", t[T_ID], why)
                add(st, {"task_id": t[T_ID], "state": "FAILED", "reason": why,
                         "events": [["DISPATCHED", t[T_RECV]]]}, t[T_PACK])
            else:
                st.retried += 1
                log.warning("task %s lost: %s; running it again", t[T_ID], reason)
                st._pend_front(key, t)
        st._room()

    # --- liveness -----------------------------------------------------------------
    def check_managers(self, st: IxState, mono: float) -> None:
        for m in list(st.managers.values()):
            if m.proc is not None:
                rc = m.proc.poll()
                if rc is not None:
                    self.lose_manager(st, m, f"process {m.proc.pid} {describe_exit(rc)}", mono)
                    continue
            if m.registered and mono - m.last_seen > self.hb_timeout:
                self.lose_manager(st, m, f"silent for {mono - m.last_seen:.1f} s (heartbeat period "
                                     f"{st.config.manager_heartbeat_period:g} s)", mono)
            elif not m.registered and m.proc is None and mono - m.started > 60:
                st.managers.pop(m.identity, None)
        for slot, s in enumerate(self.local_slots):
            if s["handle"] is None and not s["retired"] and not st.closing and mono >= s["restart_at"]:
                self.start_manager(st, slot)
        if self.told_to_stop:
            for ident, ts in list(self.told_to_stop.items()):
                if mono - ts > 30:
                    del self.told_to_stop[ident]

    def lose_manager(self, st: IxState, m: ManagerHandle, why: str, mono: float) -> None:
        """The manager is gone (or must be treated so): its tasks run elsewhere."""
        st.managers.pop(m.identity, None)
        st.roster += 1
        if m.proc is not None and m.proc.poll() is None:
            m.proc.kill()
        if m.registered:
            try:
                st.router.send_multipart([m.identity, wire.STOP, b""], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            self.told_to_stop[m.identity] = mono
        self.requeue_from(st, m, f"manager {m.id} on {m.hostname or '?'} lost ({why})")
        if not st.closing:
            st.managers_lost += 1
            log.error("manager %s (block %s, %s) lost: %s; %d task(s) go back to the queue", m.id, m.block,
                      m.hostname or "?", why, len(m.assigned))
        if m.slot is not None and m.slot < len(self.local_slots):
            s = self.local_slots[m.slot]
            s["handle"] = None
            if m.draining:
                s["retired"] = True
                return
            quick = not m.registered or mono - m.started < 1.0  # died right after start: back off
            s["failures"] = s["failures"] + 1 if quick else 0
            delay = min(10.0, 0.25 * 2 ** s["failures"]) if s["failures"] > 1 else 0.0
            s["restart_at"] = mono + delay

    def requeue_from(self, st: IxState, m: ManagerHandle, reason: str) -> None:
        """Every task the manager held back to the front of the line; the ones it was
        running at its last heartbeat are charged a retry."""
        running = set(m.running)
        tasks = st.tasks
        lost = sorted(m.assigned)
        m.assigned = set()
        charged = []
        for key in reversed(lost):
            t = tasks.get(key)
            if t is None:
                continue
            t[T_MGR] = None
            if key in running:
                charged.append(key)
            else:
                st._pend_front(key, t)
        if charged:
            self.on_lost(st, m, [[key, "died", f"{reason} while running the task"] for key in charged])

    # --- draining -----------------------------------------------------------------
    def drain(self, st: IxState, ids: list[str], block: str | None) -> None:
        """DRAIN to the managers named, or of the block, not draining yet."""
        for m in list(st.managers.values()):
            if (m.id in ids or (block is not None and m.block == block)) and not m.draining:
                self.drain_manager(st, m)

    def drain_manager(self, st: IxState, m: ManagerHandle) -> None:
        m.draining = True
        m.credit = 0
        log.info("draining manager %s (block %s)", m.id, m.block)
        try:
            st.router.send_multipart([m.identity, wire.DRAIN, b""], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    # --- local manager processes --------------------------------------------------
    def manager_command(self, st: IxState, block: str, workers: int, *, identity: str | None = None,
                        parent: int | None = None, address: str | None = None) -> list[str]:
        """The command line that starts a manager for this interchange (see endpoint_agent/wire.py)."""
        cfg = st.config
        cmd = [sys.executable, "-m", "endpoint_agent.manager", "--interchange", address or st.public_address,
               "--block", str(block), "--workers", str(workers),
               "--prefetch", str(cfg.manager_prefetch_value), "--heartbeat", f"{cfg.manager_heartbeat_period:g}",
               "--max-output", str(cfg.max_output_bytes), "--log-level", cfg.log_level]
        if st.server_key:
            cmd += ["--server-key", st.server_key]
        if identity:
            cmd += ["--identity", identity]
        if parent is not None:
            cmd += ["--parent", str(parent)]
        if cfg.cores:
            cmd += ["--cores", str(cfg.cores)]
        if isinstance(cfg.accelerators, list):
            cmd += ["--accelerators", ",".join(cfg.accelerators)]
        if cfg.containers:
            cmd += ["--containers", wire.dumps(cfg.containers).decode()]
        return cmd

    def start_local_managers(self, st: IxState, n: int | None = None) -> None:
        n = st.config.managers if n is None else n
        for _ in range(n):
            self.local_slots.append({"handle": None, "restart_at": 0.0, "failures": 0, "retired": False})
            self.start_manager(st, len(self.local_slots) - 1)

    def start_manager(self, st: IxState, slot: int = 0) -> None:
        if not self.local_slots:
            self.local_slots.append({"handle": None, "restart_at": 0.0, "failures": 0, "retired": False})
        self.local_gen += 1
        identity = f"m{os.getpid()}.{self.local_gen}"
        cmd = self.manager_command(st, LOCAL_BLOCK, st.config.workers, identity=identity, parent=os.getpid(),
                                   address=st.address)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=child_env())
        m = ManagerHandle(identity.encode(), proc, slot)
        st.managers[m.identity] = m
        self.local_slots[slot]["handle"] = m
        log.info("started local manager %s (pid %s) with %d workers", identity, proc.pid, st.config.workers)

    def stop_managers(self, st: IxState, timeout: float = 5.0) -> None:
        for m in list(st.managers.values()):
            try:
                st.router.send_multipart([m.identity, wire.STOP, b""], zmq.NOBLOCK)
            except zmq.ZMQError:
                if m.proc is not None:
                    m.proc.terminate()
        deadline = time.monotonic() + timeout
        for m in list(st.managers.values()):
            if m.proc is None:
                continue
            try:
                m.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                m.proc.terminate()
                try:
                    m.proc.wait(2)
                except subprocess.TimeoutExpired:
                    m.proc.kill()
                    m.proc.wait()
        st.managers.clear()

    def first_local(self) -> ManagerHandle | None:
        """The first local manager (status of a one-manager agent)."""
        for s in self.local_slots:
            if s["handle"] is not None:
                return s["handle"]
        return None

    # --- views (any thread) -------------------------------------------------------
    def snapshot(self, st: IxState) -> dict[str, Any]:
        """A cheap picture for the scaling strategy and status (safe from any thread)."""
        managers = [m.info() for m in list(st.managers.values()) if m.registered]
        blocks: dict[str, dict[str, int]] = {}
        for m in managers:
            b = blocks.setdefault(m["block"], {"managers": 0, "workers": 0, "free_workers": 0, "running": 0,
                                               "assigned": 0})
            b["managers"] += 1
            b["workers"] += m["workers"]
            b["free_workers"] += m["free_workers"]
            b["running"] += m["running"]
            b["assigned"] += m["assigned"]
        return {"pending": st.n_pending + (st.given - st.taken), "held": st.load(),
                "workers": sum(m["workers"] for m in managers),
                "free_workers": sum(m["free_workers"] for m in managers if not m["draining"]),
                "managers": managers, "blocks": blocks, "address": st.public_address,
                "encrypted": st.server_key is not None,
                "dataflow": st.parked.snapshot() if st.parked is not None else {}}

    def block_snapshot(self, st: IxState) -> dict[str, Any]:
        """{"pending", "blocks": {block: {"managers", "workers", "free", "tasks", "last_busy"}}}"""
        mono = time.monotonic()
        blocks: dict[str, dict[str, Any]] = {}
        for m in list(st.managers.values()):
            if not m.registered:
                continue
            b = blocks.setdefault(m.block, {"managers": 0, "workers": 0, "free": 0, "tasks": 0, "last_busy": None})
            held = len(m.assigned)
            b["managers"] += 1
            b["workers"] += m.workers
            b["free"] += 0 if m.draining else m.free_workers()
            b["tasks"] += held
            busy = mono if held else m.last_busy
            if busy is not None and (b["last_busy"] is None or busy > b["last_busy"]):
                b["last_busy"] = busy
        return {"pending": st.n_pending + (st.given - st.taken), "blocks": blocks}
