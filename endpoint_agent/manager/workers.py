"""The manager's worker supervision: the worker processes, their liveness and their deaths.

Each worker slot runs one process (`python -m endpoint_agent.manager.worker`), inside a container
of the slot's type when a runtime is set (containers.py). Every CHECK_PERIOD_S the
supervisor reads the progress slots (endpoint_agent/slots.py): a worker that died is replaced -- after a
backoff when it dies right after starting -- and the task it was running (the culprit)
is reported LOST, the tasks queued behind it go back to the front of the backlog; a task
past its walltime gets its worker killed and is reported LOST with kind "timeout"; a
cancelled running task gets its worker killed, and nothing is reported; a task running
longer than RUNNING_AFTER_S is reported RUNNING once; an idle container past its idle
timeout is stopped (its slot turns plain). On shutdown every worker gets STOP, then
SIGTERM, then SIGKILL. The methods take the manager's state (state.py).
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import zmq

from endpoint_agent import wire
from endpoint_agent.manager.results import ResultSender
from endpoint_agent.manager.state import NONE, RESPAWN_BACKOFF_MAX_S, RUNNING_AFTER_S, ManagerState, WorkerProc
from endpoint_agent.procutil import child_env, describe_exit

log = logging.getLogger("skyfn.manager")


class WorkerSupervisor:
    def __init__(self, results: ResultSender):
        self.results = results

    def _popen(self, st: ManagerState, ctype: str, cmd: list[str], slot: int):
        """(process, launch) of a worker of this type: inside a container when a runtime is set."""
        if st.runtime is None:
            return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, pass_fds=(st.slots.fd,), env=child_env()), None
        launch = st.runtime.wrap(None if ctype == NONE else ctype, cmd, pass_fds=(st.slots.fd,),
                                 name=f"skyfn-w-{os.getpid()}-{slot}-{st.gen}")
        return launch.popen(), launch

    def spawn(self, st: ManagerState, slot: int) -> None:
        st.gen += 1
        ctype = st.slot_type[slot]
        identity = f"w{slot}.{st.gen}".encode()
        st.slots.reset(slot)
        cmd = [sys.executable, "-m", "endpoint_agent.manager.worker", "--connect", st.worker_addr,
               "--identity", identity.decode(), "--slot", str(slot), "--slots", str(st.n_workers),
               "--slots-fd", str(st.slots.fd), "--parent", str(os.getpid()), "--max-output", str(st.max_output)]
        if ctype != NONE:
            st.cold_starts += 1
        try:
            proc, launch = self._popen(st, ctype, cmd, slot)
        except Exception as exc:  # noqa: BLE001 - a container that cannot start: plain worker
            log.error("cannot start a %s worker (%s); slot %d runs a plain worker", ctype, exc, slot)
            st.slot_type[slot] = ctype = NONE
            proc, launch = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, pass_fds=(st.slots.fd,),
                                            env=child_env()), None
        w = WorkerProc(slot, st.gen, proc, identity, ctype)
        w.launch = launch
        st.workers[slot] = w
        st.by_identity[identity] = w
        st.warm_dirty = True

    def handle_death(self, st: ManagerState, w: WorkerProc, rc: int) -> None:
        self.results.drain_workers(st, )  # results it sent before dying are still good
        started, running, _ts = st.slots.read(w.slot)
        culprit = started - w.reported - 1 if running else -1
        tasks = list(w.inflight)
        requeue = []
        for i, task in enumerate(tasks):
            key = task[0]
            st.running_reported.discard(key)
            if key in st.cancelled:
                st.cancelled.discard(key)
            elif w.kill_reason and w.kill_reason[1] == key:
                if w.kill_reason[0] != "cancelled":
                    st.lost_out.append([key, w.kill_reason[0], w.kill_reason[2]])
            elif i == culprit:
                st.lost_out.append([key, "died", f"worker process {w.proc.pid} {describe_exit(rc)} while running the task"])
            else:
                requeue.append(task)
        w.inflight.clear()
        st._release(w)
        for task in reversed(requeue):
            st._queue_front(task)
        st.by_identity.pop(w.identity, None)
        st.workers[w.slot] = None
        st.warm_dirty = True
        quick = time.monotonic() - w.started_at < 2.0 and not w.reported and not w.kill_reason
        st.fail_streak[w.slot] = st.fail_streak[w.slot] + 1 if quick else 0
        streak = st.fail_streak[w.slot]  # deaths in a row right after start: back off
        delay = 0.0 if streak <= 1 else min(RESPAWN_BACKOFF_MAX_S, 0.1 * 2 ** streak)
        st.respawn_at[w.slot] = time.monotonic() + delay
        level = logging.INFO if w.kill_reason else logging.WARNING
        log.log(level, "worker %s (pid %s) %s; %d task(s) requeued, %d lost; replacing it%s", w.slot, w.proc.pid,
                describe_exit(rc), len(requeue), len(tasks) - len(requeue),
                f" in {delay:.1f} s" if delay else "")

    def kill_worker(self, st: ManagerState, w: WorkerProc, kind: str, key: int, reason: str) -> None:
        if w.kill_reason is None:
            w.kill_reason = (kind, key, reason)
            try:
                w.proc.kill()
            except OSError:
                pass
            runtime = st.runtime
            if w.launch is not None and runtime is not None and w.launch.runtime != "none":
                # the container itself, off the loop (the runtime's CLI may take a while)
                import threading

                threading.Thread(target=runtime.kill, args=(w.launch, w.proc), kwargs={"always": True},
                                 daemon=True).start()  # the client was killed above; the container lives on

    def check_workers(self, st: ManagerState, now_wall: float) -> None:
        mono = time.monotonic()
        for slot in range(st.n_workers):
            w = st.workers[slot]
            if w is None:
                if mono >= st.respawn_at[slot] and not st.stopping:
                    self.spawn(st, slot)
                continue
            rc = w.proc.poll()
            if rc is not None:
                self.handle_death(st, w, rc)
                if mono >= st.respawn_at[slot] and not st.stopping:
                    self.spawn(st, slot)
                continue
            started, running, ts = st.slots.read(slot)
            if w.ctype != NONE and not w.inflight and w.ready and not w.kill_reason \
                    and mono - w.last_used > st.idle_timeout:
                log.info("worker %s: idle %s container for %.0f s; stopping it", slot, w.ctype, mono - w.last_used)
                st.slot_type[slot] = NONE
                self.kill_worker(st, w, "evict", -1, "idle")
                continue
            if not running or w.kill_reason:
                continue
            idx = started - w.reported - 1
            if not 0 <= idx < len(w.inflight):
                continue
            task = w.inflight[idx]
            key, walltime = task[0], task[3]
            elapsed = now_wall - ts
            if key in st.cancelled:
                self.kill_worker(st, w, "cancelled", key, "cancelled")
            elif walltime and elapsed > walltime:
                self.kill_worker(st, w, "timeout", key, f"walltime of {walltime:g} s exceeded")
            elif elapsed > RUNNING_AFTER_S and key not in st.running_reported:
                st.running_reported.add(key)
                st.running_out.append([key, ts])

    def stop_workers(self, st: ManagerState) -> None:
        """STOP to every worker; the idle ones leave at once, the ones still in user code
        get SIGTERM after a moment, SIGKILL if that does not end them."""
        alive = [w for w in st.workers if w is not None and w.proc.poll() is None]
        for w in alive:
            try:
                st.wsock.send_multipart([w.identity, wire.STOP, b""], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline and any(w.proc.poll() is None for w in alive):
            time.sleep(0.01)
        for w in alive:
            if w.proc.poll() is None:
                try:
                    w.proc.terminate()
                except OSError:
                    pass
        deadline = time.monotonic() + 3.0
        for w in alive:
            try:
                w.proc.wait(max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
