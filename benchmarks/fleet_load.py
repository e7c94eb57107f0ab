"""The fleet benchmark's load: M users submitting to endpoints drawn by a Zipf law, and the probes.

Users: M tokens of the embedded runtime's issuer (infra.local.access.mint_token), one
identity each (`fleet-user-<i>`); the fleet's owner shares every endpoint with
`all-users` (role run), so each user submits to any of them. Each user registers its own
two functions: `noop(x)` and `sleep10(x)` (10 ms, then x).

The load (`Load`): a fixed total rate R tasks/s (default 100), half no-op and half 10 ms,
split evenly over the users. Each user has a thread that, every `tick` seconds, submits
the tasks its share of R has made due as ONE POST /tasks (each task names its endpoint),
then reads the outcomes of its unfinished tasks with one POST /tasks/status (no wait).
tick = M x batch / R (batch: 10 tasks by default), so every rung makes the same requests
per task (about 2 per `batch` tasks) whatever its M: what a rung's CPU per task compares
is the fleet's size, not the users' batching. Users start staggered over one tick.
Endpoints are drawn by a Zipf law of exponent s (default 1.5) over the fleet's `busy`
list: rank k has weight k^-s, so at s = 1.5 the top endpoint takes ~38 % of the tasks, the
top 10 ~75 %, and most of a 1,000-endpoint fleet sees one task a minute or none; the
endpoints left out of the list (the idle probe's, the lag probe's) see none.

Every task's argument is unique (user, index); its outcome must be that value. `Tally`
counts submitted, resolved right, wrong, failed (by reason) and still unresolved, and
keeps every task id (with its user) for the exactly-once check (`final_states`: the records read back
with their events, more than one final state is a duplicate).

`Prober`: one task at a time from its own Client (POST /tasks, then the long poll of
POST /tasks/status: no executor queue in between) to one endpoint, every `period` s; its
round trips in ms.
"""
from __future__ import annotations

import bisect
import random
import threading
import time
from typing import Any, Optional

TOKEN_TTL = 6 * 3600


def noop(x):
    return x


def sleep10(x):
    import time

    time.sleep(0.01)
    return x


def percentile(values: list[float], q: float) -> Optional[float]:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class Zipf:
    def __init__(self, items: list[str], s: float, seed: int = 39):
        self.items = list(items)
        acc, cum = 0.0, []
        for k in range(1, len(self.items) + 1):
            acc += k ** -s
            cum.append(acc)
        self.cum, self.total = cum, acc
        self.rng = random.Random(seed)

    def share(self, k: int) -> float:
        """The expected share of the load of rank k (1-based)."""
        return (self.cum[k - 1] - (self.cum[k - 2] if k > 1 else 0.0)) / self.total

    def pick(self, rng: random.Random) -> str:
        return self.items[min(len(self.items) - 1, bisect.bisect_left(self.cum, rng.random() * self.total))]


class User:
    def __init__(self, state, service_url: str, index: int):
        from infra.local.access import mint_token
        from skyfn import Client

        self.index = index
        self.name = f"fleet-user-{index:03d}"
        self.service_url, self.token = service_url, mint_token(state, self.name, TOKEN_TTL)
        self.client = Client(service_url=service_url, token=self.token)
        self.fids = (self.client.register_function(noop), self.client.register_function(sleep10))

    def close(self) -> None:
        self.client.close()


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.submitted = self.resolved = self.wrong = self.failed = self.rejected = 0
        self.failures: dict[str, int] = {}
        self.owned: list[tuple[int, str]] = []  # (user index, task id) of every task submitted
        self.per_endpoint: dict[str, int] = {}

    def why(self, exc: BaseException) -> None:
        key = f"{type(exc).__name__}: {str(exc)[:120]}"
        with self.lock:
            self.failures[key] = self.failures.get(key, 0) + 1


class Load:
    def __init__(self, users: list[User], busy: list[str], rate: float, zipf_s: float, batch: int, tally: Tally):
        self.users, self.rate, self.batch, self.tally = users, rate, batch, tally
        self.zipf = Zipf(busy, zipf_s)
        self.tick = max(0.1, len(users) * batch / rate)
        self.stop = threading.Event()
        self.offering = threading.Event()  # set while tasks are offered; cleared: only outcomes are read
        self.pending: list[dict[str, tuple[int, str]]] = [{} for _ in users]
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        self.offering.set()
        t0 = time.monotonic()
        for i, u in enumerate(self.users):
            th = threading.Thread(target=self._run, args=(i, u, t0 + self.tick * i / len(self.users)),
                                  name=f"fleet-user-{i}", daemon=True)
            th.start()
            self.threads.append(th)

    def stop_offering(self) -> None:
        self.offering.clear()

    def unresolved(self) -> int:
        return sum(len(p) for p in self.pending)

    def drain(self, timeout: float) -> int:
        """Stop offering, wait until every task resolved (or `timeout`); the unresolved count."""
        self.stop_offering()
        deadline = time.monotonic() + timeout
        while self.unresolved() and time.monotonic() < deadline:
            time.sleep(0.5)
        self.stop.set()
        for th in self.threads:
            th.join(30)
        return self.unresolved()

    def _run(self, i: int, user: User, start: float) -> None:
        rng = random.Random(1000 + i)
        per_user = self.rate / len(self.users)
        offered = 0
        offered_since = None
        k = 0
        while not self.stop.is_set():
            wake = start + k * self.tick
            k += 1
            if self.stop.wait(max(0.0, wake - time.monotonic())):
                break
            if self.offering.is_set():
                now = time.monotonic()
                if offered_since is None:
                    offered_since = now - self.tick
                due = int(per_user * (now - offered_since)) - offered
                if due > 0:
                    self._submit(i, user, rng, offered, due)
                    offered += due
            else:
                offered_since = None
                offered = 0
            self._collect(i, user)

    def _submit(self, i: int, user: User, rng: random.Random, offered: int, n: int) -> None:
        from skyfn.submission import call_body

        tasks, meta = [], []
        for j in range(n):
            value = (i << 32) + offered + j
            ep = self.zipf.pick(rng)
            fid = user.fids[(offered + j) & 1]
            tasks.append({"function_id": fid, "endpoint_id": ep, **call_body((value,), {})})
            meta.append((value, ep))
        try:
            ids = user.client.submit_tasks(tasks)
        except Exception as exc:  # noqa: BLE001 - counted: the load keeps going
            with self.tally.lock:
                self.tally.rejected += n
            self.tally.why(exc)
            return
        with self.tally.lock:
            self.tally.submitted += n
            self.tally.owned.extend((i, tid) for tid in ids)
            for _, ep in meta:
                self.tally.per_endpoint[ep] = self.tally.per_endpoint.get(ep, 0) + 1
        pending = self.pending[i]
        for tid, m in zip(ids, meta):
            pending[tid] = m

    def _collect(self, i: int, user: User) -> None:
        from skyfn.outcomes import FINAL, task_outcome
        from skyfn.protocol.limits import MAX_STATUS_IDS

        pending = self.pending[i]
        ids = list(pending)
        for k in range(0, len(ids), MAX_STATUS_IDS):
            try:
                answer = user.client.status(ids[k:k + MAX_STATUS_IDS], wait=0.0)
            except Exception as exc:  # noqa: BLE001 - read again next tick
                self.tally.why(exc)
                return
            tasks = answer.get("tasks") or {}
            for tid in ids[k:k + MAX_STATUS_IDS]:
                st = tasks.get(tid)
                if st is None or st.get("state") not in FINAL:
                    continue
                value, _ = pending.pop(tid)
                ok, got = task_outcome(tid, st)
                with self.tally.lock:
                    if not ok:
                        self.tally.failed += 1
                    elif got == value:
                        self.tally.resolved += 1
                    else:
                        self.tally.wrong += 1
                if not ok:
                    self.tally.why(got)


def final_states(client, task_ids: list[str]) -> dict[str, int]:
    """The records of `task_ids` read back (peek) with their events: tasks unknown, and
    tasks holding more than one final state (a duplicate)."""
    from skyfn.protocol.limits import MAX_STATUS_IDS

    out = {"checked": 0, "unknown": 0, "more_than_one_final_state": 0}
    ask = list(task_ids)
    while ask:
        answer = client.status(ask[:MAX_STATUS_IDS], include_events=True, peek=True, results=False)
        ask = list(answer.get("later") or ()) + ask[MAX_STATUS_IDS:]  # read from the history in parts
        out["unknown"] += len(answer.get("unknown") or ())
        for st in (answer.get("tasks") or {}).values():
            out["checked"] += 1
            n = sum(1 for e in st.get("events") or () if e[0] in ("SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED"))
            out["more_than_one_final_state"] += n > 1
    return out


class Prober(threading.Thread):
    """A round trip to `endpoint_id` every `period` s from a Client of its own."""

    def __init__(self, user: User, endpoint_id: str, period: float, name: str):
        super().__init__(name=f"fleet-probe-{name}", daemon=True)
        self.user, self.endpoint_id, self.period = user, endpoint_id, period
        self.halt = threading.Event()
        self.rtts: list[float] = []
        self.errors: dict[str, int] = {}
        self.slow: list[tuple[float, float, str]] = []  # (rtt ms, seconds after t0, task id)
        self.t0: Optional[float] = None  # monotonic time offsets count from (default: the probing's start)

    def run(self) -> None:
        from skyfn import Client

        fid = self.user.fids[0]
        with Client(service_url=self.user.service_url, token=self.user.token) as own:
            k = 0
            t0 = self.t0 if self.t0 is not None else time.monotonic()
            while not self.halt.is_set():
                at = time.monotonic()
                try:
                    tid = own.run(fid, -1 - k, endpoint_id=self.endpoint_id)
                    got = own.get_result(tid, timeout=60)
                    if got == -1 - k:
                        rtt = (time.monotonic() - at) * 1000
                        self.rtts.append(rtt)
                        self.slow = sorted([*self.slow, (rtt, round(at - t0, 1), tid)], reverse=True)[:3]
                    else:
                        self.errors["wrong value"] = self.errors.get("wrong value", 0) + 1
                except Exception as exc:  # noqa: BLE001 - a failed probe is a data point
                    key = f"{type(exc).__name__}: {str(exc)[:100]}"
                    self.errors[key] = self.errors.get(key, 0) + 1
                k += 1
                self.halt.wait(max(0.0, at + self.period - time.monotonic()))

    def figures(self) -> dict[str, Any]:
        return {"p50_ms": _r(percentile(self.rtts, 0.5)), "p99_ms": _r(percentile(self.rtts, 0.99)),
                "n": len(self.rtts), "errors": self.errors, "slowest": self.slowest()}

    def slowest(self) -> list[dict]:
        """The slowest round trips: when (s into the probing) and the gaps between their
        task's events (where the time went: the service, the queue, the agent, the result)."""
        out = []
        for rtt, at, tid in self.slow:
            try:
                events = self.user.client.get_task(tid, peek=True).get("events") or []
                gaps = {f"{a[0]}->{b[0]}": round((b[1] - a[1]) * 1000, 1) for a, b in zip(events, events[1:])}
            except Exception as exc:  # noqa: BLE001 - reported, not fatal
                gaps = {"error": f"{type(exc).__name__}: {exc}"[:100]}
            out.append({"rtt_ms": round(rtt, 1), "at_s": at, "stages_ms": gaps})
        return out


def _r(x, nd=2):
    return None if x is None else round(x, nd)
