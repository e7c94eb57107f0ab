"""Deployments of skyfn: infra/aws (CDK app) and infra/local (the embedded runtime)."""
