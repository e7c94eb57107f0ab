"""The cloud assembly the embedded runtime runs with `skyfn local up --from-templates`
(issue 25): every stack of stage `dev` synthesized for moto's account and region, without
bundling the Lambda layer (the templates do not depend on it, and no network is needed).

    .venv/cdk/bin/python -m infra.aws.synth_local build/cdk.out-local [key=value ...]

Extra `key=value` pairs are CDK context (e.g. auth=globus globus_audience=...).
"""
from __future__ import annotations

import sys

LOCAL_CONTEXT = {"aws:cdk:bundling-stacks": [], "stage": "dev", "region": "us-east-1", "account": "123456789012"}


def synth(outdir: str, context: dict | None = None) -> str:
    from infra.aws.app import build

    app, _ = build({**LOCAL_CONTEXT, **(context or {})}, outdir=outdir, environ={})
    app.synth()
    return outdir


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or "=" in args[0]:
        print("usage: python -m infra.aws.synth_local OUTDIR [key=value ...]", file=sys.stderr)
        return 2
    extra = dict(a.split("=", 1) for a in args[1:])
    print(synth(args[0], extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
