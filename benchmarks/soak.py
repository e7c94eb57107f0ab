"""Sustained load on the embedded runtime (issue 24): no-op tasks submitted at a held rate
for minutes, results read as they come, while the service's Redis is watched.

    python benchmarks/soak.py --json [--rate 5100] [--minutes 10] [--kill-redis-at SECONDS]
        [--result-ttl 60] [--history-batch N] [--backlog-max N] [--redis-maxmemory BYTES]
        [--workers N (default: one per core)] [--series samples.jsonl] [--env NAME=VALUE ...]

Starts a private embedded runtime (benchmarks/embedded.py: redis-server with its
append-only file, moto, the service process, the endpoint `local` with `--workers`
workers) and stops it at the end. Settings of the runtime under test go through the
environment the service reads (SKYFN_RESULT_TTL, SKYFN_HISTORY_BATCH, SKYFN_BACKLOG_MAX,
SKYFN_BACKLOG_MEMORY_FRACTION, SKYFN_REDIS_MAXMEMORY, ... or any `--env NAME=VALUE`), set
before the runtime starts: its processes inherit them.

The load: ONE skyfn Executor (results pushed over the WebSocket API: every connection of a
user gets all of that user's pushes, so a second executor would decode every result twice),
fed by this process's main thread in chunks every `--tick` s (500 tasks per 0.1 s at 5,000
tasks/s), each chunk sized so the offered count follows rate x elapsed. Each future gets a
done callback that checks its value (noop(i) == i), marks index i done (a second
resolution of the same index is a duplicate) and keeps a 64-bit hash of its task id (the
same id completing for two submissions is a duplicate); the future is not kept. The
offering pauses while the executor holds more than `--max-unsent` tasks it could not send
yet (the service refusing: 429) or more than `--max-pending` accepted and unfinished, so
client memory stays bounded; what the pause skipped shows as the achieved rate.

The probe: one more task every second from its own Client (POST /tasks, then the
long-poll of POST /tasks/status; not the executor, whose queue would add its own waits),
its round trip (and the POST's part of it) recorded with its time offset; a probe that
takes longer than a second delays the next to the following whole second.

The sampler (a thread, every `--sample` s, a few milliseconds each): Redis INFO (used
memory, expired and evicted keys, keys with an expiry), LLEN outbox, DBSIZE, the counter
stats:archived when the service keeps one; tasks offered, accepted and completed so far;
HTTP statuses the SDK received (urllib3's own debug record of every response, read by a
logging handler: the SDK's transport retries 429 and 5xx itself and counts nothing); RSS
and CPU seconds of the runtime's process trees (service with its Lambda environments,
agent with manager and workers, redis, moto) and of this client.

With `--kill-redis-at S`: S seconds into the run redis-server (the pid the runtime
recorded) gets SIGKILL; nothing in the runtime restarts it, so after `--redis-outage`
seconds it is restarted on its port and directory (infra/local/recover.py: it replays its
append-only file), as an operator would. The service, the agent and the SDK reconnect
on their own. Tasks that completed from 2 s before the kill to 10 s after the restart are
read back (peek, 11 s after the restart, before they expire) to check each holds one final
state.

Records leave Redis result_ttl after their result was read (SKYFN_RESULT_TTL, 600 s by
default): retire_over_submit reaches 1 only once the window of its measure starts later
than that, hence `--result-ttl 60` for a 10-minute run (`make soak`).

The JSON (last line with --json):
- `rate_target`, `submit_tasks_per_s` (accepted by the service over the submission
  window), `submit_tasks_per_s_by_minute`, `tasks_offered`, `tasks_submitted` (accepted),
  `tasks_completed` (right value), `tasks_failed`, `rejected` (submissions the SDK gave up
  on), `wrong_results`, `duplicates`, `lost` (accepted, not completed after the drain wait,
  or unknown to the service) with `lost_detail`;
- `retire_over_submit`: over the last 5 minutes (the last half of a shorter run),
  (tasks accepted - growth of DBSIZE) / tasks accepted: task records that left Redis per
  task submitted, with records present counted by DBSIZE (every key; the other keys, one
  idempotency key per request and a few per user, stay about constant);
  `retire_over_submit_expired`: INFO expired_keys (+ evicted_keys) over the same window per
  task accepted, and `archived_over_submit` from stats:archived when present;
- `redis_used_mb_minute3` (3 minutes in, or 30 % into a shorter run), `redis_used_mb_end`
  (end of the submission window), `redis_used_mb_end_over_minute3`, `redis_used_mb_max`,
  `redis_used_mb_after_drain`; `redis_bytes_per_task`: (used_memory - its value before the
  load) / (DBSIZE - its value before the load) at the sample with the most keys;
  `redis_memory_by_prefix` at the end of the window (one SCAN: keys per prefix, MiB from
  MEMORY USAGE of a sample of each: t task records, idem idempotency answers, recent, done);
- `p99_rtt_ms` (all probes), `p99_rtt_ms_by_minute`, `p50_rtt_ms_by_minute`,
  `p99_rtt_flat_ratio` (max over the minutes of the per-minute p99 / the first minute's),
  `p99_rtt_max_over_min` (the same over the lowest minute's);
- `http_429`, `http_status` (non-2xx statuses by method and path), `outbox_max` (LLEN
  every 0.5 s), `outbox_end` (after the drain wait), `dbsize_max`, `rss_mb_max` per
  process tree, `client_cpu_percent` (this process, of one core, during the submission window) and
  `client_cpu_s_by_thread`; `runtime_cpu_s` per process tree;
- `redis_kill` (with --kill-redis-at): killed_at_s, restarted_at_s, pids, outage_s,
  `nothing_lost`, `exactly_once`, `outbox_drained`, records checked and their final states,
  `probes_around_kill` ([offset s, round trip ms, POST ms]).

The runtime's SKYFN_HOME (its append-only file: gigabytes after millions of tasks) is
removed at the end unless `--keep-home`.
"""
from __future__ import annotations

import argparse
import json
import math
import logging
import os
import resource
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/soak.py`
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402


def noop(x):
    return x


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _r(x, nd=3):
    return None if x is None else round(x, nd)


# -- HTTP statuses the SDK received ------------------------------------------------------

class HttpStatuses(logging.Handler):
    """Counts every non-2xx HTTP answer the SDK's transport receives, from urllib3's own
    debug record of each response ('%s://%s:%s "%s %s %s" %s %s': scheme, host, port, method,
    url, version, status, length). The SDK retries 429 and 5xx inside HttpClient.request and
    counts nothing, and this reads them without wrapping any of its objects."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.counts: dict[str, int] = {}
        self.n429 = 0
        self.responses = 0
        self.task_posts = 0  # POST /tasks answered 2xx: one idempotency key each in Redis

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if not isinstance(args, tuple) or len(args) != 8:
            return
        self.responses += 1
        try:
            status = int(args[6])
        except (TypeError, ValueError):
            return
        path = str(args[4]).split("?")[0]
        if status < 400:
            if path == "/tasks" and args[3] == "POST":
                self.task_posts += 1
            return
        if path.startswith("/tasks/") and path != "/tasks/status":
            path = "/tasks/{id}"
        key = f"{status} {args[3]} {path}"
        self.counts[key] = self.counts.get(key, 0) + 1
        if status == 429:
            self.n429 += 1

    @classmethod
    def install(cls) -> "HttpStatuses":
        handler = cls()
        logger = logging.getLogger("urllib3.connectionpool")
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False  # counted here, printed nowhere
        return handler


# -- what the futures became -------------------------------------------------------------

class Tally:
    """Done callbacks of the load's futures (the executor's thread runs them). Nothing of a
    future is kept but a byte for its index and a 64-bit hash of its task id."""

    def __init__(self, expected: int):
        self.lock = threading.Lock()
        self.done_index = bytearray(expected)
        self.id_hashes = array("q")
        self.completed = 0
        self.failed = 0
        self.not_found = 0
        self.rejected = 0  # the SDK gave up submitting (no task id)
        self.wrong = 0
        self.twice = 0
        self.failures: dict[str, int] = {}
        self.window: tuple[float, float] | None = None  # monotonic times: keep ids completing inside
        self.window_ids: list[str] = []

    def grow(self, n: int) -> None:
        if n > len(self.done_index):
            self.done_index.extend(bytes(n - len(self.done_index) + (1 << 16)))

    def done(self, fut) -> None:
        i = fut.soak_i
        tid = fut.task_id
        exc = fut.exception() if not fut.cancelled() else RuntimeError("cancelled")
        with self.lock:
            if self.done_index[i]:
                self.twice += 1
            self.done_index[i] = 1
            if exc is None:
                if fut.result() == i:
                    self.completed += 1
                else:
                    self.wrong += 1
                self.id_hashes.append(hash(tid))
                w = self.window
                if w is not None and w[0] <= time.monotonic() <= w[1] and len(self.window_ids) < 100_000:
                    self.window_ids.append(tid)
            elif tid is None:
                self.rejected += 1
                self._why(exc)
            elif type(exc).__name__ == "TaskNotFound":
                self.not_found += 1
            else:
                self.failed += 1
                self._why(exc)

    def _why(self, exc: BaseException) -> None:
        key = f"{type(exc).__name__}: {str(exc)[:120]}"
        self.failures[key] = self.failures.get(key, 0) + 1

    def reused_ids(self) -> int:
        """Task ids (hashes) completed for more than one submission."""
        try:
            import numpy as np

            h = np.frombuffer(self.id_hashes, dtype=np.int64)
            return int(h.size - np.unique(h).size)
        except ImportError:
            return len(self.id_hashes) - len(set(self.id_hashes))


def executor_queues(ex) -> tuple[int, int]:
    """(unsent: queued or in a POST not answered yet, pending: accepted and unfinished) of
    the executor. Read from its state (no public counter exists; read only, under its lock)."""
    st = ex._state
    with st.cv:
        return len(st.queue) + len(st.inflight), len(st.outstanding)


# -- the runtime's processes -------------------------------------------------------------

def process_trees(home: Path) -> dict[str, int]:
    from infra.local import agent
    from infra.local.processes import recorded_process
    from infra.local.state import StateDir

    state = StateDir.at(home)
    pids = {}
    for name in ("service", "redis", "moto"):
        proc = recorded_process(state.pidfile(name))
        if proc is not None:
            pids[name] = proc.pid
    proc = recorded_process(agent.pidfile(home, "local"))
    if proc is not None:
        pids["agent"] = proc.pid
    return pids


def tree_usage(pids: dict[str, int]) -> dict[str, tuple[float, float]]:
    """(RSS MiB, CPU seconds) of each tree: the process and its children."""
    import psutil

    out = {}
    for name, pid in pids.items():
        rss = cpu = 0.0
        try:
            root = psutil.Process(pid)
            members = [root, *root.children(recursive=True)]
        except psutil.Error:
            members = []
        for p in members:
            try:
                with p.oneshot():
                    rss += p.memory_info().rss
                    t = p.cpu_times()
                    cpu += t.user + t.system
            except psutil.Error:
                pass
        out[name] = (rss / 2**20, cpu)
    return out


def client_cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads, by thread name (the executor's, the push's,
    the sampler's, ...), from /proc through psutil."""
    import psutil

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for t in psutil.Process().threads():
        name = names.get(t.id, "other")
        out[name] = out.get(name, 0.0) + t.user_time + t.system_time
    return out


# -- the soak ----------------------------------------------------------------------------

class Soak:
    def __init__(self, args, home: Path):
        self.args = args
        self.home = home
        self.stop = threading.Event()  # the load window is over: probe and killer end
        self.sampling_done = threading.Event()
        self.t0 = 0.0
        self.samples: list[dict] = []
        self.probes: list[tuple[float, float | None, float | None]] = []  # (offset s, rtt ms or None, POST ms)
        self.probe_errors: dict[str, int] = {}
        self.probe_ids: list[str | None] = []  # the task of each probe, for the stages of the slowest
        self.offered = 0
        self.held_back = 0
        self.kill: dict = {}
        self.phase = "warm-up"
        self.outbox_peak = 0
        self.pids: dict[str, int] = {}
        self.series = open(args.series, "w") if args.series else None

    # -- redis ----------------------------------------------------------------------
    def redis(self):
        import redis

        from infra.local.state import StateDir

        url = StateDir.at(self.home).read_runtime()["redis_url"]
        return redis.Redis.from_url(url, socket_timeout=3, socket_connect_timeout=2)

    def read_redis(self, r) -> dict:
        try:
            pipe = r.pipeline(transaction=False)
            pipe.info("memory")
            pipe.info("stats")
            pipe.info("keyspace")
            pipe.llen("outbox")
            pipe.dbsize()
            pipe.get("stats:archived")
            pipe.info("persistence")
            pipe.xlen("results")
            mem, stats, keyspace, outbox, dbsize, archived, persistence, results = pipe.execute()
        except Exception as exc:  # noqa: BLE001 - redis down (killed on purpose): a gap in the series
            return {"redis_error": f"{type(exc).__name__}: {str(exc)[:80]}"}
        db0 = keyspace.get("db0") or {}
        return {"used_memory": mem.get("used_memory"), "maxmemory": mem.get("maxmemory"),
                "expired_keys": stats.get("expired_keys"), "evicted_keys": stats.get("evicted_keys"),
                "expires": db0.get("expires", 0) if isinstance(db0, dict) else None,
                "outbox": outbox, "dbsize": dbsize, "archived": int(archived) if archived is not None else None,
                # the append-only file's rewrites (forks) and fsyncs Redis had to wait for
                "total_forks": stats.get("total_forks"), "latest_fork_usec": stats.get("latest_fork_usec"),
                "aof_delayed_fsync": persistence.get("aof_delayed_fsync"),
                "aof_rewrite_in_progress": persistence.get("aof_rewrite_in_progress"),
                "results_stream": results}  # result packs the agent sent that the service has not yet applied

    @staticmethod
    def memory_by_prefix(r, per_prefix: int = 200) -> dict:
        """Where Redis's memory is, once (a SCAN of every key): keys per prefix (t, idem,
        recent, done, outbox, ...) and their MiB estimated from MEMORY USAGE of up to
        `per_prefix` of them."""
        import random

        keys: dict[str, list] = {}
        counts: dict[str, int] = {}
        rng = random.Random(0)
        for key in r.scan_iter(count=10_000):
            prefix = key.split(b":", 1)[0].decode(errors="replace")
            n = counts[prefix] = counts.get(prefix, 0) + 1
            kept = keys.setdefault(prefix, [])
            if len(kept) < per_prefix:  # a uniform sample of each prefix's keys
                kept.append(key)
            elif (j := rng.randrange(n)) < per_prefix:
                kept[j] = key
        out = {}
        for prefix, kept in keys.items():
            pipe = r.pipeline(transaction=False)
            for key in kept:
                pipe.memory_usage(key, samples=0)
            sizes = [v or 0 for v in pipe.execute()]
            mean = sum(sizes) / len(sizes)
            out[prefix] = {"keys": counts[prefix], "mb": round(mean * counts[prefix] / 2**20, 2),
                           "bytes_per_key": round(mean)}
        return dict(sorted(out.items(), key=lambda kv: -kv[1]["mb"]))

    # -- sampler ----------------------------------------------------------------------
    def sampler(self, ex, http: HttpStatuses, tally: Tally) -> None:
        r = self.redis()
        period = self.args.sample
        k = 0
        while True:
            self.sample(r, ex, http, tally)
            k += 1
            # between samples: the outbox's length every 0.5 s (one LLEN), for its peak
            while not self.sampling_done.wait(max(0.0, min(0.5, self.t0 + k * period - time.monotonic()))):
                if time.monotonic() >= self.t0 + k * period:
                    break
                try:
                    self.outbox_peak = max(self.outbox_peak, r.llen("outbox"))
                except Exception:  # noqa: BLE001 - redis down: the full sample says so
                    pass
            if self.sampling_done.is_set():
                break

    def sample(self, r, ex, http: HttpStatuses, tally: Tally) -> dict:
        now = time.monotonic()
        unsent, pending = executor_queues(ex)
        if not self.pids or now - self._pids_at > 10:  # restarted processes get new pids
            self.pids, self._pids_at = process_trees(self.home), now
        usage = tree_usage(self.pids)
        with tally.lock:
            completed, failed, rejected = tally.completed, tally.failed + tally.not_found + tally.wrong, tally.rejected
        s = {"t": round(now - self.t0, 2), "phase": self.phase, "offered": self.offered,
             "accepted": self.offered - unsent - rejected, "unsent": unsent, "pending": pending,
             "completed": completed, "failed": failed, "rejected": rejected, "http_429": http.n429,
             "probes": len(self.probes), "task_posts": http.task_posts,
             **self.read_redis(r),
             "rss_mb": {n: round(v[0], 1) for n, v in usage.items()},
             "cpu_s": {n: round(v[1], 2) for n, v in usage.items()},
             "client_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
             "client_cpu_s": round(client_cpu(), 2)}
        self.samples.append(s)
        if self.series:
            self.series.write(json.dumps(s) + "\n")
            self.series.flush()
        if self.args.verbose:
            print(f"t={s['t']:7.1f} {s['phase']:7} accepted={s['accepted']:>9} done={completed:>9} "
                  f"unsent={unsent:>6} pending={pending:>7} outbox={s.get('outbox')} dbsize={s.get('dbsize')} "
                  f"used={(s.get('used_memory') or 0) / 2**20:.0f}MiB 429={http.n429}", file=sys.stderr, flush=True)
        return s

    _pids_at = 0.0

    # -- probe ------------------------------------------------------------------------
    def slowest_probe_stages(self, window_s: float, n: int = 8) -> list[dict]:
        """Where the slowest probes of the window spent their time: the gaps between their
        events (from the hot store, or from the durable history once they left it)."""
        from skyfn import Client

        ranked = sorted((p[1], p[0], tid) for p, tid in zip(self.probes, self.probe_ids)
                        if p[1] is not None and tid and p[0] < window_s)[-n:]
        out = []
        with Client() as c:
            for rtt, off, tid in reversed(ranked):
                try:
                    events = c.get_task(tid, peek=True).get("events") or []
                except Exception as exc:  # noqa: BLE001 - reported, not fatal
                    out.append({"at_s": off, "rtt_ms": rtt, "error": f"{type(exc).__name__}: {exc}"[:120]})
                    continue
                gaps = {f"{a[0]}->{b[0]}": _r((b[1] - a[1]) * 1000) for a, b in zip(events, events[1:])}
                out.append({"at_s": off, "rtt_ms": rtt, "stages_ms": gaps})
        return out

    def prober(self, fid: str, endpoint_id: str) -> None:
        from skyfn import Client

        with Client() as c:
            k = 0
            while not self.stop.is_set():
                at = time.monotonic()
                rtt = posted = tid = None
                try:
                    tid = c.run(fid, -1 - k, endpoint_id=endpoint_id)
                    posted = (time.monotonic() - at) * 1000
                    value = c.get_result(tid, timeout=60)
                    rtt = (time.monotonic() - at) * 1000 if value == -1 - k else None
                except Exception as exc:  # noqa: BLE001 - a failed probe is a data point
                    key = f"{type(exc).__name__}: {str(exc)[:100]}"
                    self.probe_errors[key] = self.probe_errors.get(key, 0) + 1
                self.probes.append((round(at - self.t0, 3), _r(rtt), _r(posted)))
                self.probe_ids.append(tid)
                k += 1
                nxt = self.t0 + (int((time.monotonic() - self.t0) / 1.0) + 1) * 1.0
                if self.stop.wait(max(0.0, nxt - time.monotonic())):
                    break

    # -- redis kill -------------------------------------------------------------------
    def killer(self, tally: Tally) -> None:
        import psutil

        from infra.local import recover
        from infra.local.processes import recorded_process
        from infra.local.state import StateDir

        if self.stop.wait(max(0.0, self.t0 + self.args.kill_redis_at - time.monotonic())):
            return
        proc = recorded_process(StateDir.at(self.home).pidfile("redis"))
        if proc is None:
            self.kill = {"error": "no redis-server recorded by the runtime"}
            return
        last = next((s for s in reversed(self.samples) if "outbox" in s), {})
        tally.window = (time.monotonic() - 2.0, float("inf"))
        killed = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        psutil.wait_procs([proc], timeout=10)
        time.sleep(self.args.redis_outage)
        try:
            new_pid = recover.redis(self.home)
            error = None
        except Exception as exc:  # noqa: BLE001 - reported
            new_pid, error = None, f"{type(exc).__name__}: {exc}"
        restarted = time.monotonic()
        self.kill = {"killed_at_s": round(killed - self.t0, 2), "restarted_at_s": round(restarted - self.t0, 2),
                     "outage_s": round(restarted - killed, 2), "pid": proc.pid, "new_pid": new_pid,
                     "restart_error": error, "outbox_before": last.get("outbox"),
                     "used_mb_before": _r((last.get("used_memory") or 0) / 2**20, 1)}
        tally.window = (tally.window[0], restarted + 10.0)
        # read back the records of the tasks that completed around the kill while they are
        # still in Redis (they expire result_ttl after they were read)
        time.sleep(max(0.0, restarted + 11.0 - time.monotonic()))
        try:
            self.kill["records_around_kill"] = self.check_window(tally)
        except Exception as exc:  # noqa: BLE001 - reported
            self.kill["records_around_kill"] = {"error": f"{type(exc).__name__}: {exc}"}

    def check_window(self, tally: Tally) -> dict:
        """Final states held by the records of the tasks that completed around the kill."""
        from skyfn import Client
        from skyfn.protocol.limits import MAX_STATUS_IDS

        ids = list(tally.window_ids)
        finals = {"checked": 0, "unknown": 0, "more_than_one_final_state": 0, "states": {}}
        step = min(MAX_STATUS_IDS, 5000)
        with Client() as c:
            for k in range(0, len(ids), step):
                answer = c.status(ids[k:k + step], include_events=True, peek=True, results=False)
                finals["unknown"] += len(answer.get("unknown") or ())
                for st in (answer.get("tasks") or {}).values():
                    finals["checked"] += 1
                    finals["states"][st.get("state")] = finals["states"].get(st.get("state"), 0) + 1
                    n = sum(1 for e in st.get("events") or () if e[0] in ("SUCCEEDED", "FAILED", "TIMED_OUT",
                                                                           "CANCELLED"))
                    finals["more_than_one_final_state"] += n > 1
        return finals

    # -- the run ----------------------------------------------------------------------
    def run(self) -> dict:
        from skyfn import Client, Executor

        args = self.args
        http = HttpStatuses.install()
        duration = args.minutes * 60.0
        tally = Tally(int(args.rate * duration * 1.05) + 10_000)
        client = Client()
        endpoint_id = client.endpoint_id("local")
        fid = client.register_function(noop)
        ex = Executor(endpoint_id=endpoint_id, client=client, batch_size=args.batch_size, data_store=None, push=True)
        for i in range(200):  # warm: connections, workers, the push subscription
            ex.submit(fid, -10_000 - i).result(timeout=60)
        r = self.redis()
        self.t0 = time.monotonic()
        self.sample(r, ex, http, tally)  # the baseline, before the load
        self.phase = "load"
        threads = [threading.Thread(target=self.sampler, args=(ex, http, tally), name="soak-sampler", daemon=True),
                   threading.Thread(target=self.prober, args=(fid, endpoint_id), name="soak-probe", daemon=True)]
        if args.kill_redis_at is not None:
            threads.append(threading.Thread(target=self.killer, args=(tally,), name="soak-killer", daemon=True))
        self.t0 = time.monotonic()
        cpu0, threads0 = client_cpu(), thread_cpu()
        for t in threads:
            t.start()
        submit = ex.submit
        done = tally.done
        max_chunk = int(args.rate)  # at most one second's worth at once when catching up
        tick = args.tick
        total = int(args.rate * duration)
        k = 0
        while True:
            elapsed = time.monotonic() - self.t0
            if elapsed >= duration:
                break
            # the schedule: rate x elapsed, one tick ahead; what was held back is not caught up
            n = min(min(int(args.rate * (elapsed + tick)), total) - self.offered - self.held_back, max_chunk)
            if n > 0:
                unsent, pending = executor_queues(ex)
                if unsent > args.max_unsent or pending > args.max_pending:
                    self.held_back += n
                else:
                    start = self.offered
                    tally.grow(start + n)
                    for i in range(start, start + n):
                        fut = submit(fid, i)
                        fut.soak_i = i
                        fut.add_done_callback(done)
                    self.offered += n
            k += 1
            time.sleep(max(0.0, self.t0 + k * tick - time.monotonic()))
        window_s = time.monotonic() - self.t0
        cpu_load = client_cpu() - cpu0
        threads1 = thread_cpu()
        self.thread_cpu = {n: round(v - threads0.get(n, 0.0), 2) for n, v in threads1.items()}
        self.phase = "end"
        end_sample = self.sample(r, ex, http, tally)
        try:
            self.memory = self.memory_by_prefix(r)
        except Exception as exc:  # noqa: BLE001 - reported
            self.memory = {"error": f"{type(exc).__name__}: {exc}"}
        self.phase = "drain"
        self.stop.set()  # the probe and the killer end; the sampler goes on through the drain
        for t in threads[1:]:
            t.join(120)  # the killer: until it read the records around the kill
        # the drain: every accepted task done, then the outbox empty
        drain_until = time.monotonic() + args.drain_timeout
        while time.monotonic() < drain_until:
            unsent, pending = executor_queues(ex)
            if unsent == 0 and pending == 0:
                break
            time.sleep(0.5)
        drained_tasks_s = time.monotonic() - self.t0 - window_s
        last_outbox = None
        while time.monotonic() < drain_until:
            s = self.read_redis(r)
            last_outbox = s.get("outbox")
            if last_outbox == 0:
                break
            time.sleep(1.0)
        self.sampling_done.set()
        threads[0].join(30)
        final = self.sample(r, ex, http, tally)
        unsent, pending = executor_queues(ex)
        ex.shutdown(wait=False, cancel_futures=False)
        if self.series:
            self.series.close()
        return self.report(tally, http, window_s, cpu_load, end_sample, final, unsent, pending, drained_tasks_s,
                           ex.push_stats)

    # -- the report -------------------------------------------------------------------
    def report(self, tally: Tally, http: HttpStatuses, window_s: float, cpu_load: float, end: dict, final: dict,
               unsent: int, pending: int, drained_tasks_s: float, push_stats: dict) -> dict:
        args = self.args
        samples = sorted(self.samples, key=lambda s: s["t"])
        base = samples[0]
        window = [s for s in samples if s["phase"] != "drain"]  # the baseline, the load, its end
        seen = [s for s in window if "dbsize" in s] or [base]  # redis answered (not while it was down)
        redis_end = seen[-1]

        def nearest(t: float, among: list[dict]) -> dict:
            return min(among, key=lambda s: abs(s["t"] - t))

        # accepted per minute (from the samples at minute boundaries, every `sample` s from t0)
        by_minute = []
        m = 0
        while m * 60 < window_s - 1:
            a, b = nearest(m * 60.0, window), nearest(min((m + 1) * 60.0, window_s), window)
            if b["t"] > a["t"]:
                by_minute.append(round((b["accepted"] - a["accepted"]) / (b["t"] - a["t"]), 1))
            m += 1
        accepted = tally.completed + tally.failed + tally.not_found + tally.wrong + pending
        accepted_in_window = end["accepted"] - base["accepted"]
        # retirement over the last 5 minutes (last half of a shorter run)
        span = min(300.0, window_s / 2)
        w0, w1 = nearest(window_s - span, seen), redis_end
        # tasks of the load and of the probe; records present: DBSIZE less one idempotency key per
        # POST /tasks (kept 24 h), the other keys (a few per user and endpoint) being constant
        submitted_w = w1["accepted"] - w0["accepted"] + w1["probes"] - w0["probes"]
        retire = retire_exp = archived = None
        if submitted_w > 0:
            growth = (w1["dbsize"] - w0["dbsize"]) - (w1["task_posts"] - w0["task_posts"])
            retire = (submitted_w - growth) / submitted_w
            gone = (w1["expired_keys"] - w0["expired_keys"]) + ((w1["evicted_keys"] or 0) - (w0["evicted_keys"] or 0))
            retire_exp = gone / submitted_w
            if w1.get("archived") is not None and w0.get("archived") is not None:
                archived = (w1["archived"] - w0["archived"]) / submitted_w
        m3 = nearest(min(180.0, 0.3 * window_s), seen)
        mb = 2**20
        used_m3, used_end = m3["used_memory"] / mb, redis_end["used_memory"] / mb
        top = max(seen, key=lambda s: s["dbsize"])
        per_task = None
        if top["dbsize"] - base.get("dbsize", 0) >= 100:
            per_task = (top["used_memory"] - base["used_memory"]) / (top["dbsize"] - base["dbsize"])
        # probes by minute
        rtts_by_minute: dict[int, list[float]] = {}
        probes = [p for p in self.probes if p[0] < window_s]  # not one started as the window closed
        whole_minutes = max(1, math.ceil(window_s / 60 - 0.01))  # a probe started at the very end is not a minute
        for off, rtt, _ in probes:
            if rtt is not None:
                rtts_by_minute.setdefault(min(int(off // 60), whole_minutes - 1), []).append(rtt)
        minutes = sorted(rtts_by_minute)
        p99_m = [_r(percentile(rtts_by_minute[m], 0.99)) for m in minutes]
        p50_m = [_r(statistics.median(rtts_by_minute[m])) for m in minutes]
        flat = (max(p99_m) / p99_m[0]) if p99_m and p99_m[0] else None
        spread = (max(p99_m) / min(p99_m)) if p99_m and min(p99_m) else None
        rtts = [rtt for _, rtt, _ in probes if rtt is not None]
        duplicates = tally.twice + tally.reused_ids()
        lost = pending + tally.not_found
        rss_max: dict[str, float] = {}
        for s in samples:
            for n, v in (s.get("rss_mb") or {}).items():
                rss_max[n] = max(rss_max.get(n, 0.0), v)
        cpu_used = {n: round(end["cpu_s"].get(n, 0) - base["cpu_s"].get(n, 0), 1) for n in end.get("cpu_s", {})
                    if n in base.get("cpu_s", {})}
        outboxes = [s["outbox"] for s in samples if s.get("outbox") is not None]
        out = {
            "benchmark": "soak", "rate_target": args.rate, "minutes": args.minutes, "workers": args.workers,
            "settings": self.settings,
            "window_s": round(window_s, 1),
            "submit_tasks_per_s": round(accepted_in_window / window_s, 1),
            "submit_tasks_per_s_by_minute": by_minute,
            "tasks_offered": self.offered, "held_back": self.held_back,
            "tasks_submitted": accepted, "tasks_completed": tally.completed, "tasks_failed": tally.failed,
            "failures": tally.failures, "rejected": tally.rejected, "wrong_results": tally.wrong,
            "duplicates": duplicates,
            "duplicates_detail": {"resolved_twice": tally.twice, "task_id_reused": duplicates - tally.twice},
            "lost": lost, "lost_detail": {"never_finished": pending, "unknown_to_the_service": tally.not_found,
                                          "never_sent": unsent},
            "drain_s": round(drained_tasks_s, 1),
            "retire_over_submit": _r(retire),
            "retire_method": "dbsize: (tasks accepted - growth of DBSIZE less idempotency keys) / tasks accepted",
            "retire_window_s": [w0["t"], w1["t"]],
            "retire_over_submit_expired": _r(retire_exp), "archived_over_submit": _r(archived),
            "redis_used_mb_minute3": _r(used_m3, 1), "minute3_at_s": m3["t"],
            "redis_used_mb_end": _r(used_end, 1),
            "redis_used_mb_end_over_minute3": _r(used_end / used_m3) if used_end and used_m3 else None,
            "redis_used_mb_max": _r(max(s["used_memory"] for s in seen) / mb, 1),
            "redis_used_mb_after_drain": _r(final["used_memory"] / mb, 1) if "used_memory" in final else None,
            "redis_maxmemory_mb": _r((redis_end.get("maxmemory") or 0) / mb, 1),
            "redis_memory_by_prefix": self.memory,
            "redis_bytes_per_task": _r(per_task, 1),
            "redis_bytes_per_task_method":
                "(used_memory - before) / (DBSIZE - before) at the sample with the most keys",
            "dbsize_max": top["dbsize"], "dbsize_end": redis_end["dbsize"], "dbsize_after_drain": final.get("dbsize"),
            "p99_rtt_ms": _r(percentile(rtts, 0.99)), "p50_rtt_ms": _r(percentile(rtts, 0.5)),
            "p99_rtt_ms_by_minute": p99_m, "p50_rtt_ms_by_minute": p50_m, "p99_rtt_flat_ratio": _r(flat),
            "p99_rtt_max_over_min": _r(spread),
            "probes": len(probes), "probe_failures": sum(1 for _, r, _ in probes if r is None),
            "probe_errors": self.probe_errors,
            "slowest_probes": self.slowest_probe_stages(window_s),
            "http_429": http.n429, "http_status": http.counts, "http_responses": http.responses,
            "outbox_max": max([self.outbox_peak, *outboxes]) if outboxes else None, "outbox_end": final.get("outbox"),
            "rss_mb_max": rss_max, "runtime_cpu_s": cpu_used,
            "client_cpu_percent": round(100 * cpu_load / window_s, 1),
            "client_cpu_us_per_task": round(1e6 * cpu_load / max(1, accepted_in_window), 1),
            "client_rss_mb_max": final.get("client_rss_mb"), "client_cpu_s_by_thread": self.thread_cpu,
            "push_stats": push_stats, "samples": len(self.samples),
        }
        if args.kill_redis_at is not None:
            k = dict(self.kill)
            k["outbox_after_drain"] = final.get("outbox")
            k["nothing_lost"] = lost == 0 and unsent == 0 and accepted == tally.completed
            if "killed_at_s" in k:  # (offset s, round trip ms, of which POST /tasks ms)
                k["probes_around_kill"] = [p for p in self.probes
                                           if k["killed_at_s"] - 2 <= p[0] <= k["restarted_at_s"] + 10]
            checked = k.get("records_around_kill") or {}
            k["exactly_once"] = duplicates == 0 and tally.wrong == 0 and checked.get("more_than_one_final_state") == 0
            k["outbox_drained"] = final.get("outbox") is not None and final["outbox"] <= args.outbox_drained
            out["redis_kill"] = k
        return out


ENV_OPTIONS = {"result_ttl": "SKYFN_RESULT_TTL", "unretrieved_ttl": "SKYFN_UNRETRIEVED_TTL",
               "history_batch": "SKYFN_HISTORY_BATCH", "backlog_max": "SKYFN_BACKLOG_MAX",
               "backlog_memory_fraction": "SKYFN_BACKLOG_MEMORY_FRACTION", "redis_maxmemory": "SKYFN_REDIS_MAXMEMORY"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="skyfn sustained-load benchmark (issue 24)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    p.add_argument("--rate", type=float, default=5000.0, help="target tasks/s (default 5,000)")
    p.add_argument("--minutes", type=float, default=10.0, help="length of the submission window (may be fractional)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2,
                   help="workers of the endpoint (default: one per core; more only add to the tail)")
    p.add_argument("--kill-redis-at", type=float, default=None, metavar="SECONDS",
                   help="SIGKILL redis-server this many seconds into the run, restart it after --redis-outage")
    p.add_argument("--redis-outage", type=float, default=1.0, help="seconds redis stays down (default 1)")
    p.add_argument("--result-ttl", help="SKYFN_RESULT_TTL of the runtime (s)")
    p.add_argument("--unretrieved-ttl", help="SKYFN_UNRETRIEVED_TTL of the runtime (s)")
    p.add_argument("--history-batch", help="SKYFN_HISTORY_BATCH of the runtime")
    p.add_argument("--backlog-max", help="SKYFN_BACKLOG_MAX of the runtime (outbox entries)")
    p.add_argument("--backlog-memory-fraction", help="SKYFN_BACKLOG_MEMORY_FRACTION of the runtime")
    p.add_argument("--redis-maxmemory", help="SKYFN_REDIS_MAXMEMORY of the runtime (bytes)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="any other setting of the runtime")
    p.add_argument("--series", help="write every sample as a JSON line to this file")
    p.add_argument("--sample", type=float, default=5.0, help="seconds between samples (default 5)")
    p.add_argument("--tick", type=float, default=0.1, help="seconds between submitted chunks (default 0.1)")
    p.add_argument("--batch-size", type=int, default=1000, help="the executor's batch size (tasks per POST /tasks)")
    p.add_argument("--max-unsent", type=int, default=None,
                   help="pause offering while the executor holds more unsent tasks (default 5 s of the rate)")
    p.add_argument("--max-pending", type=int, default=None,
                   help="pause offering while more accepted tasks are unfinished (default 60 s of the rate)")
    p.add_argument("--drain-timeout", type=float, default=300.0,
                   help="after the window: wait this long for every task, then for the outbox to empty")
    p.add_argument("--outbox-drained", type=int, default=0, help="outbox length that counts as drained")
    p.add_argument("--verbose", action="store_true", help="print every sample to stderr")
    p.add_argument("--keep-home", action="store_true",
                   help="keep the runtime's SKYFN_HOME (logs, the append-only file) instead of removing it")
    args = p.parse_args(argv)
    args.max_unsent = args.max_unsent or int(max(2000, 5 * args.rate))
    args.max_pending = args.max_pending or int(max(10_000, 60 * args.rate))

    settings = {}
    for opt, name in ENV_OPTIONS.items():
        value = getattr(args, opt)
        if value is not None:
            settings[name] = str(value)
    for item in args.env:
        name, _, value = item.partition("=")
        settings[name] = value
    os.environ.update(settings)  # before the runtime starts: its processes inherit them

    from infra.local import runtime

    home = Path(tempfile.mkdtemp(prefix="skyfn-soak-"))
    cfg = home / "endpoints" / "local"
    cfg.mkdir(parents=True)
    (cfg / "config.yaml").write_text(yaml.safe_dump({"workers": args.workers, "log_level": "WARNING"}))
    os.environ["SKYFN_HOME"] = str(home)
    t = time.monotonic()
    runtime.up(home, detach=True, echo=lambda *_: None)
    startup = time.monotonic() - t
    soak = Soak(args, home)
    soak.settings = settings
    try:
        result = soak.run()
    finally:
        soak.stop.set()
        soak.sampling_done.set()
        runtime.down(home, echo=lambda *_: None)
        if args.keep_home:
            print(f"runtime home kept: {home}", file=sys.stderr)
        else:  # the append-only file of millions of tasks: gigabytes
            shutil.rmtree(home, ignore_errors=True)
    result["startup_s"] = round(startup, 1)
    print(f"soak: {result['tasks_submitted']} tasks accepted in {result['window_s']} s "
          f"({result['submit_tasks_per_s']}/s of {args.rate:.0f} target), completed {result['tasks_completed']}, "
          f"lost {result['lost']}, duplicates {result['duplicates']}, 429s {result['http_429']}")
    print(f"  per minute (tasks/s): {result['submit_tasks_per_s_by_minute']}")
    print(f"  retire/submit {result['retire_over_submit']} (expired-keys {result['retire_over_submit_expired']}), "
          f"redis used MiB m3 {result['redis_used_mb_minute3']} end {result['redis_used_mb_end']} "
          f"max {result['redis_used_mb_max']}, bytes/task {result['redis_bytes_per_task']}, "
          f"outbox max {result['outbox_max']} end {result['outbox_end']}")
    print(f"  probe p99 ms by minute {result['p99_rtt_ms_by_minute']} (flat ratio {result['p99_rtt_flat_ratio']}), "
          f"client CPU {result['client_cpu_percent']} % of a core")
    if "redis_kill" in result:
        print(f"  redis kill: {result['redis_kill']}")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
