"""The hosted service: one module per Lambda handler (api, results, reaper, history),
the service core they share (lambdas/core) and adapters for DynamoDB and Redis."""

import os as _os

# AWS deployment: secrets named in SKYFN_SECRET_ENV enter the environment before any
# handler reads its settings (lambdas/core/identity/secret_env.py).
if _os.environ.get("SKYFN_SECRET_ENV"):
    from lambdas.core.identity.secret_env import load as _load_secrets

    _load_secrets()
