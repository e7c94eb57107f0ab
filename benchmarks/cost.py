"""The AWS cost of one million no-op tasks on the deployment of infra/aws, from the price
table benchmarks/aws_prices.yaml (its date, region and sources are printed).

    python -m benchmarks.cost [--json] [--tasks N] [--prices FILE]

Scenarios: `single` (one task per POST /tasks), `batch` (1,000 tasks per POST /tasks,
packed into SQS messages by the service) and `fanout` (10,000-task batches through the
batch-fanout state machine: Distributed Map over S3 chunks). What is read from the code,
not restated: Lambda memory and architecture (infra/aws/config.py), tasks per SQS message
(skyfn.protocol.messages.PACK_MAX_TASKS / PACK_MAX_BYTES), messages per SQS request and
its byte limit (skyfn.protocol.queues.sqs), results per result message
(endpoint_agent.config result_batch) and flush period, results per Lambda batch
(RESULTS_BATCH_SIZE), the history drain's batch, drainers, memory and measured batch time
and a page's bytes per task (infra/aws/sizing.py), tasks per page
(lambdas/adapters/history_pages.py), tasks per fan-out chunk
(lambdas.core.runs.batches.CHUNK_TASKS) and the states of batch_fanout.asl.json. What is
assumed (no AWS account here: durations, sizes, poll counts) is in ASSUMPTIONS, printed
with the result. Fixed monthly costs (NAT gateway, Redis nodes, endpoints, NLB, Fargate,
the drainers' idle invocations) are reported apart; ElastiCache is also amortized per
task at a stated throughput.

The durable history (issue 24) is written in pages: one DynamoDB item per owner, second
of task ids and drain batch, its tasks zlib-compressed, so a task costs its share of a
page's write units instead of two (its item and the owner-index entry); Redis expires the
records, so the reaper no longer purges. `--json` also holds the archive's cost before
(`archive="items"`) and after (`"pages"`) per scenario.

The idle fleet (issue 39): what 1,000 and 10,000 endpoints that run no task cost a month,
by item (benchmarks/cost_idle.py); `--json` holds it under `idle_fleet`.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks import cost_idle
from benchmarks.aws_pricing import GB, HOURS_PER_MONTH, PRICES, lambda_cost, load_prices
from endpoint_agent.config import EndpointConfig
from infra.aws import sizing
from infra.aws.config import (ARCHITECTURE, AVAILABILITY_ZONES, FUNCTIONS, INTERFACE_ENDPOINTS, RESULTS_BATCH_SIZE,
                              DeployConfig)
from lambdas.adapters.history_pages import PAGE_TASKS
from lambdas.core.runs.batches import CHUNK_TASKS
from skyfn.protocol.messages import PACK_MAX_BYTES, PACK_MAX_TASKS
from skyfn.protocol.queues.sqs import BATCH_BYTES as SQS_BATCH_BYTES
from skyfn.protocol.queues.sqs import BATCH_SIZE as SQS_BATCH_SIZE
from stepfunctions.catalog import BATCH_FANOUT, STEPS

SQS_CHUNK = 64 * 1024          # SQS bills every 64 KiB of a request as one request


@dataclass(frozen=True)
class Assumptions:
    """What cannot be measured without an AWS account; every figure depends on these."""
    task_bytes: int = 300               # one no-op task in a TaskPack (ids, payload, metadata)
    function_bytes: int = 1_500         # the serialized function, once per pack
    result_bytes: int = 250             # one result in a ResultPack
    api_submit_ms: float = 20.0         # POST /tasks: fixed part ...
    api_submit_ms_per_task: float = 0.05  # ... plus per task (validation, Redis pipeline)
    api_status_ms: float = 10.0
    api_status_ms_per_task: float = 0.02
    status_wait_ms_single: float = 150.0  # a long-poll is billed while it waits for the result
    status_wait_ms_batch: float = 500.0
    status_polls_single: int = 1        # the long-poll returns when the one task is final
    status_polls_batch: int = 2         # cursor polls per request (partial, then the rest)
    result_send_ms: float = 5.0         # one SendMessageBatch of the agent's outbox (results arriving
                                        # meanwhile leave together in the next pack: group commit)
    results_ms: float = 15.0            # one results-Lambda invocation, plus ...
    results_ms_per_result: float = 0.03
    history_ms_per_flush: float = 300.0  # before issue 24: one flush of ITEMS_BATCH task items
    history_seconds_per_batch: float = sizing.SECONDS_PER_BATCH   # PLACEHOLDER: measured per 2,000-task batch
    history_page_bytes_per_task: float = sizing.PAGE_BYTES_PER_TASK  # PLACEHOLDER: compressed, in a page
    history_invocation_ms: float = 100.0  # a drainer's fixed part: start, an empty LPOP, the backlog metrics
    route_chunk_ms: float = 200.0       # fan-out step per chunk (S3 read, routing, enqueue)
    route_chunk_ms_per_task: float = 0.1
    batch_progress_ms: float = 50.0
    fanout_polls: int = 20              # BatchProgress checks per batch-fanout execution
    throughput_tasks_per_s: float = 1_000.0  # ElastiCache amortization and result packing
    response_bytes_per_task: int = 290  # API answers to the client (task id + result)


ASSUMPTIONS = Assumptions()
SCENARIOS = {"single": 1, "batch": 1_000, "fanout": 10_000}
ARCHIVES = ("items", "pages")
# The history path before issue 24: one item per task in <prefix>-tasks plus its owner-index
# entry (2 write units), flushes of 500 items once a minute by a 512 MB function.
ITEMS_WRITE_UNITS_PER_TASK = 2
ITEMS_BATCH = 500
ITEMS_MEMORY_MB = 512


def sqs_requests(message_sizes: list[int]) -> int:
    """Billed requests to send (or receive) these messages the way SqsQueue.send batches
    them: up to SQS_BATCH_SIZE messages and SQS_BATCH_BYTES per call, each 64 KiB of a
    call billed as one request."""
    billed, count, size = 0, 0, 0
    for m in message_sizes:
        if count and (count == SQS_BATCH_SIZE or size + m > SQS_BATCH_BYTES):
            billed += max(1, math.ceil(size / SQS_CHUNK))
            count, size = 0, 0
        count += 1
        size += m
    if count:
        billed += max(1, math.ceil(size / SQS_CHUNK))
    return billed


def task_packs(tasks: int, a: Assumptions) -> list[int]:
    """Sizes of the TaskPacks the service sends for `tasks` tasks of one function."""
    per_pack = max(1, min(PACK_MAX_TASKS, (PACK_MAX_BYTES - a.function_bytes) // a.task_bytes))
    full, rest = divmod(tasks, per_pack)
    sizes = [a.function_bytes + per_pack * a.task_bytes] * full
    return sizes + ([a.function_bytes + rest * a.task_bytes] if rest else [])


def fanout_transitions(chunks: int, polls: int) -> int:
    """State transitions of one batch-fanout execution, walking its ASL: every state
    entered counts, each Distributed Map child runs its item processor's happy path, the
    polling loop turns `polls` times before the Choice takes its first (COMPLETE) branch."""
    asl = json.loads(BATCH_FANOUT.path.read_text())
    states, name, count, turns = asl["States"], asl["StartAt"], 0, 0
    while name:
        state = states[name]
        count += 1
        if "ItemProcessor" in state:
            proc = state["ItemProcessor"]
            child, inner = 0, proc["StartAt"]
            while inner:
                child += 1
                inner = None if proc["States"][inner].get("End") else proc["States"][inner].get("Next")
            count += chunks * child
        if state["Type"] == "Choice":
            name = state["Default"] if turns < polls else state["Choices"][0]["Next"]
            turns += 1
        elif state.get("End") or state["Type"] in ("Succeed", "Fail"):
            name = None
        else:
            name = state["Next"]
    return count


def tasks_per_page(a: Assumptions = ASSUMPTIONS) -> int:
    """Tasks in one history page: a page holds one owner's tasks of one second of task ids
    (its bucket) taken in one drain batch, at most PAGE_TASKS; the scenarios are one owner
    submitting at `throughput_tasks_per_s`."""
    return max(1, min(PAGE_TASKS, sizing.HISTORY_BATCH, int(a.throughput_tasks_per_s * sizing.PAGE_BUCKET_S)))


def history_cost(total: int, requests: int, p: dict, a: Assumptions = ASSUMPTIONS,
            archive: str = "pages") -> tuple[float, float]:
    """(USD of the history function, DynamoDB write request units) to archive `total` tasks
    of `requests` submission records (one item, one unit each, either way).

    pages (issue 24): a task's share of its page's units (and of the page's marker); the
    drainers' billed time is the measured batch time per task plus each invocation's fixed
    part, DeployConfig.history_drainers invocations a minute while tasks arrive.
    items (before): two units per task (item + owner-index), one flush per ITEMS_BATCH."""
    if archive == "items":
        usd = lambda_cost(math.ceil(total / ITEMS_BATCH), a.history_ms_per_flush, ITEMS_MEMORY_MB, p)
        return usd, total * ITEMS_WRITE_UNITS_PER_TASK + requests
    if archive != "pages":
        raise ValueError(f"archive={archive!r}: one of {ARCHIVES}")
    minutes = math.ceil(total / a.throughput_tasks_per_s / sizing.SCHEDULE_PERIOD_S)
    invocations = DeployConfig().history_drainers * max(1, minutes)
    busy_ms = total * a.history_seconds_per_batch / sizing.HISTORY_BATCH * 1000 + invocations * a.history_invocation_ms
    usd = lambda_cost(invocations, busy_ms / invocations, FUNCTIONS["history"].memory_mb, p)
    units = total * sizing.write_units_per_task(tasks_per_page(a), a.history_page_bytes_per_task)
    return usd, units + requests


def scenario(total: int, per_request: int, prices: dict, a: Assumptions = ASSUMPTIONS,
             archive: str = "pages") -> dict[str, float]:
    """USD for `total` tasks submitted `per_request` at a time; one component per service.
    `archive`: the durable history as pages (now) or one item per task (before issue 24)."""
    p = prices["prices"]
    requests = math.ceil(total / per_request)
    single = per_request == 1
    fanout = per_request > CHUNK_TASKS
    polls = a.status_polls_single if single else a.status_polls_batch
    wait = a.status_wait_ms_single if single else a.status_wait_ms_batch
    api_calls = requests * (1 + polls)
    mem = {k: s.memory_mb for k, s in FUNCTIONS.items()}

    # The tasks' way out: packs per request (per chunk on the fan-out path).
    units = [CHUNK_TASKS] * (per_request // CHUNK_TASKS) + ([per_request % CHUNK_TASKS] if per_request % CHUNK_TASKS else []) \
        if fanout else [per_request]
    packs = [size for u in units for size in task_packs(u, a)]
    # Results: group commit -- a pack holds what finished while the previous send was in
    # flight (result_send_ms), at most result_batch.
    agent = EndpointConfig.model_fields
    flush_results = max(1, int(a.throughput_tasks_per_s * a.result_send_ms / 1000))
    per_result_pack = min(agent["result_batch"].default, flush_results if single else per_request)
    result_packs = math.ceil(total / per_result_pack)
    result_sizes = [per_result_pack * a.result_bytes] * result_packs
    results_invocations = math.ceil(result_packs / RESULTS_BATCH_SIZE)

    out: dict[str, float] = {}
    out["api_gateway"] = api_calls / 1e6 * p["api_gateway_rest_per_million"]
    submit_ms = a.api_submit_ms + a.api_submit_ms_per_task * (0 if fanout else per_request)
    status_ms = a.api_status_ms + a.api_status_ms_per_task * per_request / polls + wait
    out["lambda_api"] = (lambda_cost(requests, submit_ms, mem["api"], p)
                         + lambda_cost(requests * polls, status_ms, mem["api"], p))
    out["lambda_results"] = lambda_cost(results_invocations, a.results_ms + a.results_ms_per_result
                                        * per_result_pack * RESULTS_BATCH_SIZE, mem["results"], p)
    out["lambda_history"], history_writes = history_cost(total, requests, p, a, archive)

    send = requests * sqs_requests(packs)                       # service -> task queue, per request
    # The agent long-polls a backlog: up to 10 packs per receive, whichever request sent them.
    receive = sqs_requests(packs * requests)
    delete = math.ceil(len(packs) * requests / SQS_BATCH_SIZE)  # acks, after the results are sent
    results_send = sqs_requests(result_sizes)                   # agent -> results queue
    results_receive = sqs_requests(result_sizes)                # the event source's polls
    results_delete = results_invocations
    sqs_total = send + receive + delete + results_send + results_receive + results_delete
    out["sqs"] = sqs_total / 1e6 * p["sqs_standard_per_million_requests"]

    out["dynamodb"] = history_writes / 1e6 * p["dynamodb_on_demand_per_million_writes"]

    node_hours = (1 + DeployConfig.redis_replicas) * total / a.throughput_tasks_per_s / 3600
    out["elasticache"] = node_hours * p["elasticache_node_hour"][DeployConfig.redis_node_type]

    out["step_functions"] = 0.0
    out["s3"] = 0.0
    if fanout:
        chunks = len(units)
        out["step_functions"] = requests * fanout_transitions(chunks, a.fanout_polls) / 1000 \
            * p["step_functions_standard_per_thousand_transitions"]
        route, progress = STEPS["RouteChunk"], STEPS["BatchProgress"]
        out["lambda_workflow"] = (lambda_cost(requests * chunks, a.route_chunk_ms + a.route_chunk_ms_per_task
                                              * CHUNK_TASKS, route.memory_mb, p)
                                  + lambda_cost(requests * (a.fanout_polls + 1), a.batch_progress_ms,
                                                progress.memory_mb, p))
        out["s3"] = requests * ((chunks + 1) * p["s3_put_per_thousand"] + (chunks + 1) * p["s3_get_per_thousand"]) / 1000
    else:
        out["lambda_workflow"] = 0.0

    # Data out to the internet: task packs to agents, answers to clients (results come in free).
    out_bytes = requests * sum(packs) + total * a.response_bytes_per_task
    out["data_transfer"] = out_bytes / GB * p["data_transfer_out_per_gb"]
    out["total"] = sum(out.values())
    return {k: round(v, 4) for k, v in out.items()}


def fixed_monthly(prices: dict) -> dict[str, float]:
    """Always-on resources of one stage, per month (independent of the task count)."""
    p, c = prices["prices"], DeployConfig()
    out = {
        "nat_gateway": c.nat_gateways * HOURS_PER_MONTH * p["nat_gateway_hour"],
        "elasticache": (1 + c.redis_replicas) * HOURS_PER_MONTH * p["elasticache_node_hour"][c.redis_node_type],
        "interface_endpoints": len(INTERFACE_ENDPOINTS) * AVAILABILITY_ZONES * HOURS_PER_MONTH
        * p["interface_endpoint_hour"],
        "nlb": HOURS_PER_MONTH * p["nlb_hour"],
        "fargate_rendezvous": HOURS_PER_MONTH * (c.rendezvous_cpu / 1024 * p["fargate_vcpu_hour"]
                                                 + c.rendezvous_memory_mb / 1024 * p["fargate_gb_hour"]),
        # the history rule starts its drainers every minute, work or not
        "history_drainers_idle": lambda_cost(c.history_drainers * HOURS_PER_MONTH * 3600 / sizing.SCHEDULE_PERIOD_S,
                                             ASSUMPTIONS.history_invocation_ms, FUNCTIONS["history"].memory_mb, p),
    }
    out["total"] = sum(out.values())
    return {k: round(v, 2) for k, v in out.items()}


def archive_summary(total: int, prices: dict, after: dict[str, dict[str, float]] | None = None,
                    a: Assumptions = ASSUMPTIONS) -> dict:
    """The durable history's cost before (task items) and after (pages) issue 24, per
    scenario (history = the history function + DynamoDB), and the drainers' capacity."""
    after = after or {n: scenario(total, k, prices, a) for n, k in SCENARIOS.items()}
    before = {n: scenario(total, k, prices, a, archive="items") for n, k in SCENARIOS.items()}

    def part(r: dict[str, float]) -> dict[str, float]:
        return {"lambda_history": r["lambda_history"], "dynamodb": r["dynamodb"],
                "history": round(r["lambda_history"] + r["dynamodb"], 4), "total": r["total"]}

    drainers = DeployConfig().history_drainers
    return {
        "tasks_per_page": tasks_per_page(a),
        "write_units_per_task": round(sizing.write_units_per_task(tasks_per_page(a), a.history_page_bytes_per_task), 6),
        "before": {n: part(r) for n, r in before.items()},
        "after": {n: part(r) for n, r in after.items()},
        "capacity": {"drainers": drainers, "batch": sizing.HISTORY_BATCH,
                     "seconds_per_batch": a.history_seconds_per_batch, "duty_cycle": round(sizing.duty_cycle(), 4),
                     "tasks_per_s": round(sizing.drain_capacity(drainers, seconds_per_batch=a.history_seconds_per_batch))},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=1_000_000, help="tasks to price (default 1,000,000)")
    ap.add_argument("--prices", type=Path, default=PRICES, help="price table (YAML)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON on the last line")
    args = ap.parse_args(argv)
    if args.tasks < 1:
        ap.error("--tasks must be at least 1")
    prices = load_prices(args.prices)
    results = {name: scenario(args.tasks, k, prices) for name, k in SCENARIOS.items()}
    fixed = fixed_monthly(prices)

    components = [c for c in next(iter(results.values())) if c != "total"]
    print(f"AWS cost of {args.tasks:,} no-op tasks, {prices['region']}, prices of {prices['date']} "
          f"(Lambda {ARCHITECTURE}: api {FUNCTIONS['api'].memory_mb} MB, results {FUNCTIONS['results'].memory_mb} MB)")
    header = f"{'USD':<16}" + "".join(f"{f'{n} ({k:,}/req)':>22}" for n, k in SCENARIOS.items())
    print(header)
    for comp in components + ["total"]:
        print(f"{comp:<16}" + "".join(f"{results[n][comp]:>22.4f}" for n in SCENARIOS))
    print(f"{'per task':<16}" + "".join(f"{results[n]['total'] / args.tasks:>22.8f}" for n in SCENARIOS))
    print(f"fixed monthly (always on): " + ", ".join(f"{k} {v:.2f}" for k, v in fixed.items()))
    print("assumptions: " + ", ".join(f"{k}={v}" for k, v in asdict(ASSUMPTIONS).items()))
    archive = archive_summary(args.tasks, prices, results)
    print(f"durable history (issue 24), USD per {args.tasks:,} tasks, before (task item + owner-index, "
          f"{ITEMS_WRITE_UNITS_PER_TASK} WRU/task) -> after (pages of {archive['tasks_per_page']:,}, "
          f"{archive['write_units_per_task']:.4f} WRU/task):")
    for n in SCENARIOS:
        b, a = archive["before"][n], archive["after"][n]
        print(f"  {n:<8} history {b['history']:.4f} -> {a['history']:.4f}   total {b['total']:.4f} -> {a['total']:.4f}")
    c = archive["capacity"]
    print(f"archive capacity: {c['drainers']} drainers x {c['batch']:,} tasks / {c['seconds_per_batch']} s "
          f"x duty {c['duty_cycle']:.3f} = {c['tasks_per_s']:,.0f} tasks/s (batch time and page bytes: "
          "infra/aws/sizing.py, from benchmarks/archive.py with room for Lambda's CPU share)")
    idle = cost_idle.idle_summary(prices)
    cost_idle.print_summary(idle)
    if args.json:
        print(json.dumps({"tasks": args.tasks, "region": prices["region"], "prices_date": prices["date"],
                          "prices_added": prices.get("added", {}), "idle_fleet": idle,
                          "lambda_architecture": ARCHITECTURE,
                          "lambda_memory_mb": {k: s.memory_mb for k, s in FUNCTIONS.items()},
                          "tasks_per_request": SCENARIOS, "scenarios": results, "fixed_monthly": fixed,
                          "archive": archive, "assumptions": asdict(ASSUMPTIONS)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
