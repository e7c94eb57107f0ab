"""Workflows stack: the state machines of stepfunctions/catalog.py with their Lambda step
functions, deployed from the same ASL files the embedded runtime runs.

- Each step of the catalog becomes a function named `catalog.function_name(prefix, step)`
  with the service's code, layer, VPC placement and environment, plus the grants its
  `needs` declare (redis, s3, dynamodb, rendezvous_secret) and the environment it reads;
  the steps that write final task states (config.PUSH_STEPS) push them like the service's
  functions (infra/aws/stacks/push.py `grant_push`).
- Each machine gets its own role that may invoke only its own steps' functions (plus
  reading the payload bucket for an S3 ItemReader, and starting/describing/stopping its
  own child executions for a Distributed Map), a log group (level ALL, without execution
  data: payloads may be private) and X-Ray tracing. ASL placeholders are CloudFormation
  DefinitionSubstitutions (`catalog.substitutions_for`).
- The flow role (`<prefix>-flow`): the role the API gives the state machines it compiles
  from `skyfn.flows` at run time; it may invoke the RunTask function only.
"""
from __future__ import annotations

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.aws.config import PUSH_STEPS, DeployConfig, FunctionSpec
from infra.aws.stacks.common import retention
from infra.aws.stacks.data import DataStack
from infra.aws.stacks.service import ServiceStack, flow_role_name
from stepfunctions import catalog


# What the steps' code reaches beyond catalog.needs (issue 25: allowed against used):
# - the steps that submit tasks through lambdas.core.tasks.tasks: they send packs, and each
#   pack carries a presigned POST for the endpoint's results/ prefix signed with the step's
#   own credentials (lambdas/core/tasks/blobs.py result_upload; the agent keeps the latest
#   pack's form), so they may put objects there. SpmdInit only checks the endpoint is online.
SUBMITTING_STEPS = ("RouteChunk", "RunTask")
# - the steps that read task status (RunTask's wait: archived tasks are in the history table)
HISTORY_READING_STEPS = ("RunTask",)
# - payload-bucket objects of the "s3" steps: (actions, key prefixes). RouteChunk reads its
#   chunk (batches/) and presigns GETs of uploaded arguments (args/); BatchProgress reads a
#   chunk that failed, then lists and deletes the batch's staged objects.
STEP_OBJECTS = {
    "RouteChunk": (["s3:GetObject"], ["batches/", "args/"]),
    "BatchProgress": (["s3:GetObject", "s3:DeleteObject"], ["batches/"]),
}
LISTING_STEPS = ("BatchProgress",)


class WorkflowsStack(Stack):
    def __init__(self, scope: Construct, cid: str, *, config: DeployConfig, data: DataStack,
                 service: ServiceStack, rendezvous_address: str, **kwargs):
        super().__init__(scope, cid, **kwargs)
        self.functions = {}
        for key, step in catalog.STEPS.items():
            spec = FunctionSpec(key=f"wf-{key}", handler=step.handler, memory_mb=step.memory_mb,
                                timeout_s=step.timeout_seconds, reserved_concurrency=None,
                                description=step.description)
            env = {}
            if "SKYFN_RENDEZVOUS_ADDRESS" in step.env:
                env["SKYFN_RENDEZVOUS_ADDRESS"] = rendezvous_address
            secrets = {}
            if "rendezvous_secret" in step.needs:
                secrets["SKYFN_RENDEZVOUS_SECRET"] = data.rendezvous_secret
            fn = service.function(spec, scope=self, extra_env=env, secrets=secrets,
                                  function_name=catalog.function_name(config.prefix, step))
            if "s3" in step.needs:
                data.grant_objects(fn, "PayloadObjects", *STEP_OBJECTS[key])
                if key in LISTING_STEPS:
                    # batches.delete_staged: list_objects_v2 under batches/<batch>/, then one
                    # DeleteObjects request (a POST on the bucket, authorized as s3:DeleteObject:
                    # moto checks it against the bucket's ARN, S3 against each key, which
                    # PayloadObjects covers)
                    fn.add_to_role_policy(iam.PolicyStatement(
                        sid="StagedBatchCleanup", actions=["s3:ListBucket", "s3:DeleteObject"],
                        resources=[data.bucket.bucket_arn]))
            if key in SUBMITTING_STEPS:  # each pack carries a result-upload form signed by this role
                data.grant_objects(fn, "ResultUploadForms", ["s3:PutObject"], ["results/"])
            if "dynamodb" in step.needs:  # registry reads: GetItem only (no index, no Scan)
                for table in ("functions", "endpoints"):
                    data.grant_table(fn, f"Registry{table.capitalize()}Read", table, ["dynamodb:GetItem"])
                if key in HISTORY_READING_STEPS:
                    data.grant_history_read(fn)  # status of archived tasks (lambdas/core/tasks/tasks.py)
            if {"s3", "dynamodb"} & set(step.needs) or key in SUBMITTING_STEPS:
                # the data key: S3 and DynamoDB use it on the function's behalf; the result
                # forms' uploads need its data keys
                data.grant_key(fn, write=False, uploads=key in SUBMITTING_STEPS)
            if "sqs" in step.needs:  # declares endpoint queues (status: depth); submitting steps send packs
                fn.add_to_role_policy(service.endpoint_queue_statement(send=key in SUBMITTING_STEPS))
            if key in PUSH_STEPS:  # writes final states: pushes them (the service stack's WebSocket API)
                service.push.grant_push(fn)
            self.functions[key] = fn

        self.machines: dict[str, sfn.StateMachine] = {}
        for name, machine in catalog.MACHINES.items():
            self.machines[name] = self._machine(config, data, machine)

        self.flow_role = iam.Role(self, "FlowRole", role_name=flow_role_name(config),
                                  assumed_by=iam.ServicePrincipal("states.amazonaws.com"),
                                  description="state machines compiled from skyfn.flows: invoke RunTask only")
        for key in catalog.FLOW_STEPS:
            self.functions[key].grant_invoke(self.flow_role)
        _allow_logs_and_tracing(self.flow_role)

    def _machine(self, config: DeployConfig, data: DataStack, machine: catalog.StateMachine) -> sfn.StateMachine:
        cid = "".join(part.capitalize() for part in machine.name.split("-"))
        full_name = catalog.machine_name(config.prefix, machine)
        role = iam.Role(self, f"{cid}Role", assumed_by=iam.ServicePrincipal("states.amazonaws.com"),
                        description=f"{full_name}: invokes only its own steps")
        for key in machine.steps:
            self.functions[key].grant_invoke(role)
        if machine.reads_payload_bucket:  # the Distributed Map's ItemReader: s3:getObject of the manifest
            data.grant_objects(role, "ManifestRead", ["s3:GetObject"], ["batches/"])
            data.grant_key(role, write=False)
        if machine.distributed_map:
            role.add_to_policy(iam.PolicyStatement(
                sid="DistributedMapChildren", actions=["states:StartExecution"],
                resources=[self.format_arn(service="states", resource="stateMachine", resource_name=full_name,
                                           arn_format=ArnFormat.COLON_RESOURCE_NAME)]))
            role.add_to_policy(iam.PolicyStatement(
                sid="DistributedMapExecutions", actions=["states:DescribeExecution", "states:StopExecution"],
                resources=[self.format_arn(service="states", resource="execution", resource_name=f"{full_name}/*",
                                           arn_format=ArnFormat.COLON_RESOURCE_NAME)]))
        log_group = logs.LogGroup(self, f"{cid}Logs", log_group_name=f"/aws/vendedlogs/states/{full_name}",
                                  retention=retention(config.log_retention_days))
        arns = {key: self.functions[key].function_arn for key in machine.steps}
        return sfn.StateMachine(
            self, cid, state_machine_name=full_name, comment=machine.description,
            definition_body=sfn.DefinitionBody.from_file(str(machine.path)),
            definition_substitutions=catalog.substitutions_for(machine, arns, data.bucket.bucket_name),
            state_machine_type=sfn.StateMachineType[machine.type], role=role, tracing_enabled=True,
            logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=False))


def _allow_logs_and_tracing(role: iam.Role) -> None:
    """What Step Functions needs to deliver execution logs and X-Ray segments (these APIs
    take no resource-level permissions)."""
    role.add_to_policy(iam.PolicyStatement(sid="LogDelivery", actions=[
        "logs:CreateLogDelivery", "logs:GetLogDelivery", "logs:UpdateLogDelivery", "logs:DeleteLogDelivery",
        "logs:ListLogDeliveries", "logs:PutResourcePolicy", "logs:DescribeResourcePolicies",
        "logs:DescribeLogGroups"], resources=["*"]))
    role.add_to_policy(iam.PolicyStatement(sid="Tracing", actions=[
        "xray:PutTraceSegments", "xray:PutTelemetryRecords", "xray:GetSamplingRules", "xray:GetSamplingTargets"],
        resources=["*"]))

