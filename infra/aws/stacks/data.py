"""Data stack: everything stateful.

- DynamoDB tables named as lambdas/adapters/dynamodb.py derives them from the prefix,
  with exactly its keys and indexes: functions (function_id), endpoints (endpoint_id;
  GSI owner-index on owner), submissions (submission_id) and history (partition key k,
  sort key s, no index: finished tasks in compressed pages per owner, issue 24,
  lambdas/adapters/history_pages.py). On-demand, point-in-time recovery, encrypted with
  the stack's KMS key; submissions and history items expire through TTL on `expires_at`.
- ElastiCache for Redis (the hot task store): a replication group with a replica in the
  other AZ, automatic failover, TLS in transit (required), encryption at rest, an AUTH
  token generated in Secrets Manager, `noeviction` (a hot store must never drop a task),
  reachable only from the handlers' security group, in isolated subnets.
- S3 bucket for large payloads: KMS-encrypted, public access blocked, TLS enforced,
  objects expire.
- Secrets: the Redis AUTH token and the rendezvous token-signing secret.
"""
from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticache as elasticache
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from infra import hot_store
from infra.aws.config import DeployConfig

TTL_ATTRIBUTE = "expires_at"
REDIS_PORT = 6379
# name -> (partition key, sort key or None, GSI owner-index key schema or None, TTL)
TABLES = {
    "functions": ("function_id", None, None, False),
    "endpoints": ("endpoint_id", None, ("owner", None), False),
    "submissions": ("submission_id", None, None, True),
    # pages k="p#<owner>#<bucket>", s="<minute>#<page id>"; markers k="m#<owner>", s="<minute>#<bucket>"
    "history": ("k", "s", None, True),
}
# What the handlers do on the history table (lambdas/adapters/history_pages.py): the
# drain writes pages and markers (batch_writer), readers query pages and markers.
HISTORY_READ_ACTIONS = ("dynamodb:Query", "dynamodb:GetItem")
HISTORY_WRITE_ACTIONS = ("dynamodb:PutItem", "dynamodb:BatchWriteItem")


class DataStack(Stack):
    def __init__(self, scope: Construct, cid: str, *, config: DeployConfig, vpc: ec2.IVpc,
                 lambda_sg: ec2.ISecurityGroup, **kwargs):
        super().__init__(scope, cid, **kwargs)
        removal = RemovalPolicy.RETAIN if config.retain_data else RemovalPolicy.DESTROY
        self.key = kms.Key(self, "DataKey", enable_key_rotation=True, removal_policy=removal,
                           description=f"{config.prefix}: DynamoDB tables, payload bucket, Redis at rest")

        self.tables: dict[str, dynamodb.Table] = {}
        for name, (pk, sk, gsi, ttl) in TABLES.items():
            table = dynamodb.Table(
                self, f"{name.capitalize()}Table", table_name=f"{config.prefix}-{name}",
                partition_key=dynamodb.Attribute(name=pk, type=dynamodb.AttributeType.STRING),
                sort_key=dynamodb.Attribute(name=sk, type=dynamodb.AttributeType.STRING) if sk else None,
                billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
                encryption=dynamodb.TableEncryption.CUSTOMER_MANAGED, encryption_key=self.key,
                point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                    point_in_time_recovery_enabled=True),
                time_to_live_attribute=TTL_ATTRIBUTE if ttl else None,
                deletion_protection=config.retain_data, removal_policy=removal)
            if gsi:
                hash_key, range_key = gsi
                table.add_global_secondary_index(
                    index_name="owner-index",
                    partition_key=dynamodb.Attribute(name=hash_key, type=dynamodb.AttributeType.STRING),
                    sort_key=dynamodb.Attribute(name=range_key, type=dynamodb.AttributeType.NUMBER)
                    if range_key else None,
                    projection_type=dynamodb.ProjectionType.ALL)
            self.tables[name] = table

        self.bucket = s3.Bucket(
            self, "Payloads", encryption=s3.BucketEncryption.KMS, encryption_key=self.key, bucket_key_enabled=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL, enforce_ssl=True, versioned=False,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED, removal_policy=RemovalPolicy.RETAIN,
            lifecycle_rules=[s3.LifecycleRule(id="expire-payloads", expiration=Duration.days(config.payload_expiry_days),
                                              abort_incomplete_multipart_upload_after=Duration.days(1))])

        # ElastiCache AUTH tokens: 16-128 printable characters without @ " / (no punctuation at all here).
        self.redis_token = secretsmanager.Secret(
            self, "RedisAuthToken", description=f"{config.prefix}: AUTH token of the hot-store Redis",
            generate_secret_string=secretsmanager.SecretStringGenerator(exclude_punctuation=True, password_length=64),
            removal_policy=removal)
        self.rendezvous_secret = secretsmanager.Secret(
            self, "RendezvousSecret", description=f"{config.prefix}: HMAC key of rendezvous group tokens",
            generate_secret_string=secretsmanager.SecretStringGenerator(exclude_punctuation=True, password_length=64),
            removal_policy=removal)

        self.redis_sg = ec2.SecurityGroup(self, "RedisSg", vpc=vpc, allow_all_outbound=False,
                                          description="hot-store Redis: only from the handlers")
        self.redis_sg.add_ingress_rule(lambda_sg, ec2.Port.tcp(REDIS_PORT), "Redis from the Lambda functions")
        subnets = elasticache.CfnSubnetGroup(
            self, "RedisSubnets", description=f"{config.prefix} hot store",
            subnet_ids=vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED).subnet_ids)
        params = elasticache.CfnParameterGroup(
            self, "RedisParams", cache_parameter_group_family="redis7", description=f"{config.prefix} hot store",
            properties={"maxmemory-policy": "noeviction", **hot_store.PARAMETERS})
        self.redis = elasticache.CfnReplicationGroup(
            self, "Redis", replication_group_description=f"{config.prefix} hot task store",
            engine="redis", engine_version="7.1", cache_node_type=config.redis_node_type,
            num_cache_clusters=1 + config.redis_replicas, automatic_failover_enabled=True, multi_az_enabled=True,
            transit_encryption_enabled=True, transit_encryption_mode="required",
            at_rest_encryption_enabled=True, kms_key_id=self.key.key_arn,
            auth_token=self.redis_token.secret_value.unsafe_unwrap(),
            cache_subnet_group_name=subnets.ref, cache_parameter_group_name=params.ref,
            security_group_ids=[self.redis_sg.security_group_id], port=REDIS_PORT,
            snapshot_retention_limit=7, auto_minor_version_upgrade=True)
        self.redis.apply_removal_policy(removal)

    def grant_history_read(self, grantee: iam.IGrantable) -> None:
        """Query and GetItem on the history table (GET /tasks, task status and audit of
        archived tasks), and decrypting its items."""
        self.tables["history"].grant(grantee, *HISTORY_READ_ACTIONS)
        self.key.grant_decrypt(grantee)

    def grant_history_write(self, grantee: iam.IGrantable) -> None:
        """PutItem and BatchWriteItem of pages and markers (the history drain), and the
        key's data keys to encrypt them."""
        self.tables["history"].grant(grantee, *HISTORY_WRITE_ACTIONS)
        self.key.grant_encrypt_decrypt(grantee)

    @property
    def redis_url(self) -> str:
        """The handlers' SKYFN_REDIS_URL (TLS); the AUTH token is added at cold start from
        SKYFN_REDIS_AUTH_SECRET_ARN, so it never sits in the function configuration."""
        return f"rediss://{self.redis.attr_primary_end_point_address}:{self.redis.attr_primary_end_point_port}/0"
