"""The Parsl config naming skyfn, for Parsl's own test suite (`make test-parsl`):

    pytest --pyargs parsl.tests --config tests/parsl/skyfn_config.py

Every task of the suite runs on the endpoint `local` of an embedded skyfn runtime: the one
running in $SKYFN_HOME, else one this module starts in a temporary home (and stops at exit).
Parsl loads this file by path (parsl/tests/conftest.py), so the repository root is put on
sys.path here for tests.parsl.runtime.
"""
import os
import sys
from pathlib import Path

from parsl.config import Config

from skyfn.parsl import SkyfnExecutor

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def fresh_config() -> Config:
    from tests.parsl.runtime import ensure_runtime

    ensure_runtime()
    return Config(executors=[SkyfnExecutor(endpoint=os.environ.get("SKYFN_PARSL_ENDPOINT", "local"), label="skyfn")])
