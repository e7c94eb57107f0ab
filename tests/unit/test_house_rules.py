"""House rules a reader relies on (issue 22): every package says what it is for (a docstring in
its __init__.py), and no source file is over 600 lines outside benchmarks/ and the C++ core
unless its module docstring says why (a paragraph starting "Size:"): a class that grows past
that splits by concern, each part with its own tests."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 600
PACKAGES = ("skyfn", "lambdas", "endpoint_agent", "infra", "comm", "rendezvous", "stepfunctions", "benchmarks")
CHECKED = (*(p for p in PACKAGES if p != "benchmarks"), "scripts", "examples", "tests")


def sources():
    for top in CHECKED:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in (".py", ".pyx") and "__pycache__" not in path.parts:
                yield path


def docstring(path: Path):
    return ast.get_docstring(ast.parse(path.read_text()))


def test_every_package_says_what_it_is_for():
    packages = [p for top in PACKAGES for p in sorted((ROOT / top).rglob("__init__.py"))]
    assert len(packages) > 20
    silent = [str(p.parent.relative_to(ROOT)) for p in packages if not (docstring(p) or "").strip()]
    assert silent == [], "packages without a docstring in __init__.py saying what the package is for"


def says_why(path: Path) -> bool:
    text = path.read_text()
    if path.suffix == ".pyx":  # Cython: the first triple-quoted string is its docstring
        found = re.search(r'"""(.*?)"""', text, re.S)
        doc = found.group(1) if found else None
    else:
        doc = docstring(path)
    return bool(doc) and any(part.lstrip().startswith("Size:") for part in doc.split("\n\n"))


def test_no_source_file_is_over_600_lines_without_a_reason():
    long = {str(p.relative_to(ROOT)): n for p in sources() if (n := len(p.read_text().splitlines())) > LIMIT}
    unexplained = sorted(f"{name} ({n} lines)" for name, n in long.items() if not says_why(ROOT / name))
    assert unexplained == [], ("over 600 lines with no 'Size:' paragraph in the module docstring: split by concern "
                               "or say why not")


def test_the_check_reads_a_reason_from_the_docstring(tmp_path):
    explained = tmp_path / "big.py"
    explained.write_text('"""A module.\n\nSize: one state machine; splitting it would scatter its transitions."""\n')
    silent = tmp_path / "silent.py"
    silent.write_text('"""A module."""\n')
    assert says_why(explained) and not says_why(silent)
