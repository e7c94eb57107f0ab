"""What the local machine puts in place of the cloud's addresses when the templates are
run locally: account and region (moto's defaults), the moto endpoint, the local redis
(standing in for ElastiCache), the local gateway and WebSocket URLs (standing in for API
Gateway) and the host of the rendezvous server (standing in for its load balancer)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from infra.local.templates.intrinsics import DEFAULT_ACCOUNT, DEFAULT_REGION


@dataclass(frozen=True)
class LocalSettings:
    # None: the account/region the assembly was synthesized for, else moto's defaults
    region: str | None = None
    account: str | None = None
    partition: str = "aws"
    url_suffix: str = "amazonaws.com"
    aws_endpoint_url: str | None = None        # moto server; None: the real AWS URL formats
    redis_host: str = "127.0.0.1"
    redis_port: int = 6379
    redis_url: str | None = None               # as the runtime connects (may carry a password)
    redis_tls: bool = False                    # False: a template's rediss:// URL becomes redis://
    gateway_url: str | None = None             # the local REST gateway (stands in for the RestApi stage)
    websocket_url: str | None = None           # wss:// URL clients connect to (the WebSocket API stage)
    websocket_management_url: str | None = None  # https:// URL handlers post to (@connections)
    rendezvous_host: str = "127.0.0.1"         # the load balancer's DNS name locally
    parameters: Mapping[str, Any] = field(default_factory=dict)  # template parameters, see Resolver

    def with_environment(self, account: str | None, region: str | None) -> "LocalSettings":
        """These settings with account/region filled in: from the assembly, else moto's."""
        return replace(self, account=self.account or account or DEFAULT_ACCOUNT,
                       region=self.region or region or DEFAULT_REGION)
