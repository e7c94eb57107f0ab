"""The results push in AWS (DESIGN.md 2, step 7; issue 13), a part of the service stack:

- an API Gateway WebSocket API with $connect (a Lambda REQUEST authorizer taking the REST
  API's tokens: lambdas.ws.authorizer), $disconnect and ``subscribe`` (two-way: answered
  with the subscription cursor) routes, all on lambdas.ws.handler;
- the connection table (owner, connection_id; TTL attribute ``expires``: API Gateway ends a
  connection after 2 hours, and a missed $disconnect must not leave it forever);
- every function that writes final task states pushes them (`grant_push`): the results
  function, the API (cancels, submission-time failures), the reaper (expired leases, dead
  letters) here, and the batch and task steps of the workflows stack (config.PUSH_FUNCTIONS,
  config.PUSH_STEPS). Each gets SKYFN_PUSH=apigw, SKYFN_CONNECTION_TABLE, SKYFN_WS_ENDPOINT
  and exactly what lambdas/core/tasks/push.py calls: Query (the owner's connections) and
  DeleteItem (gone ones) on the connection table, and ``execute-api:ManageConnections`` on
  POST @connections/* of this API's stage. No other function holds any of it.

The grants are added once the API and the table exist; a function of another stack (the
workflows stack, deployed after this one) references them through the stack's exports, so
the dependency runs one way only.
"""
from __future__ import annotations

from typing import Iterable

from aws_cdk import ArnFormat, CfnOutput, RemovalPolicy, Stack
from aws_cdk import aws_apigatewayv2 as apigwv2
from aws_cdk import aws_apigatewayv2_authorizers as authorizers
from aws_cdk import aws_apigatewayv2_integrations as integrations
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from infra.aws.config import WS_AUTHORIZER, WS_ROUTES

CONNECTION_TTL_ATTRIBUTE = "expires"
SUBSCRIBE_ROUTE = "subscribe"


class ResultsPush(Construct):
    def __init__(self, scope: Construct, cid: str, *, service, pushers: Iterable[lambda_.Function]):
        super().__init__(scope, cid)
        config = service.config
        prefix = config.prefix
        self.stage_name = config.stage
        self.table = dynamodb.Table(
            self, "ConnectionTable", table_name=f"{prefix}-connections",
            partition_key=dynamodb.Attribute(name="owner", type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name="connection_id", type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST, time_to_live_attribute=CONNECTION_TTL_ATTRIBUTE,
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            removal_policy=RemovalPolicy.DESTROY)  # connections only: nothing to keep

        auth_env = {"SKYFN_AUTH_AUDIENCE": config.globus_audience or ""} if config.auth == "globus" else {
            "SKYFN_AUTH_AUDIENCE": service.user_pool_client.user_pool_client_id}
        self.routes_fn = service.function(WS_ROUTES, scope=self,
                                          extra_env={"SKYFN_CONNECTION_TABLE": self.table.table_name})
        self.authorizer_fn = service.function(WS_AUTHORIZER, scope=self, extra_env=auth_env)
        integration = integrations.WebSocketLambdaIntegration("Routes", self.routes_fn)
        authorizer = authorizers.WebSocketLambdaAuthorizer(
            "TokenAuthorizer", self.authorizer_fn,
            # the header (SDK) or ?token= (browsers): both reach the function, which checks them
            identity_source=[])
        self.api = apigwv2.WebSocketApi(
            self, "Api", api_name=f"{prefix}-ws",
            description="skyfn results push (skyfn.protocol.push): connect with the REST API's token, subscribe",
            connect_route_options=apigwv2.WebSocketRouteOptions(integration=integration, authorizer=authorizer),
            disconnect_route_options=apigwv2.WebSocketRouteOptions(integration=integration),
            route_selection_expression="$request.body.action")
        self.api.add_route(SUBSCRIBE_ROUTE, integration=integration, return_response=True)
        self.stage = apigwv2.WebSocketStage(self, "Stage", web_socket_api=self.api, stage_name=config.stage,
                                            auto_deploy=True,
                                            throttle=apigwv2.ThrottleSettings(rate_limit=config.api_rate_limit,
                                                                              burst_limit=config.api_burst_limit))

        # routes: record and forget connections; the subscription cursor comes from Redis
        self.routes_fn.add_to_role_policy(iam.PolicyStatement(
            sid="ConnectionTableWrite", actions=["dynamodb:PutItem", "dynamodb:DeleteItem"],
            resources=[self.table.table_arn]))
        # the functions that write final states: the owner's connections, gone ones deleted,
        # and posting to this stage only
        for fn in pushers:
            self.grant_push(fn)
        stack = Stack.of(self)
        CfnOutput(stack, "WebSocketUrl", value=self.stage.url,
                  description="the results push: set SKYFN_WS_URL to this for the SDK")

    def grant_push(self, fn: lambda_.Function) -> None:
        """Let `fn` push final states (lambdas/core/tasks/push.py, adapter ``apigw``): what
        `connections` and `_post` call, on this table and this stage, nothing more. The ARN
        and URL are built in `fn`'s own stack (its partition, region, URL suffix); only the
        API id and the table cross a stack boundary."""
        stack = Stack.of(fn)
        manage_arn = stack.format_arn(
            service="execute-api", resource=self.api.api_id,
            resource_name=f"{self.stage_name}/POST/@connections/*", arn_format=ArnFormat.SLASH_RESOURCE_NAME)
        fn.add_to_role_policy(iam.PolicyStatement(
            sid="ConnectionTableRead", actions=["dynamodb:Query", "dynamodb:DeleteItem"],
            resources=[self.table.table_arn]))
        fn.add_to_role_policy(iam.PolicyStatement(
            sid="PostToConnections", actions=["execute-api:ManageConnections"], resources=[manage_arn]))
        fn.add_environment("SKYFN_PUSH", "apigw")
        fn.add_environment("SKYFN_CONNECTION_TABLE", self.table.table_name)
        fn.add_environment("SKYFN_WS_ENDPOINT", self.endpoint_url(stack))

    def endpoint_url(self, stack: Stack) -> str:
        """The stage's https URL (the Management API's endpoint), as `stack` writes it."""
        return f"https://{self.api.api_id}.execute-api.{stack.region}.{stack.url_suffix}/{self.stage_name}"
