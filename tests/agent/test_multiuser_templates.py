"""endpoint_agent.multiuser.templates (issue 23): the schema names the variable and the rule, the
sandbox refuses unsafe templates, and no value can add YAML keys."""
from __future__ import annotations

import json

import pytest
import yaml

from endpoint_agent.errors import ConfigError
from endpoint_agent.multiuser.errors import TaskRefused
from endpoint_agent.multiuser.templates import (TemplateFailed, UserConfigRefused, UserConfigTemplate,
                                                yaml_scalar)

TEMPLATE = """\
provider: local
workers: {{ workers | default(2) }}
{% if partition is defined %}
blocks:
  partition: {{ partition }}
  nodes_per_block: {{ nodes | default(1) }}
  worker_init: {{ "cd " ~ account.home }}
{% endif %}
"""
SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "workers": {"type": "integer", "minimum": 1, "maximum": 64},
        "nodes": {"type": "integer", "minimum": 1},
        "partition": {"type": "string"},
    },
}
ACCOUNT = {"account": {"name": "alice", "home": "/home/alice"}}


def test_a_schema_failure_names_the_variable_and_the_rule():
    t = UserConfigTemplate(TEMPLATE, SCHEMA)
    with pytest.raises(UserConfigRefused) as info:
        t.render("alice", {"nodes": 0}, ACCOUNT)
    assert str(info.value) == "user_config.nodes: 0 is less than the minimum of 1"
    assert isinstance(info.value, TaskRefused)
    with pytest.raises(UserConfigRefused) as info:
        t.render("alice", {"workers": "many", "colour": "red"}, ACCOUNT)
    assert str(info.value) == ("user_config: Additional properties are not allowed ('colour' was unexpected); "
                               "user_config.workers: 'many' is not of type 'integer'")
    with pytest.raises(UserConfigRefused, match="user_config.account: the name 'account' is reserved"):
        t.render("alice", {"account": "root"}, ACCOUNT)


def test_values_render_into_the_config_and_the_digest_keys_user_and_config():
    t = UserConfigTemplate(TEMPLATE, SCHEMA)
    r = t.render("alice", {"partition": "debug", "nodes": 2}, ACCOUNT)
    assert r.config == {"provider": "local", "workers": 2,
                        "blocks": {"partition": "debug", "nodes_per_block": 2, "worker_init": "cd /home/alice"}}
    again = t.render("alice", {"nodes": 2, "partition": "debug"}, ACCOUNT)
    assert again.digest == r.digest and len(r.digest) == 64
    assert t.render("bob", {"partition": "debug", "nodes": 2}, ACCOUNT).digest != r.digest
    assert t.render("alice", {"partition": "debug", "nodes": 3}, ACCOUNT).digest != r.digest
    assert t.render("alice", {}, ACCOUNT).config == {"provider": "local", "workers": 2}


def test_a_newline_and_yaml_keys_in_a_value_stay_one_string():
    t = UserConfigTemplate(TEMPLATE, SCHEMA)
    evil = "debug\nmax_workers: 999\nworkers: 999\n  nodes_per_block: 100"
    r = t.render("alice", {"partition": evil}, ACCOUNT)
    assert r.config["blocks"]["partition"] == evil
    assert r.config["workers"] == 2 and "max_workers" not in r.config and set(r.config) == {"provider", "workers",
                                                                                            "blocks"}
    assert r.config["blocks"]["nodes_per_block"] == 1
    literal = t.render("alice", {"partition": "{{ ''.__class__ }} {% raw %}"}, ACCOUNT)
    assert literal.config["blocks"]["partition"] == "{{ ''.__class__ }} {% raw %}"  # data, never a template


@pytest.mark.parametrize("value", ["debug\nkey: 1", "a\"b\\c", "x\x85y\u2028z", "\x80\x00\x1b[31m", "emoji \U0001F600",
                                   "\ud800", "", "null", "- item", "&a *a !!python/object/apply:os.system",
                                   "'single'", 7, -1.5, True, None, ["a\nb: 1", 2], {"k\n: v": [None]}])
def test_every_value_reads_back_as_itself(value):
    assert yaml.safe_load("key: " + yaml_scalar(value)) == {"key": value}


def test_an_unsafe_template_is_refused_by_the_sandbox():
    for text in ("x: {{ ''.__class__.__mro__ }}\n", "x: {{ ''.__class__ }}\n",
                 "x: {{ cycler.__init__.__globals__ }}\n"):
        t = UserConfigTemplate(text, None, source="tpl.yaml.j2")
        with pytest.raises(TemplateFailed) as info:
            t.render("alice", {})
        assert str(info.value).startswith("tpl.yaml.j2: unsafe template, refused by the sandbox: access to attribute")
        assert "is unsafe" in str(info.value)


def test_undefined_variables_and_templates_that_give_no_mapping():
    t = UserConfigTemplate("partition: {{ partition }}\n", None, source="tpl")
    with pytest.raises(UserConfigRefused, match="tpl needs a variable the task did not give: 'partition' is "
                                                "undefined"):
        t.render("alice", {})
    with pytest.raises(TemplateFailed, match="the rendered config must be a mapping of keys to values, got list"):
        UserConfigTemplate("- {{ a }}\n", None, source="tpl").render("alice", {"a": 1})
    with pytest.raises(TemplateFailed, match="write `key: {{ var }}`, not `key: \"{{ var }}\"`"):
        UserConfigTemplate('x: "{{ a }}"\n', None, source="tpl").render("alice", {"a": "b"})
    with pytest.raises(UserConfigRefused, match="user_config must be a mapping"):
        UserConfigTemplate("x: 1\n", None).render("alice", ["a"])


def test_bad_templates_and_schemas_are_configuration_errors_naming_the_file(tmp_path):
    with pytest.raises(ConfigError, match="tpl line 2: not a valid Jinja2 template"):
        UserConfigTemplate("a: 1\nb: {{ x \n", None, source="tpl")
    with pytest.raises(ConfigError, match="schema.json: not a valid JSON schema at properties/n/minimum"):
        UserConfigTemplate("a: 1\n", {"properties": {"n": {"minimum": "one"}}}, schema_source="schema.json")
    template = tmp_path / "t.yaml.j2"
    template.write_text("a: {{ a }}\n")
    schema = tmp_path / "s.json"
    schema.write_text("{")
    with pytest.raises(ConfigError, match=f"user config schema {schema} line 1, column 2: not valid JSON"):
        UserConfigTemplate.from_files(template, schema)
    with pytest.raises(ConfigError, match=f"user config template {tmp_path / 'nope'} does not exist"):
        UserConfigTemplate.from_files(tmp_path / "nope", None)
    schema.write_text(json.dumps({"properties": {"a": {"enum": [1, 2]}}}))
    t = UserConfigTemplate.from_files(template, schema)
    assert t.render("alice", {"a": 2}).config == {"a": 2}
    with pytest.raises(UserConfigRefused, match="user_config.a: 3 is not one of \\[1, 2\\]"):
        t.render("alice", {"a": 3})
