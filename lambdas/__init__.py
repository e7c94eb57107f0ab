"""The hosted service: one module per Lambda handler (api, results, reaper, history),
the service core they share (lambdas/core) and adapters for DynamoDB and Redis."""

import os as _os

# AWS deployment: secrets named in SKYFN_SECRET_ENV enter the environment before any
# handler reads its settings (lambdas/core/identity/secret_env.py).
if _os.environ.get("SKYFN_SECRET_ENV"):
    from lambdas.core.identity.secret_env import load as _load_secrets

    _load_secrets()

# AWS deployment: the starting handler's function must set what it requires
# (lambdas/settings_catalog.py); after the secrets, which count as set.
if _os.environ.get("SKYFN_SETTINGS_CHECK"):
    from lambdas.settings_catalog import check_started as _check_settings

    _check_settings()
