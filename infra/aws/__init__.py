"""The AWS deployment of skyfn: a CDK app (python -m infra.aws.app; cdk.json at the
repository root points at it). config.py is importable without aws_cdk."""
