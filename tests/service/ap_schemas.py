"""Checks documents of the /flows-ap routes against globus-action-provider-tools' schemas.

That package needs pydantic<2 and globus-sdk<4 (skyfn pins pydantic 2 and globus-sdk 4), so
it runs in its own virtualenv, build/venvs/aptools (requirements-aptools.txt), made here on
first use: the tests collect every request and response they exchanged and hand them to
this file run as a script there:

    build/venvs/aptools/bin/python tests/service/ap_schemas.py < documents.json

Each document is {"kind", "where", "doc"}: ActionRequest and ActionStatus are validated with
the package's JSON schemas (globus_action_provider_tools.validation, messages unscrubbed)
and parsed with its pydantic models; ActionProviderDescription and ActionLogReturn with its
models. Prints {"checked": n, "by_kind": {...}, "errors": [...]}.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / "build" / "venvs" / "aptools"
REQUIREMENTS = ROOT / "requirements-aptools.txt"


def venv_python() -> Path:
    """The aptools virtualenv's python, made (or remade after requirements-aptools.txt changed)."""
    stamp = VENV / ".installed"
    if not stamp.exists() or stamp.read_text() != REQUIREMENTS.read_text():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", "--only-binary", ":all:", "-r",
                        str(REQUIREMENTS)], check=True, env={k: v for k, v in os.environ.items()
                                                            if k not in ("PYTHONPATH", "VIRTUAL_ENV")})
        stamp.write_text(REQUIREMENTS.read_text())
    return VENV / "bin" / "python"


def validate(documents: list[dict]) -> dict:
    """Run this file in the aptools virtualenv on `documents`; returns its report."""
    out = subprocess.run([str(venv_python()), __file__], input=json.dumps(documents), capture_output=True, text=True,
                         cwd=str(VENV), env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def _check(kind: str, doc: dict) -> list[str]:
    from globus_action_provider_tools import data_types
    from globus_action_provider_tools.validation import _validator_map, validate_data

    errors: list[str] = []
    if kind in _validator_map:  # the documented JSON schemas: ActionRequest, ActionStatus
        errors += validate_data(doc, _validator_map[kind], scrub_validation_errors=False).errors
    model = {"ActionRequest": data_types.ActionRequest, "ActionStatus": data_types.ActionStatus,
             "ActionProviderDescription": data_types.ActionProviderDescription,
             "ActionLogReturn": data_types.ActionLogReturn}[kind]
    try:
        model.parse_obj(doc)
    except Exception as exc:  # noqa: BLE001 - pydantic 1's ValidationError, reported as text
        errors.append(f"{model.__name__}: {exc}")
    return errors


def main() -> None:
    documents = json.load(sys.stdin)
    report: dict = {"checked": 0, "by_kind": {}, "errors": []}
    for item in documents:
        kind = item["kind"]
        report["checked"] += 1
        report["by_kind"][kind] = report["by_kind"].get(kind, 0) + 1
        for err in _check(kind, item["doc"]):
            report["errors"].append(f"{item['where']} ({kind}): {err}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
