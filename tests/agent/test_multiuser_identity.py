"""endpoint_agent.multiuser.identity (issue 23): the globus-identity-mapping library's expression
rules and a real external mapping program, and the errors of a bad mapping document."""
from __future__ import annotations

import json
import sys
import uuid

import pytest

from endpoint_agent.errors import ConfigError
from endpoint_agent.multiuser.errors import TaskRefused
from endpoint_agent.multiuser.identity import IdentityMapper, IdentityNotMapped

ALICE = {"id": str(uuid.uuid4()), "username": "alice@uni.example.org", "email": "alice@example.org",
         "identity_provider": str(uuid.uuid4())}
BOB = {"id": str(uuid.uuid4()), "username": "bob@uni.example.org", "email": "bob@example.org",
       "identity_provider": ALICE["identity_provider"]}
EVE = {"id": str(uuid.uuid4()), "username": "eve@elsewhere.example.com", "email": "eve@elsewhere.example.com",
       "identity_provider": str(uuid.uuid4())}
BY_EMAIL = """\
# rules of the site
- DATA_TYPE: expression_identity_mapping#1.0.0
  mappings:
    - source: "{email}"
      match: "(.*)@example\\\\.org"
      output: "{0}"
"""


def _file(tmp_path, text, name="identity_mapping.yaml", mode=0o600):
    path = tmp_path / name
    path.write_text(text)
    path.chmod(mode)
    return path


def test_alice_and_bob_are_mapped_by_an_expression_rule_on_their_email(tmp_path):
    mapper = IdentityMapper.from_file(_file(tmp_path, BY_EMAIL), "site-ep")
    alice, bob = mapper.map(ALICE), mapper.map(BOB)
    assert (alice.account, alice.rule, alice.reason) == ("alice", "document 1 rule 1", None)
    assert (bob.account, bob.account_or_raise()) == ("bob", "bob")


def test_an_unmapped_identity_gets_the_reason_naming_it_and_the_endpoint(tmp_path):
    path = _file(tmp_path, BY_EMAIL)
    outcome = IdentityMapper.from_file(path, "site-ep").map(EVE)
    assert outcome.account is None and not outcome.ok
    assert outcome.reason == (f"identity eve@elsewhere.example.com (id {EVE['id']}) maps to no local account on "
                              f"endpoint site-ep: no rule of {path} matched")
    with pytest.raises(IdentityNotMapped) as info:
        outcome.account_or_raise()
    assert isinstance(info.value, TaskRefused) and str(info.value) == outcome.reason


def test_rules_are_tried_in_order_and_a_rule_reading_a_missing_field_is_skipped(tmp_path):
    text = BY_EMAIL + """\
    - source: "{username}"
      match: "(.*)@uni\\\\.example\\\\.org"
      output: "u_{0}"
"""
    mapper = IdentityMapper.from_file(_file(tmp_path, text), "site-ep")
    assert mapper.map(ALICE).account == "alice"  # the first rule wins
    no_email = {k: v for k, v in ALICE.items() if k != "email"}
    outcome = mapper.map(no_email)
    assert (outcome.account, outcome.rule) == ("u_alice", "document 1 rule 2")
    assert outcome.notes == ("document 1 rule 1 reads email, which this identity does not carry",)
    nothing = mapper.map({"id": ALICE["id"]})
    assert "reads email" in nothing.reason and "reads username" in nothing.reason
    assert "has no id" in mapper.map({"username": "x"}).reason


def test_an_output_that_is_no_account_name_is_refused_not_used(tmp_path):
    text = BY_EMAIL.replace('output: "{0}"', 'output: "{email}"')
    outcome = IdentityMapper.from_file(_file(tmp_path, text), "site-ep").map(ALICE)
    assert outcome.account is None
    assert "gave 'alice@example.org' is not a valid account name" in outcome.reason


EXTERNAL = """\
#!{python}
import json, sys
request = json.load(sys.stdin)
with open({calls!r}, "a") as log:
    log.write(json.dumps({{"argv": sys.argv[1:], "request": request}}) + "\\n")
table = {{"alice@example.org": "alice", "bob@example.org": "bob", "crash@example.org": None}}
result = []
for identity in request["identities"]:
    if identity.get("email") == "crash@example.org":
        print("directory server unreachable", file=sys.stderr)
        sys.exit(3)
    account = table.get(identity.get("email"))
    if account:
        result.append({{"id": identity["id"], "output": account}})
print(json.dumps({{"DATA_TYPE": "identity_mapping_output#1.0.0", "result": result}}))
"""


def test_an_external_mapping_program_maps_and_refuses(tmp_path):
    calls = tmp_path / "calls.jsonl"
    program = _file(tmp_path, EXTERNAL.format(python=sys.executable, calls=str(calls)), "map-identity", 0o755)
    doc = [{"DATA_TYPE": "external_identity_mapping#1.0.0", "command": [str(program), "--site", "example"]}]
    mapper = IdentityMapper.from_file(_file(tmp_path, json.dumps(doc), "mapping.json"), "site-ep")
    assert mapper.map(ALICE).account == "alice"
    assert mapper.map(BOB).account == "bob"
    first = json.loads(calls.read_text().splitlines()[0])
    assert first["argv"] == ["--site", "example", "-c", "skyfn-endpoint", "-s", "site-ep"]
    assert first["request"] == {"DATA_TYPE": "identity_mapping_input#1.0.0", "identities": [ALICE]}
    eve = mapper.map(EVE)
    assert eve.account is None and f"id {EVE['id']}) maps to no local account on endpoint site-ep" in eve.reason
    crash = mapper.map({**EVE, "email": "crash@example.org"})
    assert crash.account is None and "(external program" in crash.reason and "failed: Error mapping identity" \
        in crash.reason
    not_uuid = mapper.map({**ALICE, "id": "alice-local"})
    assert not_uuid.account is None and "needs a UUID identity id, not 'alice-local'" in not_uuid.reason
    assert len(calls.read_text().splitlines()) == 4  # the non-UUID identity never reached the program


@pytest.mark.parametrize("text,message", [
    ("- DATA_TYPE: expression_identity_mapping#1.0.0\n  mappings: [\n", "line 3, column 1: not valid YAML"),
    ("[]", "expected a list of mapping documents"),
    ("- DATA_TYPE: ldap_identity_mapping#1.0.0\n",
     "document 1: DATA_TYPE 'ldap_identity_mapping#1.0.0' is not one this endpoint knows; use "
     "expression_identity_mapping#1.0.0"),
    ("- DATA_TYPE: expression_identity_mapping#1.0.0\n  mappings: []\n",
     "document 1: `mappings` must be a non-empty list"),
    ("- DATA_TYPE: expression_identity_mapping#1.0.0\n  mappings:\n    - {source: '{mail}', match: x, output: y}\n",
     "document 1, rule 1: `source` '{mail}' names {mail}; the identity's fields are id, username, email, "
     "identity_provider"),
    ("- DATA_TYPE: expression_identity_mapping#1.0.0\n  mappings:\n    - {source: '{email}', match: '*x', "
     "output: y}\n", "document 1, rule 1: `match` '*x' is not a valid expression: *x - Invalid leading wildcard"),
    ("- DATA_TYPE: expression_identity_mapping#1.0.0\n  mappings:\n    - {source: '{email}', match: x}\n",
     "document 1, rule 1: `output` must be a non-empty string, got None"),
    ("- DATA_TYPE: external_identity_mapping#1.0.0\n  command: [map-identity]\n",
     "document 1: the program map-identity must be an absolute path"),
    ("- DATA_TYPE: external_identity_mapping#1.0.0\n  command: [/nonexistent/map]\n",
     "the program /nonexistent/map does not exist or is not executable"),
])
def test_a_bad_mapping_document_names_the_file_the_place_and_the_fix(tmp_path, text, message):
    path = _file(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        IdentityMapper.from_file(path, "site-ep")
    assert str(info.value).startswith(f"identity mapping file {path}")
    assert message in str(info.value)


def test_a_missing_or_writable_mapping_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="does not exist: create it .*configure --multi-user"):
        IdentityMapper.from_file(tmp_path / "nope.yaml", "site-ep")
    path = _file(tmp_path, BY_EMAIL, mode=0o664)
    with pytest.raises(ConfigError, match="writable by group or others \\(mode 0664\\): chmod go-w"):
        IdentityMapper.from_file(path, "site-ep")
    bad_json = _file(tmp_path, '[{"DATA_TYPE": ', "m.json")
    with pytest.raises(ConfigError, match="line 1, column 16: not valid JSON"):
        IdentityMapper.from_file(bad_json, "site-ep")
