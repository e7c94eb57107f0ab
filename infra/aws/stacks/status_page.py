"""The status page in AWS (issue 13), a part of the service stack: GET /ui and GET
/ui/{proxy+} on the REST API, proxied to a small function (lambdas.ui.handler) that serves
the files of lambdas/ui_assets, the same ones the embedded runtime's gateway serves.

- No authorizer on these two methods only: the files hold no data, and the page sends the
  user's token on every call it makes (REST API with its authorizer; the WebSocket API's
  $connect authorizer takes it as ?token=). Every other method keeps its authorizer.
- Served by the REST API itself, the page is on the API's origin: its data calls need no
  CORS, and a custom domain in front of the API serves the page too.
- The function is out of the VPC and its role holds no table, queue, bucket, Redis or
  secret: only logs and X-Ray. Its environment holds SKYFN_WS_URL (config.json) and no
  data settings.
"""
from __future__ import annotations

from aws_cdk import CfnOutput, Duration, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.aws import packaging
from infra.aws.config import UI
from infra.aws.stacks.common import retention
from lambdas.settings_catalog import CHECK_VARIABLE, STRICT


class StatusPage(Construct):
    def __init__(self, scope: Construct, cid: str, *, service, api: apigw.RestApi, ws_url: str,
                 runtime: lambda_.Runtime, architecture: lambda_.Architecture):
        super().__init__(scope, cid)
        config = service.config
        name = f"{config.prefix}-{UI.key}"
        log_group = logs.LogGroup(self, "UiLogs", log_group_name=f"/aws/lambda/{name}",
                                  retention=retention(config.log_retention_days))
        self.function = lambda_.Function(
            self, "UiFunction", function_name=name, description=UI.description,
            runtime=runtime, architecture=architecture, handler=UI.handler,
            code=packaging.function_code(), layers=[service.layer], memory_size=UI.memory_mb,
            timeout=Duration.seconds(UI.timeout_s), reserved_concurrent_executions=UI.reserved_concurrency,
            tracing=lambda_.Tracing.ACTIVE, log_group=log_group,
            environment={"SKYFN_WS_URL": ws_url, "POWERTOOLS_SERVICE_NAME": f"skyfn-{UI.key}",
                         "POWERTOOLS_LOG_LEVEL": "INFO", CHECK_VARIABLE: STRICT})
        integration = apigw.LambdaIntegration(self.function, proxy=True)
        public = apigw.AuthorizationType.NONE
        page = api.root.add_resource("ui")
        page.add_method("GET", integration, authorization_type=public)
        page.add_resource("{proxy+}").add_method("GET", integration, authorization_type=public)
        CfnOutput(Stack.of(self), "StatusPageUrl", value=api.url_for_path("/ui/"),
                  description="the status page: sign in with the token `skyfn login` keeps")
