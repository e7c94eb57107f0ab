"""Rendezvous stack: the rendezvous server (rendezvous/, `python -m rendezvous`) as one
ECS Fargate task behind an internet-facing network load balancer with a TCP listener.

- One task: groups meet in one server's memory, so the service never runs two at once
  (maximum 100% during deployments).
- Client IP preservation is on: the server must see each peer's public (NATed) address
  and port to tell the other peer where to punch; NLB target groups of type IP turn it
  off by default.
- The only public port: the load balancer's security group admits the rendezvous port
  from anywhere; the tasks admit it only from the load balancer's security group.
- The token-signing secret reaches the container as SKYFN_RENDEZVOUS_SECRET from Secrets
  Manager (an ECS secret: never in the task definition).
- The image is built by `cdk deploy` from infra/aws/docker/rendezvous.Dockerfile;
  `cdk synth` only stages its small context, so synthesis needs no Docker.
"""
from __future__ import annotations

from aws_cdk import CfnOutput, Duration, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from infra.aws import packaging
from infra.aws.config import DeployConfig
from infra.aws.stacks.common import retention

SECRET_ENV = "SKYFN_RENDEZVOUS_SECRET"  # rendezvous/runner.py


class RendezvousStack(Stack):
    def __init__(self, scope: Construct, cid: str, *, config: DeployConfig, vpc: ec2.IVpc,
                 secret: secretsmanager.ISecret, **kwargs):
        super().__init__(scope, cid, **kwargs)
        port = config.rendezvous_port
        cluster = ecs.Cluster(self, "Cluster", vpc=vpc, cluster_name=f"{config.prefix}-rendezvous",
                              container_insights_v2=ecs.ContainerInsights.ENABLED)
        task = ecs.FargateTaskDefinition(
            self, "Task", cpu=config.rendezvous_cpu, memory_limit_mib=config.rendezvous_memory_mb,
            runtime_platform=ecs.RuntimePlatform(cpu_architecture=ecs.CpuArchitecture.X86_64,
                                                 operating_system_family=ecs.OperatingSystemFamily.LINUX))
        log_group = logs.LogGroup(self, "Logs", retention=retention(config.log_retention_days))
        task.add_container(
            "rendezvous", image=ecs.ContainerImage.from_asset(str(packaging.rendezvous_image_context())),
            command=["--port", str(port), "--log-level", "info"],
            secrets={SECRET_ENV: ecs.Secret.from_secrets_manager(secret)},
            port_mappings=[ecs.PortMapping(container_port=port, protocol=ecs.Protocol.TCP)],
            logging=ecs.LogDrivers.aws_logs(stream_prefix="rendezvous", log_group=log_group),
            readonly_root_filesystem=True, essential=True,
            # the server's file-descriptor budget (--max-connections 16000)
            ulimits=[ecs.Ulimit(name=ecs.UlimitName.NOFILE, soft_limit=65536, hard_limit=65536)])

        self.nlb_sg = ec2.SecurityGroup(self, "NlbSg", vpc=vpc, allow_all_outbound=False,
                                        description="rendezvous load balancer: the public rendezvous port")
        self.nlb_sg.add_ingress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(port), "rendezvous peers")
        self.task_sg = ec2.SecurityGroup(self, "TaskSg", vpc=vpc, allow_all_outbound=True,
                                         description="rendezvous tasks: only from the load balancer")
        self.task_sg.add_ingress_rule(self.nlb_sg, ec2.Port.tcp(port), "from the load balancer (client IP preserved)")
        self.nlb_sg.add_egress_rule(self.task_sg, ec2.Port.tcp(port), "to the rendezvous tasks")

        service = ecs.FargateService(
            self, "Service", cluster=cluster, task_definition=task, desired_count=1,
            min_healthy_percent=0, max_healthy_percent=100, assign_public_ip=False,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            security_groups=[self.task_sg], circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
            health_check_grace_period=Duration.seconds(30))
        self.nlb = elbv2.NetworkLoadBalancer(
            self, "Nlb", vpc=vpc, internet_facing=True, security_groups=[self.nlb_sg],
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC), cross_zone_enabled=True)
        listener = self.nlb.add_listener("Tcp", port=port, protocol=elbv2.Protocol.TCP)
        listener.add_targets(
            "Rendezvous", port=port, protocol=elbv2.Protocol.TCP, preserve_client_ip=True,
            targets=[service.load_balancer_target(container_name="rendezvous", container_port=port)],
            deregistration_delay=Duration.seconds(15),
            health_check=elbv2.HealthCheck(protocol=elbv2.Protocol.TCP, interval=Duration.seconds(10),
                                           healthy_threshold_count=2, unhealthy_threshold_count=2))
        self.address = f"{self.nlb.load_balancer_dns_name}:{port}"
        CfnOutput(self, "RendezvousAddress", value=self.address,
                  description="host:port of the rendezvous server for communicator groups")
