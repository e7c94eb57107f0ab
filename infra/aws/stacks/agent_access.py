"""Agent access stack: the IAM role whose sessions endpoint agents use to reach SQS.

The API function assumes it (the trust policy names that function's role and nothing
else) with a session policy built by lambdas/core/identity/agent_credentials.py that narrows it
to one endpoint's queues; the role's own policy is the ceiling: consume (receive,
delete, change visibility, read attributes) on the stage's task and control queues,
send on the results queue, and an explicit deny on every dead-letter queue.
"""
from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.aws.config import DeployConfig
from infra.aws.stacks.service import ServiceStack, agent_role_name, queue_arn
from lambdas.core.identity.agent_credentials import CONSUME_ACTIONS, MAX_SESSION_SECONDS, RESULT_ACTIONS


class AgentAccessStack(Stack):
    def __init__(self, scope: Construct, cid: str, *, config: DeployConfig, service: ServiceStack, **kwargs):
        super().__init__(scope, cid, **kwargs)
        p = config.prefix
        api_role = service.functions["api"].role
        self.role = iam.Role(
            self, "AgentRole", role_name=agent_role_name(config),
            description="endpoint agents: sessions narrowed per endpoint by the API's session policy",
            assumed_by=iam.ArnPrincipal(api_role.role_arn),
            max_session_duration=Duration.seconds(MAX_SESSION_SECONDS))
        self.role.add_to_policy(iam.PolicyStatement(
            sid="ConsumeEndpointQueues", actions=list(CONSUME_ACTIONS),
            resources=[queue_arn(self, f"{p}-tasks-*"), queue_arn(self, f"{p}-control-*")]))
        self.role.add_to_policy(iam.PolicyStatement(
            sid="ReturnResults", actions=list(RESULT_ACTIONS), resources=[service.results_queue.queue_arn]))
        self.role.add_to_policy(iam.PolicyStatement(
            sid="NoDeadLetters", effect=iam.Effect.DENY, actions=["sqs:*"], resources=[queue_arn(self, f"{p}-*-dlq")]))
