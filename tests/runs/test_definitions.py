"""The catalog, the ASL files and the renderer, without a runtime: every definition is
valid ASL for moto's parser once rendered, its placeholders are exactly the catalog's,
every step handler exists, and flows compile to valid ASL with clear errors otherwise."""
from __future__ import annotations

import importlib
import json

import pytest

from skyfn.flows import Flow, Map, Parallel, Sequence, Step
from skyfn.protocol.flowspec import FlowError, FlowSpec, compile_flow
from stepfunctions.catalog import MACHINES, STEPS, substitutions_for
from stepfunctions.render import RenderError, placeholders, render, render_text

ARNS = {k: f"arn:aws:lambda:us-east-1:123456789012:function:skyfn-wf-{k}" for k in STEPS}


def _parse(definition: str) -> None:
    from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser

    AmazonStateLanguageParser.parse(definition)


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_definition_placeholders_match_the_catalog(name):
    machine = MACHINES[name]
    text = machine.path.read_text()
    json.loads(text)
    assert placeholders(text) == {STEPS[k].placeholder for k in machine.steps} | set(machine.extra_placeholders)
    rendered = render(machine, substitutions_for(machine, ARNS, "bucket"))
    assert "${" not in rendered
    _parse(rendered)


@pytest.mark.parametrize("key", sorted(STEPS))
def test_every_step_handler_exists(key):
    step = STEPS[key]
    assert callable(getattr(importlib.import_module(step.module), step.function))


def test_render_names_missing_and_unknown_placeholders():
    with pytest.raises(RenderError, match=r"no value for placeholder\(s\) \['RouteChunkArn'\]"):
        render("batch-fanout", {"BatchProgressArn": "x"})
    with pytest.raises(RenderError, match="no such placeholder"):
        render_text('{"a": "${X}"}', {"X": "1", "Y": "2"})
    with pytest.raises(RenderError, match="no state machine 'nope'"):
        render("nope", {})
    # JSONPath's $ and $$ are not placeholders
    assert render_text('{"a.$": "$$.Map.Item.Value", "b": "${X}"}', {"X": "v"}) == '{"a.$": "$$.Map.Item.Value", "b": "v"}'


def _noop(x):
    return x


def test_flow_compiles_to_valid_asl():
    flow = Flow("demo", Step(_noop, "ep"), Map(Step(_noop, "ep").retry(max_attempts=3), name="each"),
                Parallel(Step(_noop, "ep"), Step(_noop, "ep").catch(Step(_noop, "ep", name="fallback"))))
    asl = flow.to_asl(owner="alice", run_task_arn=ARNS["RunTask"])
    _parse(json.dumps(asl))
    assert asl["StartAt"] == "Input" and asl["States"]["Input"]["InputPath"] == "$.input"
    assert flow.spec().root.nodes[0].name == "noop"  # a leading underscore is dropped
    # automatic names are made unique; every Task carries the owner the service filled in
    text = json.dumps(asl)
    assert '"noop-2' in text and '"owner": "alice"' in text and "<owner>" not in text


def test_flow_spec_errors_name_the_problem():
    step = {"type": "step", "name": "a", "function_id": "f", "endpoint_id": "e"}
    dup = FlowSpec(name="x", root={"type": "sequence", "nodes": [step, step]})
    with pytest.raises(FlowError, match="two nodes are named 'a'"):
        compile_flow(dup, "u", "arn")
    with pytest.raises(ValueError, match="retry/catch go on a step"):
        Flow("x", Sequence(Step(_noop, "e")).retry()).spec()
