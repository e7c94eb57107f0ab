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

from typing import Sequence

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
# drain writes pages and markers (batch_writer: BatchWriteItem only), readers query pages
# and markers (Query only: nothing reads an item by its key).
HISTORY_READ_ACTIONS = ("dynamodb:Query",)
HISTORY_WRITE_ACTIONS = ("dynamodb:BatchWriteItem",)
# The data key as DynamoDB and S3 use it on a caller's behalf (moto does not check KMS): a
# reader of encrypted items or objects needs Decrypt and DescribeKey, a writer also the
# data keys (what CDK's grant_read / grant_read_write give for a customer-managed key).
KEY_READ_ACTIONS = ("kms:Decrypt", "kms:DescribeKey")
KEY_READ_WRITE_ACTIONS = (*KEY_READ_ACTIONS, "kms:Encrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*")
# ... and a reader of items that writes objects only through S3 (PutObject with SSE-KMS asks
# KMS for a data key; S3 never calls Encrypt or ReEncrypt for it)
KEY_READ_UPLOAD_ACTIONS = (*KEY_READ_ACTIONS, "kms:GenerateDataKey*")

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
        """Query on the history table (GET /tasks, task status and audit of archived tasks).
        The key comes with the grantee's other data access (`grant_key`)."""
        self.grant_table(grantee, "HistoryRead", "history", HISTORY_READ_ACTIONS)

    def grant_history_write(self, grantee: iam.IGrantable) -> None:
        """BatchWriteItem of pages and markers (the history drain). The key: `grant_key`."""
        self.grant_table(grantee, "HistoryWrite", "history", HISTORY_WRITE_ACTIONS)

    def grant_table(self, grantee: iam.IGrantable, sid: str, table: str, actions: Sequence[str],
                    indexes: bool = False) -> None:
        """Exactly `actions` on one table (and its indexes: Query on owner-index), instead of
        CDK's grant_read_data / grant_read_write_data, which add Scan, ConditionCheckItem,
        DescribeTable, BatchGetItem, stream reads and every write (issue 25)."""
        arn = self.tables[table].table_arn
        grantee.grant_principal.add_to_principal_policy(iam.PolicyStatement(
            sid=sid, actions=list(actions), resources=[arn, f"{arn}/index/*"] if indexes else [arn]))

    def grant_key(self, grantee: iam.IGrantable, write: bool, uploads: bool = False) -> None:
        """The data key, for the tables and bucket the grantee reads (`write`: and writes;
        `uploads`: and only puts objects, or signs forms that put them)."""
        actions = KEY_READ_WRITE_ACTIONS if write else KEY_READ_UPLOAD_ACTIONS if uploads else KEY_READ_ACTIONS
        grantee.grant_principal.add_to_principal_policy(iam.PolicyStatement(
            sid="DataKey", actions=list(actions), resources=[self.key.key_arn]))

    def grant_objects(self, grantee: iam.IGrantable, sid: str, actions: Sequence[str], prefixes: Sequence[str]) -> None:
        """Exactly `actions` on the payload bucket's objects under `prefixes` (instead of
        CDK's grant_read_write: GetBucket*, List*, DeleteObject*, PutObjectLegalHold/Retention/
        Tagging/VersionTagging, Abort*). Object keys: batches/<batch>/... (staged batches),
        args/<user>/... (uploads), results/<endpoint>/<task> (large results)."""
        grantee.grant_principal.add_to_principal_policy(iam.PolicyStatement(
            sid=sid, actions=list(actions), resources=[self.bucket.arn_for_objects(f"{p}*") for p in prefixes]))

    @property
    def redis_url(self) -> str:
        """The handlers' SKYFN_REDIS_URL (TLS); the AUTH token is added at cold start from
        SKYFN_REDIS_AUTH_SECRET_ARN, so it never sits in the function configuration."""
        return f"rediss://{self.redis.attr_primary_end_point_address}:{self.redis.attr_primary_end_point_port}/0"
