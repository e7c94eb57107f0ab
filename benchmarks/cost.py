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
(RESULTS_BATCH_SIZE), history writes per flush (lambdas/config.py), tasks per fan-out
chunk (lambdas.core.runs.batches.CHUNK_TASKS) and the states of batch_fanout.asl.json. What is
assumed (no AWS account here: durations, sizes, poll counts) is in ASSUMPTIONS, printed
with the result. Fixed monthly costs (NAT gateway, Redis nodes, endpoints, NLB, Fargate)
are reported apart; ElastiCache is also amortized per task at a stated throughput.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from endpoint_agent.config import EndpointConfig
from infra.aws.config import (ARCHITECTURE, AVAILABILITY_ZONES, FUNCTIONS, INTERFACE_ENDPOINTS, RESULTS_BATCH_SIZE,
                              DeployConfig)
from lambdas.core.runs.batches import CHUNK_TASKS
from skyfn.protocol.messages import PACK_MAX_BYTES, PACK_MAX_TASKS
from skyfn.protocol.queues.sqs import BATCH_BYTES as SQS_BATCH_BYTES
from skyfn.protocol.queues.sqs import BATCH_SIZE as SQS_BATCH_SIZE
from stepfunctions.catalog import BATCH_FANOUT, STEPS

PRICES = Path(__file__).with_name("aws_prices.yaml")
SQS_CHUNK = 64 * 1024          # SQS bills every 64 KiB of a request as one request
HOURS_PER_MONTH = 730
GB = 1024 ** 3


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
    results_ms: float = 15.0            # one results-Lambda invocation, plus ...
    results_ms_per_result: float = 0.03
    history_ms_per_flush: float = 300.0
    route_chunk_ms: float = 200.0       # fan-out step per chunk (S3 read, routing, enqueue)
    route_chunk_ms_per_task: float = 0.1
    batch_progress_ms: float = 50.0
    fanout_polls: int = 20              # BatchProgress checks per batch-fanout execution
    throughput_tasks_per_s: float = 1_000.0  # ElastiCache amortization and result packing
    response_bytes_per_task: int = 290  # API answers to the client (task id + result)


ASSUMPTIONS = Assumptions()
SCENARIOS = {"single": 1, "batch": 1_000, "fanout": 10_000}


def load_prices(path: Path = PRICES) -> dict:
    data = yaml.safe_load(path.read_text())
    for key in ("date", "region", "prices", "sources"):
        if key not in data:
            raise SystemExit(f"{path}: missing '{key}'")
    return data


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


def lambda_cost(invocations: float, ms_each: float, memory_mb: int, p: dict) -> float:
    gb_s = invocations * math.ceil(ms_each) / 1000 * memory_mb / 1024
    return gb_s * p["lambda_arm64_per_gb_second"] + invocations / 1e6 * p["lambda_requests_per_million"]


def scenario(total: int, per_request: int, prices: dict, a: Assumptions = ASSUMPTIONS) -> dict[str, float]:
    """USD for `total` tasks submitted `per_request` at a time; one component per service."""
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
    # Results: the agent flushes every result_flush_ms or at result_batch results.
    agent = EndpointConfig.model_fields
    flush_results = max(1, int(a.throughput_tasks_per_s * agent["result_flush_ms"].default / 1000))
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
    history_batch = _history_batch()
    out["lambda_history"] = lambda_cost(math.ceil(total / history_batch), a.history_ms_per_flush, mem["history"], p)

    send = requests * sqs_requests(packs)                       # service -> task queue, per request
    # The agent long-polls a backlog: up to 10 packs per receive, whichever request sent them.
    receive = sqs_requests(packs * requests)
    delete = math.ceil(len(packs) * requests / SQS_BATCH_SIZE)  # acks, after the results are sent
    results_send = sqs_requests(result_sizes)                   # agent -> results queue
    results_receive = sqs_requests(result_sizes)                # the event source's polls
    results_delete = results_invocations
    sqs_total = send + receive + delete + results_send + results_receive + results_delete
    out["sqs"] = sqs_total / 1e6 * p["sqs_standard_per_million_requests"]

    # History: one item per task and one per submission, each under 1 KB (1 WRU).
    out["dynamodb"] = (total + requests) / 1e6 * p["dynamodb_on_demand_per_million_writes"]

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


def _history_batch() -> int:
    from lambdas.config import settings

    return settings().history_batch


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
    }
    out["total"] = sum(out.values())
    return {k: round(v, 2) for k, v in out.items()}


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
    if args.json:
        print(json.dumps({"tasks": args.tasks, "region": prices["region"], "prices_date": prices["date"],
                          "lambda_architecture": ARCHITECTURE,
                          "lambda_memory_mb": {k: s.memory_mb for k, s in FUNCTIONS.items()},
                          "tasks_per_request": SCENARIOS, "scenarios": results, "fixed_monthly": fixed,
                          "assumptions": asdict(ASSUMPTIONS)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
