"""What each optional part of skyfn needs installed, and a clear error when it is not.

`pip install skyfn` is the SDK and CLI alone. The `skyfn local`, `skyfn rendezvous` and
`skyfn-endpoint` commands reach into parts installed with extras (pyproject.toml):

    pip install 'skyfn[endpoint]'   the endpoint agent (skyfn-endpoint)
    pip install 'skyfn[local]'      the embedded runtime (skyfn local up)
    pip install 'skyfn[comm]'       the communicator (compiled), numpy, pyarrow
    pip install 'skyfn[report]'     the figures of `skyfn report`
    pip install 'skyfn[all]'        all of these (not the CDK app: skyfn[aws])

`require(extra, what)` checks, without importing anything, that the extra's modules can be
found, and raises MissingExtra naming the command, the missing modules and the pip line.

Plugins: the SDK imports nothing of infra/, lambdas/ or endpoint_agent/. Commands of other
parts reach it through entry points (importlib.metadata, as pytest finds its plugins): group
`skyfn.cli`, a typer app the `skyfn` CLI adds as `skyfn NAME`; group `skyfn.login`, a function
behind `skyfn login --NAME`; group `skyfn.endpoint`, the `agent` the `skyfn-endpoint` console
script runs. The embedded runtime registers `local` in the first two (infra/local/cli.py), the
endpoint agent `agent` in the third (endpoint_agent/cli.py). A plugin that is not registered
answers like a missing extra (`missing_plugin`).
"""
from __future__ import annotations

import importlib.util
from typing import Any, Optional

# extra -> top-level modules it brings (the ones its code imports)
MODULES: dict[str, tuple[str, ...]] = {
    "endpoint": ("zmq", "psutil", "redis", "globus_sdk", "boto3", "endpoint_agent"),
    "local": ("zmq", "psutil", "redis", "boto3", "moto", "aws_lambda_powertools", "jwt", "cryptography",
              "lambdas", "infra", "endpoint_agent"),
    "comm": ("comm", "numpy", "pyarrow"),
    "report": ("matplotlib", "numpy"),
}


class MissingExtra(ImportError):
    """A command needs a part of skyfn this installation does not have."""


def missing(extra: str) -> list[str]:
    """The modules of `extra` that cannot be found here (none imported)."""
    out = []
    for name in MODULES[extra]:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(name)
    return out


def require(extra: str, what: str) -> None:
    """Raise MissingExtra unless `extra` is installed; `what` names the command."""
    absent = missing(extra)
    if absent:
        raise MissingExtra(f"{what} needs skyfn[{extra}], which is not installed here (missing: "
                           f"{', '.join(absent)}): pip install 'skyfn[{extra}]'")


CLI_PLUGINS = "skyfn.cli"
LOGIN_PLUGINS = "skyfn.login"
ENDPOINT_PLUGINS = "skyfn.endpoint"  # "agent": the main() of `skyfn-endpoint`
# plugin name -> the extra that brings what it needs
PLUGIN_EXTRAS: dict[str, str] = {"local": "local"}


def plugin_names(group: str) -> list[str]:
    """The names registered in entry point group `group` (from metadata; nothing imported)."""
    from importlib.metadata import entry_points

    return sorted({ep.name for ep in entry_points(group=group)})


def plugin(group: str, name: str) -> Optional[Any]:
    """The object plugin `name` of entry point group `group` provides (imported now), or None."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=group, name=name):
        return ep.load()
    return None


def missing_plugin(group: str, name: str, what: str, extra: Optional[str] = None) -> MissingExtra:
    """The error for `what` when plugin `name` is not registered: the extra's missing modules
    and pip line, as `require` says it; if none is missing, that the plugin is not registered
    (a checkout installed before its entry points existed: `pip install -e .` again).
    `extra`: the one that brings the plugin (default: PLUGIN_EXTRAS, else its name)."""
    extra = extra or PLUGIN_EXTRAS.get(name, name)
    try:
        require(extra, what)
    except MissingExtra as exc:
        return exc
    return MissingExtra(f"{what} needs skyfn[{extra}], whose commands are not registered here (no {name!r} "
                        f"entry point in {group!r}; in a checkout: pip install -e .): pip install 'skyfn[{extra}]'")


def endpoint_main() -> None:
    """The `skyfn-endpoint` console script: the agent's CLI (plugin `agent` of entry point group
    skyfn.endpoint, which the endpoint agent registers), or how to install it."""
    import sys

    what = "skyfn-endpoint (the endpoint agent)"
    try:
        require("endpoint", what)
    except MissingExtra as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    main = plugin(ENDPOINT_PLUGINS, "agent")
    if main is None:
        print(f"error: {missing_plugin(ENDPOINT_PLUGINS, 'agent', what, extra='endpoint')}", file=sys.stderr)
        raise SystemExit(1)
    main()
