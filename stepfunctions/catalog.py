"""The catalog of skyfn's static Step Functions state machines (batch fan-out, SPMD group;
flows are compiled per user): every state machine, its ASL file, and the Lambda step
handlers it invokes. CDK (infra/aws) and the embedded runtime
(infra.local.standins.sfn.deploy) both deploy from this list, so they cannot drift apart.

Placeholders: an ASL file refers to a step function as `${<Key>Arn}` (and, if a
machine lists it in extra_placeholders, to the payload bucket as `${PayloadBucket}`; the
batch machine reads its bucket from the execution input instead), the syntax of CloudFormation's DefinitionSubstitutions;
`stepfunctions.render.render()` fills them locally, CDK passes the same names as
`definition_substitutions` (see `substitutions_for`).

Flows (`skyfn.flows`) are not listed as static machines: the API compiles each flow into
ASL that invokes RUN_TASK and creates its state machine at run time under the name prefix
FLOW_MACHINE_PREFIX, with the role whose ARN is in SKYFN_FLOW_ROLE_ARN.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DEFINITIONS = Path(__file__).resolve().parent / "definitions"


@dataclass(frozen=True)
class LambdaStep:
    """One Lambda function behind Task states."""

    key: str                 # placeholder stem: the ASL says ${<key>Arn}
    handler: str             # Lambda handler string, "module.function"
    description: str
    timeout_seconds: int = 60
    memory_mb: int = 512
    # What the handler reaches (CDK grants exactly these): "redis", "s3" (payload
    # bucket read/write), "dynamodb" (registry tables, read), "sqs" (endpoint task queues:
    # send, and read their attributes for the backlog), "rendezvous_secret".
    needs: tuple[str, ...] = ("redis",)
    # Source packages of this repository the handler imports beyond lambdas/ and
    # skyfn/protocol/ (the function's code archive must contain them).
    packages: tuple[str, ...] = ()
    # Environment variables the handler reads, beyond the common service ones
    # (SKYFN_REDIS_URL, SKYFN_TABLE_PREFIX, SKYFN_BUCKET, SKYFN_QUEUE_KIND, SKYFN_SQS_PREFIX).
    env: tuple[str, ...] = ()

    @property
    def placeholder(self) -> str:
        return f"{self.key}Arn"

    @property
    def module(self) -> str:
        return self.handler.rpartition(".")[0]

    @property
    def function(self) -> str:
        return self.handler.rpartition(".")[2]


@dataclass(frozen=True)
class StateMachine:
    name: str                # suffix of the deployed name: "<prefix>-<name>"
    definition: str          # file under stepfunctions/definitions/
    description: str
    steps: tuple[str, ...]   # keys of the LambdaSteps it invokes
    type: str = "STANDARD"
    reads_payload_bucket: bool = False   # ItemReader over S3 (s3:GetObject, s3:ListBucket)
    distributed_map: bool = False        # needs states:StartExecution/DescribeExecution/StopExecution on itself
    extra_placeholders: tuple[str, ...] = field(default_factory=tuple)

    @property
    def path(self) -> Path:
        return DEFINITIONS / self.definition


ROUTE_CHUNK = LambdaStep(
    key="RouteChunk", handler="lambdas.sfn_steps.route_chunk.handler",
    description="Batch fan-out: reads one chunk of a staged batch from S3, routes and enqueues its tasks",
    timeout_seconds=120, memory_mb=1024, needs=("redis", "s3", "dynamodb", "sqs"))
BATCH_PROGRESS = LambdaStep(
    key="BatchProgress", handler="lambdas.sfn_steps.batch_progress.handler",
    description="Batch fan-out: counts the batch's finished tasks (polled between Wait states); records chunks "
                "that could not be routed (reads the chunk from S3, fails its tasks)",
    timeout_seconds=120, memory_mb=1024, needs=("redis", "s3"))
RUN_TASK = LambdaStep(
    key="RunTask", handler="lambdas.sfn_steps.run_task.handler",
    description="Flows and SPMD ranks: submits one task through the service core and waits for its result",
    timeout_seconds=60, memory_mb=512, needs=("redis", "dynamodb", "sqs"))
SPMD_INIT = LambdaStep(
    key="SpmdInit", handler="lambdas.sfn_steps.spmd_init.handler",
    description="SPMD group: creates the group id, its rendezvous token and one item per rank",
    timeout_seconds=30, memory_mb=256, needs=("redis", "dynamodb", "sqs", "rendezvous_secret"),
    env=("SKYFN_RENDEZVOUS_ADDRESS", "SKYFN_RENDEZVOUS_SECRET"), packages=("rendezvous",))

STEPS: dict[str, LambdaStep] = {s.key: s for s in (ROUTE_CHUNK, BATCH_PROGRESS, RUN_TASK, SPMD_INIT)}

BATCH_FANOUT = StateMachine(
    name="batch-fanout", definition="batch_fanout.asl.json",
    description="A large batch: Distributed Map over the S3 manifest of its chunks, then a status-polling loop "
                "until every task has a result",
    steps=("RouteChunk", "BatchProgress"), reads_payload_bucket=True, distributed_map=True)
SPMD_GROUP = StateMachine(
    name="spmd-group", definition="spmd_group.asl.json",
    description="An SPMD group: init (group id, rendezvous token) -> Map over N ranks, each a task -> collect",
    steps=("SpmdInit", "RunTask"))

MACHINES: dict[str, StateMachine] = {m.name: m for m in (BATCH_FANOUT, SPMD_GROUP)}

FLOW_MACHINE_PREFIX = "flow"    # deployed as "<prefix>-flow-<hash>"
FLOW_STEPS = ("RunTask",)

# The API handler's extra environment (CDK sets these; the embedded runtime too):
API_ENV = {
    "SKYFN_BATCH_FANOUT_ARN": "ARN of the batch-fanout state machine",
    "SKYFN_SPMD_GROUP_ARN": "ARN of the spmd-group state machine",
    "SKYFN_RUN_TASK_FUNCTION_ARN": "ARN of the RunTask function (flows' Task states invoke it)",
    "SKYFN_FLOW_ROLE_ARN": "role that flow state machines run as (may invoke RunTask only)",
    "SKYFN_BUCKET": "payload bucket (batches are staged there)",
}


def machine_name(prefix: str, machine: StateMachine) -> str:
    return f"{prefix}-{machine.name}"


def function_name(prefix: str, step: LambdaStep) -> str:
    return f"{prefix}-wf-{step.key}"


def substitutions_for(machine: StateMachine, function_arns: dict[str, str], bucket: str) -> dict[str, str]:
    """The DefinitionSubstitutions of `machine`, given each step key's function ARN."""
    missing = [k for k in machine.steps if k not in function_arns]
    if missing:
        raise KeyError(f"no function ARN for step(s) {missing} of state machine {machine.name}")
    subs = {STEPS[k].placeholder: function_arns[k] for k in machine.steps}
    if "PayloadBucket" in machine.extra_placeholders:
        subs["PayloadBucket"] = bucket
    return subs
