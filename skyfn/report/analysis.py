"""What the task events say (numbers only; plots.py draws them).

Per task, from its events (the last DISPATCHED/RUNNING/DONE of a retried task):

  service  = QUEUED - CREATED        (the API stored and queued it), less any waiting
  waiting  = RELEASED - WAITING      (a task with inputs waiting for them to succeed;
                                      RELEASED: the first QUEUED after WAITING)
  queue    = DISPATCHED - QUEUED     (waiting in the endpoint's queue)
  dispatch = RUNNING - DISPATCHED    (agent -> interchange -> manager -> worker)
  run      = DONE - RUNNING          (the function itself)
  return   = STORED - DONE           (result back through the results path)

Over the window (first CREATED .. last final event), in bins: completions per second,
the time-averaged number of tasks in flight (CREATED..final), running (RUNNING..DONE) and
waiting for their inputs (WAITING..RELEASED, or final when never released),
worker utilization (running / workers of the endpoints in the report, or the observed
peak when they do not say), and each endpoint's backlog (QUEUED..DISPATCHED).

Little's law, as Balsam's analytics check it: in the central half of the window (steady
state: ramp-up and drain left out), the mean number in flight L should equal the
completion rate lambda times the mean time in the system W of the tasks completing there;
the ratio L/(lambda W) near 1 says the events are consistent and the system was steady.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

import numpy as np

STAGES = ("service", "waiting", "queue", "dispatch", "run", "return")
FINAL = ("SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED")
_FIRST = ("CREATED", "WAITING") + FINAL  # the first of these counts; of the others, the last
_BOUNDS = {"service": ("CREATED", "QUEUED"), "waiting": ("WAITING", "RELEASED"), "queue": ("QUEUED", "DISPATCHED"),
           "dispatch": ("DISPATCHED", "RUNNING"), "run": ("RUNNING", "DONE"), "return": ("DONE", "STORED")}
NAN = float("nan")


def stamps(events: Iterable) -> dict[str, float]:
    """state -> time: the first CREATED, WAITING and final state, the last of the others;
    RELEASED: the first QUEUED after WAITING (its inputs all succeeded)."""
    out: dict[str, float] = {}
    for state, ts in events:
        ts = float(ts)
        if state in _FIRST and state in out:
            continue
        if state == "QUEUED" and "WAITING" in out:
            out.setdefault("RELEASED", ts)
        out[state] = ts
    for final in FINAL:
        if final in out:
            out.setdefault("STORED", out[final])
            out["FINAL"] = out[final]
            break
    return out


def _integral(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Time-averaged number of open intervals [start, end) in each bin between edges."""
    if starts.size == 0:
        return np.zeros(len(edges) - 1)
    lengths = ends - starts
    cum = np.array([np.clip(e - starts, 0.0, lengths).sum() for e in edges])
    return np.diff(cum) / np.diff(edges)


def analyse(tasks: list[dict[str, Any]], endpoints: list[dict[str, Any]], since: float,
            names: Optional[dict[str, str]] = None, bins: int = 60,
            now: Optional[float] = None) -> tuple[dict[str, Any], dict[str, Any]]:
    names = names or {}
    rows = []
    for t in tasks:
        st = stamps(t.get("events") or [])
        if "CREATED" not in st:
            st["CREATED"] = float(t.get("created") or 0.0)
        rows.append((t, st))
    states: dict[str, int] = {}
    for t, _ in rows:
        states[t.get("state") or "?"] = states.get(t.get("state") or "?", 0) + 1
    summary: dict[str, Any] = {"tasks": len(rows), "states": states, "since": since, "endpoints": {}}
    if not rows:
        summary["window"] = None
        return summary, {}
    created = np.array([st["CREATED"] for _, st in rows])
    final = np.array([st.get("FINAL", NAN) for _, st in rows])
    t0 = float(created.min())
    ends = final[~np.isnan(final)]
    t1 = float(max(ends.max() if ends.size else t0, t0 + 1e-3))
    if now is not None and np.isnan(final).any():
        t1 = max(t1, now)
    edges = np.linspace(t0, t1, bins + 1)
    width = float(edges[1] - edges[0])
    open_end = np.where(np.isnan(final), t1, final)

    stage = {s: np.array([st[b] - st[a] if a in st and b in st and st[b] >= st[a] else NAN
                          for _, st in rows]) for s, (a, b) in _BOUNDS.items()}
    waited = ~np.isnan(stage["waiting"])  # the service's own time is what waiting leaves of it
    stage["service"][waited] = np.maximum(0.0, stage["service"][waited] - stage["waiting"][waited])
    waiting_a = np.array([st.get("WAITING", NAN) for _, st in rows])
    waiting_b = np.array([st.get("RELEASED", st.get("FINAL", t1)) for _, st in rows])
    waits = ~np.isnan(waiting_a)
    running_a = np.array([st.get("RUNNING", NAN) for _, st in rows])
    running_b = np.array([st.get("DONE", st.get("FINAL", NAN)) for _, st in rows])
    ran = ~np.isnan(running_a) & ~np.isnan(running_b)

    completions = np.histogram(ends, bins=edges)[0] / width if ends.size else np.zeros(bins)
    in_flight = _integral(created, open_end, edges)
    running = _integral(running_a[ran], running_b[ran], edges)
    waiting = _integral(waiting_a[waits], np.maximum(waiting_a[waits], waiting_b[waits]), edges)
    workers = sum(int((e.get("metadata") or {}).get("workers") or 0) for e in endpoints
                  if any(t.get("endpoint_id") == e.get("endpoint_id") for t, _ in rows[:1000]))
    peak_running = float(running.max()) if running.size else 0.0
    capacity = workers or max(1.0, float(np.ceil(peak_running)))
    span = t1 - t0

    # Little's law in the steady middle of the window (the central half: ramp-up and drain
    # left out; over the whole window L = lambda W holds by construction and checks nothing)
    m0, m1 = t0 + span / 4, t1 - span / 4
    L = float(np.clip(np.minimum(open_end, m1) - np.maximum(created, m0), 0, None).sum() / (m1 - m0))
    done = ~np.isnan(final) & (final >= m0) & (final < m1)
    lam = float(done.sum() / (m1 - m0))
    W = float(np.mean(final[done] - created[done])) if done.any() else NAN
    summary["window"] = {"start": t0, "end": t1, "seconds": span, "bin_seconds": width}
    summary["throughput"] = {"mean_per_s": float(ends.size / span), "peak_per_s": float(completions.max())}
    summary["littles_law"] = {"window": [m0, m1], "L_mean_in_flight": L, "lambda_per_s": lam, "W_mean_s": W,
                              "lambda_W": lam * W if done.any() else NAN,
                              "ratio": L / (lam * W) if done.any() and lam * W > 0 else NAN}
    summary["utilization"] = {"workers": capacity, "workers_from": "endpoints" if workers else "observed peak",
                              "mean": float(running.mean() / capacity), "peak": float(running.max() / capacity)}
    summary["stages_ms"] = {s: _stats(v * 1000.0) for s, v in stage.items()}
    summary["waiting"] = {"tasks": int(waits.sum()), "peak": float(waiting.max()) if waiting.size else 0.0}
    backlog = {}
    by_endpoint: dict[str, list[int]] = {}
    for i, (t, _) in enumerate(rows):
        by_endpoint.setdefault(t.get("endpoint_id") or "-", []).append(i)
    for ep, idx in by_endpoint.items():
        ix = np.array(idx)
        q_a = np.array([rows[i][1].get("QUEUED", NAN) for i in idx])
        q_b = np.array([rows[i][1].get("DISPATCHED", rows[i][1].get("FINAL", t1)) for i in idx])
        ok = ~np.isnan(q_a)
        label = names.get(ep, ep)
        backlog[label] = _integral(q_a[ok], np.maximum(q_a[ok], q_b[ok]), edges)
        summary["endpoints"][label] = {
            "endpoint_id": ep, "tasks": len(idx),
            "stages_mean_ms": {s: _mean(stage[s][ix] * 1000.0) for s in STAGES},
            "peak_backlog": float(backlog[label].max()) if backlog[label].size else 0.0}
    centers = (edges[:-1] + edges[1:]) / 2 - t0
    series = {"t": centers, "completions_per_s": completions, "in_flight": in_flight, "running": running,
              "waiting": waiting,
              "utilization": running / capacity, "backlog": backlog,
              "stage_values_ms": {s: np.sort(v[~np.isnan(v)] * 1000.0) for s, v in stage.items()}}
    return summary, series


def _mean(values: np.ndarray) -> float:
    v = values[~np.isnan(values)]
    return float(v.mean()) if v.size else NAN


def _stats(values: np.ndarray) -> dict[str, float]:
    v = values[~np.isnan(values)]
    if not v.size:
        return {"n": 0, "mean": NAN, "p50": NAN, "p95": NAN, "p99": NAN}
    return {"n": int(v.size), "mean": float(v.mean()), "p50": float(np.percentile(v, 50)),
            "p95": float(np.percentile(v, 95)), "p99": float(np.percentile(v, 99))}
