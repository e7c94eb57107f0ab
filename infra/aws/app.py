"""The CDK app: `python -m infra.aws.app` (cdk.json at the repository root runs it).

Stacks, all named `Skyfn-<stage>-<part>`, in dependency order:
network -> data -> service -> agent access; network, data -> rendezvous -> service (the API's
rendezvous address); data, service and rendezvous -> workflows. Context (`cdk deploy -c key=value`) is read by
infra/aws/config.py: stage, region, account, auth (cognito | globus), globus_issuer,
globus_audience, nat_gateways, redis_node_type, redis_replicas, api_rate_limit,
api_burst_limit, log_retention_days, history_ttl_days, payload_expiry_days,
rendezvous_port, alarm_email.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import aws_cdk as cdk

from infra.aws.config import DeployConfig
from infra.aws.stacks.agent_access import AgentAccessStack
from infra.aws.stacks.data import DataStack
from infra.aws.stacks.network import NetworkStack
from infra.aws.stacks.rendezvous import RendezvousStack
from infra.aws.stacks.service import ServiceStack
from infra.aws.stacks.workflows import WorkflowsStack

CROSS_STACK_FLAG = "@aws-cdk/core:defaultCrossStackReferences"


class SkyfnApp:
    """The stacks of one stage, built into `app`."""

    def __init__(self, app: cdk.App, config: DeployConfig):
        env = cdk.Environment(account=config.account, region=config.region)
        c = config
        self.network = NetworkStack(app, c.stack_name("network"), config=c, env=env,
                                    description="skyfn: VPC, NAT, VPC endpoints")
        self.data = DataStack(app, c.stack_name("data"), config=c, vpc=self.network.vpc,
                              lambda_sg=self.network.lambda_sg, env=env,
                              description="skyfn: DynamoDB tables, ElastiCache Redis, S3 payloads, secrets")
        self.service = ServiceStack(app, c.stack_name("service"), config=c, vpc=self.network.vpc,
                                    lambda_sg=self.network.lambda_sg, data=self.data, env=env,
                                    description="skyfn: Lambda handlers, REST API, queues, schedules, alarms")
        self.agent_access = AgentAccessStack(app, c.stack_name("agent-access"), config=c, service=self.service,
                                             env=env, description="skyfn: the role endpoint agents' sessions use")
        self.rendezvous = RendezvousStack(app, c.stack_name("rendezvous"), config=c, vpc=self.network.vpc,
                                          secret=self.data.rendezvous_secret, env=env,
                                          description="skyfn: rendezvous server on Fargate behind an NLB")
        # the API hands users the rendezvous address with their group tokens
        self.service.functions["api"].add_environment("SKYFN_RENDEZVOUS_ADDRESS", self.rendezvous.address)
        self.workflows = WorkflowsStack(app, c.stack_name("workflows"), config=c, data=self.data,
                                        service=self.service, rendezvous_address=self.rendezvous.address, env=env,
                                        description="skyfn: Step Functions workflows and their step functions")
        self.stacks = [self.network, self.data, self.service, self.agent_access, self.rendezvous, self.workflows]
        for stack in self.stacks:
            cdk.Tags.of(stack).add("project", "skyfn")
            cdk.Tags.of(stack).add("stage", c.stage)


def build(context: Mapping[str, Any] | None = None, outdir: str | None = None,
          environ: Mapping[str, str] | None = None) -> tuple[cdk.App, SkyfnApp]:
    """An App with every stack of the stage the context describes (tests pass context
    directly; the CLI passes it through the environment)."""
    kwargs: dict[str, Any] = {}
    if context is not None:
        kwargs["context"] = dict(context)
    if outdir:
        kwargs["outdir"] = outdir
    app = cdk.App(**kwargs)
    # Stacks of one stage reference each other through exports; keep CDK's current
    # (strong) behaviour explicitly.
    if app.node.try_get_context(CROSS_STACK_FLAG) is None:
        app.node.set_context(CROSS_STACK_FLAG, "strong")
    ctx = {key: app.node.try_get_context(key) for key in DeployConfig.__dataclass_fields__}
    config = DeployConfig.from_context(ctx, os.environ if environ is None else environ)
    return app, SkyfnApp(app, config)


def main() -> None:
    app, _ = build()
    app.synth()


if __name__ == "__main__":
    main()
