"""Every environment variable a handler requires is set by its function's template (issue 25):
each AWS::Lambda::Function of every stack, Cognito and Globus deployments alike, is held to
its handler's list in lambdas/settings_catalog.py -- a key of its Environment.Variables, or a
secret its SKYFN_SECRET_ENV names -- and sets no SKYFN_ variable its handler never reads.
Runs in .venv/cdk."""
from __future__ import annotations

import copy
import json

import pytest

from lambdas import settings_catalog as sc
from tests.aws.test_stacks import function, res

OURS = ("lambdas.", "stepfunctions.")  # the CDK's own functions (custom resources) are not skyfn's


def _text(value) -> str:
    """A template string value with its intrinsic parts (Ref, GetAtt...) as a placeholder."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        sep, parts = value["Fn::Join"]
        return sep.join(_text(p) for p in parts)
    return "TOKEN"


def secret_names(variables: dict) -> set[str]:
    raw = variables.get("SKYFN_SECRET_ENV")
    return set(json.loads(_text(raw))) if raw is not None else set()


def functions(raw: dict) -> list[tuple[str, str, str, dict]]:
    """(stack, function name, handler, environment variables) of each function of skyfn."""
    out = []
    for stack, template in raw.items():
        for lid, r in res(template, "AWS::Lambda::Function").items():
            p = r["Properties"]
            if p.get("Handler", "").startswith(OURS):
                out.append((stack, p.get("FunctionName", lid), p["Handler"], (p.get("Environment") or {}).get(
                    "Variables", {})))
    return out


def gaps(raw: dict) -> list[str]:
    """What a function's template lacks of its handler's requirements, one line each."""
    out = []
    for stack, name, handler, variables in functions(raw):
        entry = sc.HANDLERS.get(handler)
        if entry is None:
            out.append(f"{stack}/{name}: handler {handler} is not in lambdas/settings_catalog.py HANDLERS")
            continue
        have = set(variables) | secret_names(variables)
        out += [f"{stack}/{name}: {handler} requires {v}, which the function's environment does not set "
                f"(add it in {entry.template})" for v in sorted(entry.required - have)]
    return out


@pytest.mark.parametrize("variant", ["synth", "synth_globus"])
def test_every_function_sets_what_its_handler_requires(variant, request):
    assert gaps(request.getfixturevalue(variant)["raw"]) == []


@pytest.mark.parametrize("variant", ["synth", "synth_globus"])
def test_no_function_sets_a_skyfn_variable_its_handler_does_not_read(variant, request):
    unread = [f"{stack}/{name}: {v} ({handler} never reads it)"
              for stack, name, handler, variables in functions(request.getfixturevalue(variant)["raw"])
              for v in sorted(set(variables) | secret_names(variables))
              if v.startswith("SKYFN_") and v not in sc.HANDLERS[handler].reads]
    assert unread == []


@pytest.mark.parametrize("variant", ["synth", "synth_globus"])
def test_every_function_checks_its_settings_at_cold_start(variant, request):
    unchecked = [name for _, name, _, variables in functions(request.getfixturevalue(variant)["raw"])
                 if variables.get(sc.CHECK_VARIABLE) != sc.STRICT]
    assert unchecked == []


def test_every_handler_of_the_list_is_deployed(synth, synth_globus):
    deployed = {h for raw in (synth["raw"], synth_globus["raw"]) for _, _, h, _ in functions(raw)}
    assert deployed == set(sc.HANDLERS)


def test_secrets_count_and_a_missing_variable_is_named(synth):
    raw = copy.deepcopy(synth["raw"])
    _, api = function(raw["service"], "skyfn-ci-api")
    variables = api["Environment"]["Variables"]
    assert "SKYFN_REDIS_PASSWORD" not in variables and "SKYFN_REDIS_PASSWORD" in secret_names(variables)
    del variables["SKYFN_BUCKET"]
    variables["SKYFN_SECRET_ENV"] = "{}"
    assert gaps(raw) == [
        f"service/skyfn-ci-api: lambdas.api.handler requires {v}, which the function's environment does not set "
        "(add it in infra/aws/stacks/service.py)" for v in ("SKYFN_BUCKET", "SKYFN_REDIS_PASSWORD",
                                                            "SKYFN_RENDEZVOUS_SECRET")]
