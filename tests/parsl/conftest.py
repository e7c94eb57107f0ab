"""The embedded runtime for the SkyfnExecutor tests (package-scoped: it and its environment end
with this package), started as a user starts it, with the endpoint `local` of 2 workers
(tests/parsl/runtime.py)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="package")
def parsl_home(tmp_path_factory):
    from tests.parsl.runtime import local_runtime

    with local_runtime(tmp_path_factory.mktemp("skyfn-parsl-home"), workers=2) as home:
        yield home
