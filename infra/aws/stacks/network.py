"""Network stack: a VPC over two availability zones with public subnets (NAT gateway, the
rendezvous load balancer), private subnets with egress (Lambdas, Fargate tasks) and
isolated subnets (ElastiCache), plus VPC endpoints so AWS API traffic of the handlers
stays off the NAT: gateway endpoints for DynamoDB and S3, interface endpoints for SQS,
Secrets Manager, STS, CloudWatch Logs and Step Functions."""
from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.aws.config import AVAILABILITY_ZONES, INTERFACE_ENDPOINTS, DeployConfig
from infra.aws.stacks.common import retention

_SERVICES = {
    "sqs": ("Sqs", ec2.InterfaceVpcEndpointAwsService.SQS),
    "secretsmanager": ("SecretsManager", ec2.InterfaceVpcEndpointAwsService.SECRETS_MANAGER),
    "sts": ("Sts", ec2.InterfaceVpcEndpointAwsService.STS),
    "logs": ("Logs", ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS),
    "states": ("StepFunctions", ec2.InterfaceVpcEndpointAwsService.STEP_FUNCTIONS),
}


class NetworkStack(Stack):
    def __init__(self, scope: Construct, cid: str, *, config: DeployConfig, **kwargs):
        super().__init__(scope, cid, **kwargs)
        self.vpc = ec2.Vpc(
            self, "Vpc", max_azs=AVAILABILITY_ZONES, nat_gateways=config.nat_gateways,
            ip_addresses=ec2.IpAddresses.cidr("10.40.0.0/16"),
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24,
                                        map_public_ip_on_launch=False),
                ec2.SubnetConfiguration(name="private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=20),
                ec2.SubnetConfiguration(name="data", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED, cidr_mask=24),
            ],
            gateway_endpoints={
                "DynamoDb": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.DYNAMODB),
                "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3),
            },
            restrict_default_security_group=True,
        )
        flow_logs = logs.LogGroup(self, "FlowLogs", retention=retention(config.log_retention_days))
        self.vpc.add_flow_log("FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs),
                              traffic_type=ec2.FlowLogTrafficType.REJECT)
        # Interface endpoints admit HTTPS from inside the VPC only (CDK's default rule).
        self.endpoint_sg = ec2.SecurityGroup(self, "EndpointSg", vpc=self.vpc, allow_all_outbound=False,
                                             description="VPC interface endpoints: HTTPS from the VPC")
        self.endpoint_sg.add_ingress_rule(ec2.Peer.ipv4(self.vpc.vpc_cidr_block), ec2.Port.tcp(443),
                                          "HTTPS from inside the VPC")
        for key in INTERFACE_ENDPOINTS:
            name, service = _SERVICES[key]
            self.vpc.add_interface_endpoint(
                name, service=service, private_dns_enabled=True, security_groups=[self.endpoint_sg], open=False,
                subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS))
        # The handlers' security group: no inbound at all; outbound to AWS APIs and Redis.
        self.lambda_sg = ec2.SecurityGroup(self, "LambdaSg", vpc=self.vpc, allow_all_outbound=True,
                                           description="skyfn Lambda functions (no inbound)")

