"""The runtime from the templates (infra/local/template_runtime.py): what it refuses before
starting anything, and what it puts in place of the services it cannot run. The run itself
is tests/e2e/test_template_iam.py and `make test-deploy`."""
from __future__ import annotations

import pytest

from infra.local import runtime, template_runtime
from infra.local.state import StateDir


def test_a_missing_cloud_assembly_names_the_folder_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("SKYFN_CDK_OUT", raising=False)
    with pytest.raises(template_runtime.TemplateRuntimeError) as err:
        template_runtime.cdk_out_dir(tmp_path / "nowhere")
    message = str(err.value)
    assert str(tmp_path / "nowhere") in message and "manifest.json" in message
    assert "make synth-local" in message and "--cdk-out" in message and "SKYFN_CDK_OUT" in message


def test_up_refuses_bad_combinations_before_starting_anything(tmp_path):
    (tmp_path / "cdk.out").mkdir()
    (tmp_path / "cdk.out" / "manifest.json").write_text("{}")
    home = tmp_path / "home"
    with pytest.raises(runtime.LocalError, match="--detach"):
        runtime.up(home, detach=False, from_templates=True, cdk_out=str(tmp_path / "cdk.out"), echo=lambda *_: None)
    with pytest.raises(runtime.LocalError, match="--aws-endpoint"):
        runtime.up(home, detach=True, from_templates=True, cdk_out=str(tmp_path / "cdk.out"),
                   aws_endpoint="http://127.0.0.1:1", echo=lambda *_: None)
    with pytest.raises(runtime.LocalError, match="manifest.json"):
        runtime.up(home, detach=True, from_templates=True, cdk_out=str(tmp_path / "empty"), echo=lambda *_: None)
    state = StateDir.at(home)
    assert not any(state.pidfile(name).exists() for name in ("redis", "moto", "service"))


def test_only_what_cannot_run_here_is_substituted(monkeypatch):
    monkeypatch.setenv("SKYFN_RENDEZVOUS_ADDRESS", "127.0.0.1:4242")
    local = template_runtime.LocalSide("http://127.0.0.1:5000", "redis://default:pw@127.0.0.1:6390/0",
                                       "/keys/jwks.json", "http://127.0.0.1:8000")
    template = {"SKYFN_AUTH_PROVIDER": "cognito", "SKYFN_AUTH_ISSUER": "https://cognito-idp.example/pool",
                "SKYFN_PUSH": "apigw", "SKYFN_RENDEZVOUS_ADDRESS": "nlb.example:7300", "SKYFN_BUCKET": "b"}
    out = local.substitutions(template)
    assert out == {"SKYFN_AUTH_PROVIDER": "jwt", "SKYFN_AUTH_ISSUER": "skyfn-local", "SKYFN_AUTH_AUDIENCE": "skyfn",
                   "SKYFN_AUTH_JWKS_FILE": "/keys/jwks.json", "SKYFN_PUSH": "redis",
                   "SKYFN_RENDEZVOUS_ADDRESS": "127.0.0.1:4242"}
    assert set(out) <= set(template_runtime.SUBSTITUTED)
    assert local.substitutions({"SKYFN_BUCKET": "b"}) == {}  # a function that reads none of them gets none
    assert local.redis_password == "pw"


def test_a_function_environment_is_built_like_lambdas():
    env = template_runtime.lambda_env("skyfn-dev-api", "lambdas.api.handler", 1024, "us-east-1", "http://moto")
    assert env == {"_HANDLER": "lambdas.api.handler", "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
                   "AWS_LAMBDA_FUNCTION_NAME": "skyfn-dev-api", "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1024",
                   "AWS_ENDPOINT_URL": "http://moto"}
    assert template_runtime.target("lambdas.sfn_steps.run_task.handler") == "lambdas.sfn_steps.run_task:handler"
    assert template_runtime.ours("lambdas.api.handler") and not template_runtime.ours("__entrypoint__.handler")


def test_an_environment_built_from_configuration_alone_sees_nothing_of_ours(monkeypatch):
    from infra.local.standins.lambda_pool import LambdaPool

    monkeypatch.setenv("SKYFN_BUCKET", "the-runtime-s")  # what a function that does not set it must not see
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "the-runtime-s-key")
    names = ["SKYFN_BUCKET", "AWS_ACCESS_KEY_ID", "SKYFN_TABLE_PREFIX", "PATH"]
    for inherit, expected in ((False, [None, None, "from-template"]), (True, ["the-runtime-s", "the-runtime-s-key",
                                                                               "from-template"])):
        pool = LambdaPool("tests.infra.sample_handlers:environment", min_workers=1, max_workers=1,
                          env={"SKYFN_TABLE_PREFIX": "from-template"}, inherit=inherit).start()
        try:
            seen = pool.invoke({"names": names}, "f", 10.0, "r")
        finally:
            pool.close()
        assert [seen[n] for n in names[:3]] == expected
        assert seen["PATH"]  # the process basics stay
