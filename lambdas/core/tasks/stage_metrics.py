"""Per-stage latency metrics (Powertools Metrics, EMF; DESIGN.md 11): when the results
function stores a pack, the events of its tasks give each stage's latency (service, waiting,
queue, dispatch, run, return: the definitions of skyfn/report/analysis.py; "waiting" is a
task's wait for its inputs, WAITING -> the first QUEUED after it, and is taken out of
"service") and the end-to-end time; one mean per stage per pack is added as
``Stage<Name>Ms`` (and ``TaskTotalMs``), with ``TasksMeasured``. A stage no task of the pack
went through (no task waited for inputs) adds nothing. The CloudWatch dashboard of the
service stack graphs them.

Off when Powertools metrics are disabled (the embedded runtime's default): then nothing is
read, so the hot path pays nothing.
"""
from __future__ import annotations

import os
from typing import Any, Iterable

from skyfn.protocol.states import parse_events

STAGES = (("Service", "CREATED", "QUEUED"), ("Waiting", "WAITING", "RELEASED"), ("Queue", "QUEUED", "DISPATCHED"),
          ("Dispatch", "DISPATCHED", "RUNNING"), ("Run", "RUNNING", "DONE"), ("Return", "DONE", "STORED"))
FINAL = ("SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED")
FIRST = ("CREATED", "WAITING") + FINAL  # the first of these counts; of the others, the last


def enabled() -> bool:
    return os.environ.get("POWERTOOLS_METRICS_DISABLED", "").lower() not in ("true", "1")


def stage_means(event_texts: Iterable[str | None]) -> tuple[dict[str, float], int]:
    """(metric name -> mean ms over the tasks that have that stage, tasks measured)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    measured = 0
    for text in event_texts:
        stamps: dict[str, float] = {}
        for state, ts in parse_events(text):
            if state in FIRST and state in stamps:
                continue
            if state == "QUEUED" and "WAITING" in stamps:  # released: its inputs all succeeded
                stamps.setdefault("RELEASED", ts)
            stamps[state] = ts
        if not stamps:
            continue
        measured += 1
        spans = [(f"Stage{name}Ms", a, b) for name, a, b in STAGES]
        final = next((stamps[f] for f in FINAL if f in stamps), None)
        if final is not None:
            spans.append(("TaskTotalMs", "CREATED", "_final"))
            stamps["_final"] = final
        ms = {metric: (stamps[b] - stamps[a]) * 1000.0 for metric, a, b in spans
              if a in stamps and b in stamps and stamps[b] >= stamps[a]}
        if "StageWaitingMs" in ms and "StageServiceMs" in ms:  # the service's own time is what waiting leaves
            ms["StageServiceMs"] = max(0.0, ms["StageServiceMs"] - ms["StageWaitingMs"])
        for metric, value in ms.items():
            sums[metric] = sums.get(metric, 0.0) + value
            counts[metric] = counts.get(metric, 0) + 1
    return {m: sums[m] / counts[m] for m in sums}, measured


def record(metrics: Any, task_ids: list[str]) -> None:
    """Add the stage means of these (just stored) tasks to `metrics` (Powertools Metrics)."""
    if not task_ids or not enabled():
        return
    from aws_lambda_powertools.metrics import MetricUnit

    from lambdas.core import deps

    means, measured = stage_means(deps.task_fields().events(task_ids))
    for name, value in means.items():
        metrics.add_metric(name=name, unit=MetricUnit.Milliseconds, value=round(value, 3))
    metrics.add_metric(name="TasksMeasured", unit=MetricUnit.Count, value=measured)
