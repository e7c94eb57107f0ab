"""`skyfn policy check`: validation messages, explanations for a tag and a state, exit codes."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from skyfn.cli import app

POLICY = """\
divide:
  - workers: *
    affinity: impera, !heavy
  - workers: [w3, w1]
    strategy: best_first
    affinity: !heavy
  - followup: fail
heavy:
  - workers: *
    affinity: !divide, !ghost
impera:
  - workers: *
"""

STATE = """\
workers:
  w1: {capacity: 4, tags: {heavy: 1}}
  w2: {capacity: 4, running: 3, tags: {impera: 1}}
  w3: {capacity: 4}
"""


@pytest.fixture
def files(tmp_path):
    (tmp_path / "p.yaml").write_text(POLICY)
    (tmp_path / "s.yaml").write_text(STATE)
    return tmp_path


def run(*args):
    result = CliRunner().invoke(app, ["policy", "check", *map(str, args)])
    return result.exit_code, result.stdout, result.stderr


def test_valid_policy_with_its_warning(files):
    code, out, _ = run(files / "p.yaml")
    assert code == 0
    assert out.splitlines() == [
        f"{files / 'p.yaml'}: valid, 3 tags (divide, heavy, impera)",
        f"{files / 'p.yaml'}:10: warning: heavy[1].affinity: affinity on tag 'ghost', which this policy does not "
        "define (functions tagged 'ghost' use the default blocks)",
    ]


def test_explains_block_and_worker_choice_for_a_tag_and_state(files):
    code, out, _ = run(files / "p.yaml", "--tag", "divide", "--state", files / "s.yaml")
    assert code == 0
    assert out.splitlines()[3:] == [
        "tag 'divide' -> worker 'w2' ('divide' block 1, line 2)",
        "  'divide' block 1 (line 2): workers *; strategy any; affinity impera, !heavy",
        "    w1: rejected, runs 1 'heavy' function(s) (anti-affinity !heavy)",
        "    w2: valid  <- chosen",
        "    w3: rejected, runs no 'impera' function (affinity impera)",
    ]


def test_explains_a_failed_decision_and_exits_2(files):
    (files / "busy.yaml").write_text(textwrap.dedent("""\
        workers:
          - {name: w1, tags: [heavy]}
          - {name: w3, tags: [heavy, heavy]}
        """))
    code, out, _ = run(files / "p.yaml", "-t", "divide", "-s", files / "busy.yaml")
    assert code == 2
    lines = out.splitlines()
    assert lines[3].startswith("tag 'divide' -> no worker: no valid worker for tag 'divide': ")
    assert lines[3].endswith("(followup: fail)")
    assert "  'divide' block 2 (line 4): workers w3, w1; strategy best_first; affinity !heavy" in lines
    assert "    w3: rejected, runs 2 'heavy' function(s) (anti-affinity !heavy)" in lines


def test_every_tag_and_untagged_when_only_a_state_is_given(files):
    code, out, _ = run(files / "p.yaml", "--state", files / "s.yaml", "--json")
    assert code == 0
    data = json.loads(out)
    assert [d["tag"] for d in data["decisions"]] == ["divide", "heavy", "impera", None]
    assert [d["worker"] is not None for d in data["decisions"]] == [True] * 4
    assert data["decisions"][0]["worker"] == "w2" and data["decisions"][0]["block"] == 1
    assert data["decisions"][3]["via"] == "default" and data["decisions"][3]["policy_tag"] == "(built-in default)"


def test_without_a_state_the_named_workers_are_idle(files):
    code, out, _ = run(files / "p.yaml", "--tag", "divide")
    assert code == 0
    assert "(no --state: the 2 worker(s) the policy names, idle: w3, w1)" in out
    assert "tag 'divide' -> worker 'w3' ('divide' block 2, line 4)" in out


def test_state_naming_unknown_policy_workers_warns(files):
    (files / "s2.yaml").write_text("workers: {w1: {}, w9: {}}\n")
    code, out, _ = run(files / "p.yaml", "-t", "divide", "-s", files / "s2.yaml")
    assert code == 0
    assert f"{files / 'p.yaml'}:4: warning: workers: worker 'w3' is not one of the known workers (w1, w9)" in out
    assert "    w3: rejected, unknown worker (not among the current workers)" in out


def test_invalid_policy_lists_every_problem_with_line_and_key(files):
    (files / "bad.yaml").write_text("a:\n  - workers: [x]\n    strategy: fast\n  - invalidate: capacity_used 120%\n")
    code, out, err = run(files / "bad.yaml")
    assert code == 1 and out == ""
    bad = files / "bad.yaml"
    assert err.splitlines() == [
        f"{bad}:3: a[1].strategy: unknown strategy 'fast' (expected one of: any, best_first, warm_first, "
        "shortest_backlog, round_robin, data_local)",
        f"{bad}:4: a[2].invalidate.capacity_used: bad percentage '120%': give a number above 0 and at most 100, "
        "e.g. 50%",
        f"{bad}:4: a[2]: missing workers: give `workers: *` or a list of worker names",
        f"{bad}: rejected (3 problems); nothing was loaded",
    ]


@pytest.mark.parametrize("content, message", [
    (None, "cannot read state file"),
    ("", "is empty"),
    ("workers: {w1: {capacity: x}}", "worker 'w1': capacity must be a whole number >= 0"),
    ("workers: [w1", "st.yaml:1: not valid YAML/JSON: the '[' opened on line 1 is never closed"),
])
def test_bad_state_file(files, content, message):
    path = files / "st.yaml"
    if content is not None:
        path.write_text(content)
    code, _, err = run(files / "p.yaml", "-t", "divide", "-s", path)
    assert code == 1 and message in err


def test_console_script_entry_point(files):
    """The installed `skyfn` entry point reaches the command (lazy import path)."""
    proc = subprocess.run([sys.executable, "-c", "from skyfn.cli import main; main()", "policy", "check",
                           str(files / "p.yaml"), "-t", "heavy", "-s", str(files / "s.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "tag 'heavy' -> worker" in proc.stdout
