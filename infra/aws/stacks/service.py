"""Service stack: the handlers of lambdas/ as Lambda functions (arm64, in the VPC, the
dependency layer with Powertools), the REST API in front of lambdas.api, the results
queue and its dead-letter queue feeding lambdas.results, the schedules of the reaper and
the history drain, and the alarms and dashboard that watch them.

Per-endpoint task and control queues are not created here: the API creates them at
endpoint registration (skyfn.protocol.queues.SqsQueue.ensure) under the stage's name
prefix, so the roles that touch them are scoped to `<prefix>-tasks-*` and
`<prefix>-control-*`. Each function's role holds only the tables, queues and secrets
that its handler's code uses.
"""
from __future__ import annotations

import dataclasses

from aws_cdk import ArnFormat, CfnOutput, Duration, Names, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_cognito as cognito
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.aws import packaging, sizing
from infra.aws.config import (ARCHITECTURE, AUTHORIZER, FUNCTIONS, PUSH_FUNCTIONS, PYTHON_RUNTIME,
                              RESULTS_BATCH_SIZE, RESULTS_BATCH_WINDOW_S, RESULTS_MAX_CONCURRENCY, DeployConfig,
                              FunctionSpec)
from infra.aws.stacks.common import retention
from infra.aws.stacks.data import DataStack
from infra.aws.stacks.push import ResultsPush
from infra.aws.stacks.status_page import StatusPage
from lambdas.settings_catalog import CHECK_VARIABLE, STRICT
from stepfunctions import catalog

# What the handlers read (lambdas/config.py); the queues are created to match.
LEASE_SECONDS = 60
MAX_DELIVERIES = 5
SCHEDULE_MINUTES = {"reaper": 1, "history": sizing.SCHEDULE_PERIOD_S // 60}
STAGE_METRICS = ("StageServiceMs", "StageWaitingMs", "StageQueueMs", "StageDispatchMs", "StageRunMs", "StageReturnMs")
SQS_ENDPOINT_QUEUE_ACTIONS = ["sqs:CreateQueue", "sqs:GetQueueUrl", "sqs:GetQueueAttributes",
                              "sqs:SetQueueAttributes"]


def queue_arn(stack: Stack, name: str) -> str:
    return stack.format_arn(service="sqs", resource=name)


def agent_role_name(config: DeployConfig) -> str:
    """Fixed, so the API's policy names the agent role without a cross-stack cycle."""
    return f"{config.prefix}-agent"


def flow_role_name(config: DeployConfig) -> str:
    """The role of state machines compiled from flows (workflows stack), named for the same reason."""
    return f"{config.prefix}-flow"


class ServiceStack(Stack):
    def __init__(self, scope: Construct, cid: str, *, config: DeployConfig, vpc: ec2.IVpc,
                 lambda_sg: ec2.ISecurityGroup, data: DataStack, **kwargs):
        super().__init__(scope, cid, **kwargs)
        self.config = config
        self.vpc, self.lambda_sg, self.data = vpc, lambda_sg, data
        prefix = config.prefix
        self.layer = lambda_.LayerVersion(
            self, "Deps", code=packaging.dependency_layer_code(),
            compatible_runtimes=[_runtime()], compatible_architectures=[_architecture()],
            description="skyfn handlers' dependencies: Powertools, pydantic, redis, orjson, PyJWT (pinned)")
        if config.auth == "cognito":
            self._user_pool()

        self.alarm_key = kms.Key(self, "AlarmTopicKey", enable_key_rotation=True,
                                 description=f"{prefix}: alarm topic")
        self.alarm_key.grant_encrypt_decrypt(iam.ServicePrincipal("cloudwatch.amazonaws.com"))
        self.alarm_topic = sns.Topic(self, "Alarms", topic_name=f"{prefix}-alarms", master_key=self.alarm_key,
                                     enforce_ssl=True)
        if config.alarm_email:
            self.alarm_topic.add_subscription(subs.EmailSubscription(config.alarm_email))

        # --- queues ---------------------------------------------------------------
        self.results_dlq = sqs.Queue(self, "ResultsDlq", queue_name=f"{prefix}-results-dlq",
                                     encryption=sqs.QueueEncryption.SQS_MANAGED, enforce_ssl=True,
                                     retention_period=Duration.days(14))
        self.results_queue = sqs.Queue(
            self, "ResultsQueue", queue_name=f"{prefix}-results", encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True, visibility_timeout=Duration.seconds(LEASE_SECONDS),
            dead_letter_queue=sqs.DeadLetterQueue(queue=self.results_dlq, max_receive_count=MAX_DELIVERIES))
        self.schedule_dlq = sqs.Queue(self, "ScheduleDlq", queue_name=f"{prefix}-schedule-dlq",
                                      encryption=sqs.QueueEncryption.SQS_MANAGED, enforce_ssl=True,
                                      retention_period=Duration.days(14))
        self.endpoint_queue_arns = [queue_arn(self, f"{prefix}-tasks-*"), queue_arn(self, f"{prefix}-control-*")]

        # --- functions ------------------------------------------------------------
        # the API issues rendezvous group tokens (POST /rendezvous/tokens): it signs them with
        # the rendezvous secret; the server's address is added by the app (rendezvous stack)
        # the history drainers' reserved concurrency follows their number (infra/aws/sizing.py)
        specs = {**FUNCTIONS, "history": dataclasses.replace(
            FUNCTIONS["history"], reserved_concurrency=sizing.reserved_concurrency(config.history_drainers))}
        self.functions: dict[str, lambda_.Function] = {
            key: self.function(spec, secrets={"SKYFN_RENDEZVOUS_SECRET": data.rendezvous_secret} if key == "api"
                               else None)
            for key, spec in specs.items()}
        api_fn, results_fn = self.functions["api"], self.functions["results"]
        reaper_fn, history_fn = self.functions["reaper"], self.functions["history"]
        tables = data.tables

        # api: registry reads/writes, task history reads; creates endpoint queues, sends
        # task packs and cancel notices; reads their depth; (re)declares the results queue.
        # (lambdas/adapters/dynamodb.py and the endpoints-table items of lambdas/core/identity:
        # no Scan, BatchGet, delete or stream read anywhere; issue 25)
        data.grant_table(api_fn, "RegistryFunctions", "functions", ["dynamodb:GetItem", "dynamodb:PutItem"])
        data.grant_table(api_fn, "RegistryEndpoints", "endpoints", [
            "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Query"], indexes=True)
        data.grant_history_read(api_fn)  # GET /tasks, status and audit of archived tasks
        data.grant_key(api_fn, write=True)  # registry items and staged batches are written
        api_fn.add_to_role_policy(self.endpoint_queue_statement(send=True))
        api_fn.add_to_role_policy(iam.PolicyStatement(
            sid="ResultsQueueDeclare", actions=SQS_ENDPOINT_QUEUE_ACTIONS,
            resources=[self.results_queue.queue_arn, self.results_dlq.queue_arn]))
        # Agent credentials: the API hands an endpoint agent a session of the agent role
        # narrowed to its own queues (lambdas/core/identity/agent_credentials.py).
        self.agent_role_arn = self.format_arn(service="iam", region="", resource="role",
                                              resource_name=agent_role_name(config))
        api_fn.add_to_role_policy(iam.PolicyStatement(sid="AgentSessions", actions=["sts:AssumeRole"],
                                                      resources=[self.agent_role_arn]))
        api_fn.add_environment("SKYFN_AGENT_ROLE_ARN", self.agent_role_arn)
        api_fn.add_environment("SKYFN_AGENT_QUEUE_ARN_PREFIX", queue_arn(self, prefix))
        self._workflow_access(api_fn)

        # results: consumes the results queue through an event-source mapping. Made as
        # SqsEventSource makes it (same construct id: same logical id, nothing replaced on
        # deploy), but with what Lambda's poller calls with the function's role (the
        # AWSLambdaSQSQueueExecutionRole set) instead of grantConsumeMessages, which adds
        # ChangeMessageVisibility and GetQueueUrl that nothing calls (issue 25).
        results_fn.add_event_source_mapping(
            f"SqsEventSource:{Names.node_unique_id(self.results_queue.node)}",
            event_source_arn=self.results_queue.queue_arn, batch_size=RESULTS_BATCH_SIZE,
            max_batching_window=Duration.seconds(RESULTS_BATCH_WINDOW_S) if RESULTS_BATCH_WINDOW_S else None,
            report_batch_item_failures=True, max_concurrency=RESULTS_MAX_CONCURRENCY)
        results_fn.add_to_role_policy(iam.PolicyStatement(
            sid="ResultsQueueConsume", actions=["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"],
            resources=[self.results_queue.queue_arn]))
        # ... and releases the dependents of the tasks it finished (task graphs, issue 26):
        # declares endpoint task queues and sends them packs (never a control queue)
        results_fn.add_to_role_policy(self.endpoint_queue_statement(send=True, control=False))
        # (its GetItem on the endpoints table also reads an endpoint's credential hash, which its
        # results key comes from, when Redis lost it: lambdas/core/identity/result_seals.py)
        self._dataflow_release(results_fn)

        # reaper: re-declares endpoint queues, drains their dead-letter queues; sends the
        # dependents its sweep releases (a release whose sender died, a cascade cut short)
        reaper_fn.add_to_role_policy(self.endpoint_queue_statement(send=True, receive=True))
        self._dataflow_release(reaper_fn)

        # history: bulk writes of submissions, finished tasks in pages (issue 24).
        data.grant_table(history_fn, "SubmissionsWrite", "submissions", ["dynamodb:BatchWriteItem"])  # batch_writer
        data.grant_history_write(history_fn)
        data.grant_key(history_fn, write=True)
        history_fn.add_environment("SKYFN_HISTORY_TTL_DAYS", str(config.history_ttl_days))
        history_fn.add_environment("SKYFN_HISTORY_BATCH", str(sizing.HISTORY_BATCH))
        history_fn.add_environment("SKYFN_HISTORY_DRAIN_MARGIN_S", str(sizing.HISTORY_DRAIN_MARGIN_S))

        # Schedules. The history rule has one target per drainer (input {"drainer": i}): the
        # drainers start together every minute and drain concurrently while there is a
        # backlog (docs/deploy.md, "Archival capacity").
        self.schedules: dict[str, events.Rule] = {}
        for key, minutes in SCHEDULE_MINUTES.items():
            copies = config.history_drainers if key == "history" else 1
            self.schedules[key] = events.Rule(
                self, f"{key.capitalize()}Schedule", schedule=events.Schedule.rate(Duration.minutes(minutes)),
                description=f"runs {FUNCTIONS[key].handler} every {minutes} min"
                + (f", {copies} concurrent drainers" if key == "history" else ""),
                targets=[targets.LambdaFunction(
                    self.functions[key], dead_letter_queue=self.schedule_dlq, retry_attempts=2,
                    max_event_age=Duration.minutes(5),
                    event=events.RuleTargetInput.from_object({"drainer": i}) if key == "history" else None)
                    for i in range(copies)])

        self.api = self._rest_api(api_fn)
        self._action_provider(api_fn)
        # the results push: WebSocket API, connection table; every function here that writes
        # final states posts them (issue 13; the workflows stack's steps too, grant_push)
        self.push = ResultsPush(self, "ResultsPush", service=self,
                                pushers=[self.functions[key] for key in PUSH_FUNCTIONS])
        # the status page at /ui, told where the WebSocket API is (issue 13)
        self.status_page = StatusPage(self, "StatusPage", service=self, api=self.api, ws_url=self.push.stage.url,
                                      runtime=_runtime(), architecture=_architecture())
        self.functions["ui"] = self.status_page.function  # its errors and throttles alarm too
        self._alarms()
        self._dashboard()

    # --- building blocks ----------------------------------------------------------
    def _action_provider(self, api_fn: lambda_.Function) -> None:
        """The Globus Flows action provider (lambdas/action_provider.py): served by the API
        function under /flows-ap (the {proxy+} resource, the API's authorizer). Its scope is the
        Globus app's `action_all` scope with auth=globus (what Globus Flows asks a token for);
        with Cognito the routes work for Cognito tokens, but Globus Flows cannot call them."""
        if self.config.auth == "globus":
            scope = f"https://auth.globus.org/scopes/{self.config.globus_audience}/action_all"
        else:
            scope = f"{self.config.prefix}:flows-ap:all"
        api_fn.add_environment("SKYFN_AP_SCOPE", scope)
        api_fn.add_environment("SKYFN_AP_ADMIN_CONTACT", self.config.alarm_email or f"{self.config.prefix} administrators")
        CfnOutput(self, "ActionProviderUrl", value=self.api.url_for_path("/flows-ap"),
                  description="Globus Flows action provider of skyfn: the URL a flow's Action state names")

    def endpoint_queue_statement(self, send: bool = False, receive: bool = False,
                                 control: bool = True) -> iam.PolicyStatement:
        """Declare (create if missing, read and align attributes) the stage's endpoint
        queues; optionally send task packs to them or drain them (dead letters).
        `control=False`: the task queues only (`<prefix>-tasks-*`, their `-dlq` too)."""
        actions = list(SQS_ENDPOINT_QUEUE_ACTIONS)
        if send:
            actions.append("sqs:SendMessage")
        if receive:
            actions += ["sqs:ReceiveMessage", "sqs:DeleteMessage"]
        return iam.PolicyStatement(sid="EndpointQueues", actions=actions,
                                   resources=self.endpoint_queue_arns if control else self.endpoint_queue_arns[:1])

    def _dataflow_release(self, fn: lambda_.Function) -> None:
        """What sending released dependents needs besides their queues (lambdas/core/tasks/
        dataflow.py `release`, run by the results function and the reaper):
        - the bodies of their functions: `registry.function_bodies` reads the functions table
          when a body is not in Redis, and a function shared with the submitter its share
          item in the endpoints table (`access.grants`): GetItem only;
        - the envelope of a dependent's arguments and its inputs' results, put under `args/`
          when too large to travel in its pack (`blobs.put_payload`); presigned GETs of its
          uploaded arguments (`args/`) and of inputs' results kept in S3 (`results/`), which
          the agent fetches with this role's signature; each pack's result-upload form for
          `results/<endpoint>/` (`blobs.result_upload`), which the agent posts with it;
        - the data key: Decrypt/DescribeKey for the encrypted items and objects read,
          GenerateDataKey* for the objects put (no Encrypt/ReEncrypt: no item is written)."""
        data = self.data
        for table in ("functions", "endpoints"):
            data.grant_table(fn, f"Registry{table.capitalize()}Read", table, ["dynamodb:GetItem"])
        data.grant_objects(fn, "PayloadWrites", ["s3:PutObject"], ["args/", "results/"])
        data.grant_objects(fn, "PayloadReads", ["s3:GetObject"], ["args/", "results/"])
        data.grant_key(fn, write=False, uploads=True)

    def _workflow_access(self, api_fn: lambda_.Function) -> None:
        """The API starts the catalog's state machines, creates the state machines of
        flows under `<prefix>-flow-*` with the flow role, and stages batches in the
        bucket. ARNs are built from the fixed names (the workflows stack depends on this one)."""
        p = self.config.prefix
        colon = ArnFormat.COLON_RESOURCE_NAME
        machines = [catalog.machine_name(p, m) for m in catalog.MACHINES.values()]
        flow_machines = f"{p}-{catalog.FLOW_MACHINE_PREFIX}-*"
        machine_arns = [self.format_arn(service="states", resource="stateMachine", resource_name=n, arn_format=colon)
                        for n in [*machines, flow_machines]]
        execution_arns = [self.format_arn(service="states", resource="execution", resource_name=f"{n}:*",
                                          arn_format=colon) for n in [*machines, flow_machines]]
        flow_role_arn = self.format_arn(service="iam", region="", resource="role", resource_name=flow_role_name(self.config))
        api_fn.add_to_role_policy(iam.PolicyStatement(sid="StartWorkflows", actions=["states:StartExecution"],
                                                      resources=machine_arns))
        # runs' status (DescribeExecution; its failure from the history when an emulator
        # leaves it out); nothing stops an execution (lambdas/core/runs/runs.py)
        api_fn.add_to_role_policy(iam.PolicyStatement(
            sid="WatchWorkflows", actions=["states:DescribeExecution", "states:GetExecutionHistory"],
            resources=execution_arns))
        # lambdas/adapters/aws.py ensure_machine: create, or update when the name exists with
        # another definition (no tags, no describe)
        api_fn.add_to_role_policy(iam.PolicyStatement(
            sid="CompileFlows", actions=["states:CreateStateMachine", "states:UpdateStateMachine"],
            resources=[machine_arns[-1]]))
        api_fn.add_to_role_policy(iam.PolicyStatement(
            sid="PassFlowRole", actions=["iam:PassRole"], resources=[flow_role_arn],
            conditions={"StringEquals": {"iam:PassedToService": "states.amazonaws.com"}}))
        # staged batches (put_json), presigned upload forms for arguments and results, and
        # presigned GETs of them (lambdas/core/tasks/blobs.py); the data key: grant_key above
        self.data.grant_objects(api_fn, "PayloadWrites", ["s3:PutObject"], ["batches/", "args/", "results/"])
        self.data.grant_objects(api_fn, "PayloadReads", ["s3:GetObject"], ["args/", "results/"])
        run_task = next(s for s in catalog.STEPS.values() if s.key == "RunTask")
        env = {
            "SKYFN_BATCH_FANOUT_ARN": machine_arns[machines.index(catalog.machine_name(p, catalog.BATCH_FANOUT))],
            "SKYFN_SPMD_GROUP_ARN": machine_arns[machines.index(catalog.machine_name(p, catalog.SPMD_GROUP))],
            "SKYFN_RUN_TASK_FUNCTION_ARN": self.format_arn(
                service="lambda", resource="function", resource_name=catalog.function_name(p, run_task),
                arn_format=colon),
            "SKYFN_FLOW_ROLE_ARN": flow_role_arn,
            "SKYFN_STATE_MACHINE_PREFIX": p,
        }
        missing = sorted(set(catalog.API_ENV) - set(env) - {"SKYFN_BUCKET"})
        if missing:
            raise RuntimeError(f"stepfunctions.catalog.API_ENV names {missing}, which the service stack does not set")
        for name, value in env.items():
            api_fn.add_environment(name, value)

    def environment(self) -> dict[str, str]:
        """The variables lambdas/config.py reads, for this deployment."""
        c, d = self.config, self.data
        return {
            "SKYFN_REDIS_URL": d.redis_url,
            "SKYFN_QUEUE_KIND": "sqs",
            "SKYFN_TABLE_PREFIX": c.prefix,
            "SKYFN_SQS_PREFIX": c.prefix,
            "SKYFN_BUCKET": d.bucket.bucket_name,
            "SKYFN_AUTH_PROVIDER": c.auth,
            "SKYFN_AUTH_ISSUER": self.auth_issuer,
            "SKYFN_LEASE_SECONDS": str(LEASE_SECONDS),
            "SKYFN_MAX_DELIVERIES": str(MAX_DELIVERIES),
            # backpressure: the API, the steps that submit and the history drain's warning agree
            "SKYFN_BACKLOG_MAX": str(c.backlog_max),
            "SKYFN_BACKLOG_MEMORY_FRACTION": repr(float(c.backlog_memory_fraction)),
            "POWERTOOLS_METRICS_NAMESPACE": "skyfn",
            "POWERTOOLS_LOG_LEVEL": "INFO",
            "POWERTOOLS_TRACE_DISABLED": "true",
            # a function missing a variable its handler requires fails at cold start, naming it
            CHECK_VARIABLE: STRICT,
        }

    @property
    def auth_issuer(self) -> str:
        if self.config.auth == "globus":
            return self.config.globus_issuer
        return f"https://cognito-idp.{self.region}.amazonaws.com/{self.user_pool.user_pool_id}"

    def function(self, spec: FunctionSpec, scope: Construct | None = None, extra_env: dict[str, str] | None = None,
                 secrets: dict[str, secretsmanager.ISecret] | None = None,
                 function_name: str | None = None) -> lambda_.Function:
        """A handler of lambdas/ with the shared code, layer, VPC placement and env. Its
        role starts with only logs, X-Ray, VPC networking and the secrets it reads:
        the Redis AUTH token and `secrets` (env name -> secret), which
        lambdas/core/identity/secret_env.py loads into the environment at cold start, so secret
        values never sit in the function's configuration."""
        scope = scope or self
        secrets = {"SKYFN_REDIS_PASSWORD": self.data.redis_token, **(secrets or {})}
        function_name = function_name or f"{self.config.prefix}-{spec.key}"
        cid = "".join(part[:1].upper() + part[1:] for part in spec.key.split("-"))
        log_group = logs.LogGroup(scope, f"{cid}Logs", log_group_name=f"/aws/lambda/{function_name}",
                                  retention=retention(self.config.log_retention_days))
        fn = lambda_.Function(
            scope, f"{cid}Function", function_name=function_name,
            description=spec.description, runtime=_runtime(), architecture=_architecture(),
            handler=spec.handler, code=packaging.function_code(), layers=[self.layer], memory_size=spec.memory_mb,
            timeout=Duration.seconds(spec.timeout_s), reserved_concurrent_executions=spec.reserved_concurrency,
            vpc=self.vpc, vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            security_groups=[self.lambda_sg], tracing=lambda_.Tracing.ACTIVE, log_group=log_group,
            environment={**self.environment(), "POWERTOOLS_SERVICE_NAME": f"skyfn-{spec.key}",
                         "SKYFN_SECRET_ENV": Stack.of(scope).to_json_string(
                             {name: secret.secret_arn for name, secret in secrets.items()}),
                         **(extra_env or {})})
        # GetSecretValue only: secret_env.py never describes a secret (CDK's grant_read adds
        # DescribeSecret; issue 25)
        fn.add_to_role_policy(iam.PolicyStatement(sid="ReadSecrets", actions=["secretsmanager:GetSecretValue"],
                                                  resources=[secret.secret_arn for secret in secrets.values()]))
        return fn

    def _user_pool(self) -> None:
        self.user_pool = cognito.UserPool(
            self, "Users", user_pool_name=f"{self.config.prefix}-users", self_sign_up_enabled=False,
            sign_in_aliases=cognito.SignInAliases(email=True), auto_verify=cognito.AutoVerifiedAttrs(email=True),
            mfa=cognito.Mfa.OPTIONAL, mfa_second_factor=cognito.MfaSecondFactor(sms=False, otp=True),
            password_policy=cognito.PasswordPolicy(min_length=12, require_symbols=True),
            account_recovery=cognito.AccountRecovery.EMAIL_ONLY,
            feature_plan=cognito.FeaturePlan.ESSENTIALS)
        self.user_pool_client = self.user_pool.add_client(
            "Sdk", user_pool_client_name=f"{self.config.prefix}-sdk", generate_secret=False,
            auth_flows=cognito.AuthFlow(user_srp=True), prevent_user_existence_errors=True)

    def _authorizer(self) -> apigw.IAuthorizer:
        if self.config.auth == "cognito":
            return apigw.CognitoUserPoolsAuthorizer(self, "CognitoAuthorizer", cognito_user_pools=[self.user_pool],
                                                    results_cache_ttl=Duration.minutes(5))
        fn = self.function(AUTHORIZER, extra_env={"SKYFN_AUTH_AUDIENCE": self.config.globus_audience or ""})
        self.functions["authorizer"] = fn
        return apigw.TokenAuthorizer(self, "GlobusAuthorizer", handler=fn, results_cache_ttl=Duration.minutes(5),
                                     validation_regex=r"^Bearer [-0-9A-Za-z._~+/]+=*$")

    def _rest_api(self, api_fn: lambda_.Function) -> apigw.RestApi:
        access_logs = logs.LogGroup(self, "ApiAccessLogs", retention=retention(self.config.log_retention_days))
        api = apigw.RestApi(
            self, "Api", rest_api_name=f"{self.config.prefix}-api", cloud_watch_role=True,
            endpoint_types=[apigw.EndpointType.REGIONAL],
            description="skyfn REST API (lambdas/api.py; OpenAPI at GET /openapi.json)",
            deploy_options=apigw.StageOptions(
                stage_name=self.config.stage, throttling_rate_limit=self.config.api_rate_limit,
                throttling_burst_limit=self.config.api_burst_limit, tracing_enabled=True, metrics_enabled=True,
                access_log_destination=apigw.LogGroupLogDestination(access_logs),
                access_log_format=apigw.AccessLogFormat.json_with_standard_fields(
                    caller=False, http_method=True, ip=True, protocol=True, request_time=True,
                    resource_path=True, response_length=True, status=True, user=True)))
        integration = apigw.LambdaIntegration(api_fn, proxy=True)
        authorizer = self._authorizer()
        api.root.add_method("ANY", integration, authorizer=authorizer)
        api.root.add_resource("{proxy+}").add_method("ANY", integration, authorizer=authorizer)
        # The OpenAPI document is the one public route (lambdas.api.PUBLIC_PATHS).
        api.root.add_resource("openapi.json").add_method("GET", integration,
                                                         authorization_type=apigw.AuthorizationType.NONE)
        return api

    def _alarms(self) -> None:
        action = cw_actions.SnsAction(self.alarm_topic)
        self.alarms: list[cw.Alarm] = []

        def alarm(cid: str, metric: cw.Metric, threshold: float, description: str) -> None:
            a = metric.create_alarm(self, cid, threshold=threshold, evaluation_periods=1,
                                    comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                                    treat_missing_data=cw.TreatMissingData.NOT_BREACHING, alarm_description=description)
            a.add_alarm_action(action)
            self.alarms.append(a)

        five = Duration.minutes(5)
        for key, fn in self.functions.items():
            name = key.capitalize()
            alarm(f"{name}Errors", fn.metric_errors(period=five, statistic="Sum"), 1,
                  f"{fn.function_name}: invocations failed")
            alarm(f"{name}Throttles", fn.metric_throttles(period=five, statistic="Sum"), 1,
                  f"{fn.function_name}: invocations throttled (reserved concurrency or account limit)")
        for cid, queue in (("ResultsDlqDepth", self.results_dlq), ("ScheduleDlqDepth", self.schedule_dlq)):
            alarm(cid, queue.metric_approximate_number_of_messages_visible(period=five, statistic="Maximum"), 1,
                  f"{cid}: messages were dead-lettered")
        alarm("ResultsBacklogAge", self.results_queue.metric_approximate_age_of_oldest_message(
            period=five, statistic="Maximum"), 300, "results wait more than 5 minutes to be applied")
        alarm("Api5xx", self.api.metric_server_error(period=five, statistic="Sum"), 1,
              "the API answered 5xx (the service answers bad input with 4xx)")
        alarm("HistoryBacklog", backlog_metric("OutboxLength", "Maximum", label=False),
              self.config.backlog_alarm_threshold,
              f"the history outbox holds half its bound of {self.config.backlog_max:,} unarchived records: the "
              "drainers are behind; at the bound submissions get 429 backlog (SKYFN_BACKLOG_MAX)")

    def _dashboard(self) -> None:
        board = cw.Dashboard(self, "Dashboard", dashboard_name=f"{self.config.prefix}-service")
        five = Duration.minutes(5)
        board.add_widgets(
            cw.GraphWidget(title="API requests and errors", width=12, left=[
                self.api.metric_count(period=five), self.api.metric_client_error(period=five),
                self.api.metric_server_error(period=five)]),
            cw.GraphWidget(title="API latency (p50, p99)", width=12, left=[
                self.api.metric_latency(period=five, statistic="p50"),
                self.api.metric_latency(period=five, statistic="p99")]))
        board.add_widgets(
            cw.GraphWidget(title="Lambda invocations", width=8,
                           left=[fn.metric_invocations(period=five) for fn in self.functions.values()]),
            cw.GraphWidget(title="Lambda errors and throttles", width=8,
                           left=[fn.metric_errors(period=five) for fn in self.functions.values()]
                           + [fn.metric_throttles(period=five) for fn in self.functions.values()]),
            cw.GraphWidget(title="Lambda duration p99", width=8,
                           left=[fn.metric_duration(period=five, statistic="p99") for fn in self.functions.values()]))
        # latency per stage from task events (lambdas/core/tasks/stage_metrics.py, EMF by the results function)
        def stage(name: str, statistic: str) -> cw.Metric:
            return cw.Metric(namespace="skyfn", metric_name=name, dimensions_map={"service": "results"},
                             statistic=statistic, period=five, label=f"{name} {statistic}")

        board.add_widgets(
            cw.GraphWidget(title="Task latency per stage (ms, mean of pack means)", width=12, stacked=True,
                           left=[stage(m, "Average") for m in STAGE_METRICS]),
            cw.GraphWidget(title="Task end to end (ms) and tasks measured", width=12,
                           left=[stage("TaskTotalMs", "Average"), stage("TaskTotalMs", "p99")],
                           right=[stage("TasksMeasured", "Sum")]))
        ws = self.push.api.api_id
        board.add_widgets(
            cw.GraphWidget(title="Results push (WebSocket API)", width=12, left=[
                cw.Metric(namespace="AWS/ApiGateway", metric_name=m, dimensions_map={"ApiId": ws}, statistic="Sum",
                          period=five) for m in ("ConnectCount", "MessageCount", "ClientError", "IntegrationError")]),
            cw.GraphWidget(title="Results stored per 5 min", width=12, left=[
                cw.Metric(namespace="skyfn", metric_name="ResultsStored", dimensions_map={"service": "results"},
                          statistic="Sum", period=five)]))
        board.add_widgets(
            cw.GraphWidget(title="Results queue", width=12, left=[
                self.results_queue.metric_approximate_number_of_messages_visible(period=five),
                self.results_queue.metric_approximate_age_of_oldest_message(period=five)]),
            cw.AlarmStatusWidget(title="Alarms", width=12, alarms=self.alarms))
        # the hot store's backlog (lambdas/core/tasks/backlog.py, EMF by the history drain)
        board.add_widgets(
            cw.GraphWidget(title="History backlog (outbox records, alarm at half the bound)", width=8,
                           left=[backlog_metric("OutboxLength", "Maximum")],
                           left_annotations=[cw.HorizontalAnnotation(value=self.config.backlog_alarm_threshold,
                                                                     label="HistoryBacklog alarm")]),
            cw.GraphWidget(title="Redis used bytes", width=8, left=[backlog_metric("RedisUsedBytes", "Maximum")]),
            cw.GraphWidget(title="Redis bytes per task record", width=8,
                           left=[backlog_metric("RedisBytesPerTask", "Average")]))


def backlog_metric(name: str, statistic: str, label: bool = True) -> cw.Metric:
    """A metric of the hot store's backlog gauge (namespace skyfn, service history); an alarm's
    has no label (a labelled metric makes CloudFormation's metric-math form of the alarm)."""
    return cw.Metric(namespace="skyfn", metric_name=name, dimensions_map={"service": "history"},
                     statistic=statistic, period=Duration.minutes(5), label=f"{name} {statistic}" if label else None)


def _runtime() -> lambda_.Runtime:
    return {"python3.11": lambda_.Runtime.PYTHON_3_11, "python3.12": lambda_.Runtime.PYTHON_3_12}[PYTHON_RUNTIME]


def _architecture() -> lambda_.Architecture:
    return lambda_.Architecture.ARM_64 if ARCHITECTURE == "arm64" else lambda_.Architecture.X86_64
