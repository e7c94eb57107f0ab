"""What the stacks deploy from this checkout, prepared without Docker:

- the function code: lambdas/, skyfn/__init__.py, skyfn/protocol/, skyfn/data/, stepfunctions/ and the
  packages workflow steps declare (catalog `packages`), copied into build/aws/function;
- the dependency layer: the handlers' third-party imports (LAYER_PACKAGES, at the versions
  requirements.txt pins) installed as Linux/arm64 wheels by pip. This is CDK *local*
  bundling: it runs when a stack's assets are bundled (`cdk synth`, `cdk deploy`), never
  in the unit tests (they synthesize with bundling skipped). Wheels are kept in
  build/aws/wheels, so after the first run synthesis needs no network;
- the rendezvous server's image build context: rendezvous/ and its Dockerfile copied
  into build/aws/rendezvous-image. Synthesis only stages it; `cdk deploy` builds it.
"""
from __future__ import annotations

import functools
import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsii
from aws_cdk import AssetHashType, BundlingOptions, DockerImage, ILocalBundling
from aws_cdk import aws_lambda as lambda_

from infra.aws.config import LAYER_PACKAGES, LAYER_PLATFORM, PYTHON_RUNTIME
from stepfunctions.catalog import STEPS

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build" / "aws"
# The handlers import lambdas/, skyfn.protocol, skyfn.data (its S3 connector presigns the
# payload bucket) and stepfunctions/; workflow steps may need
# more of this repository (stepfunctions.catalog LambdaStep.packages, e.g. rendezvous).
FUNCTION_SOURCES = ("lambdas", "skyfn/__init__.py", "skyfn/protocol", "skyfn/data", "stepfunctions",
                    *sorted({p for step in STEPS.values() for p in step.packages}))
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", ".pytest_cache")


def _copy(sources: tuple[str, ...], dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for rel in sources:
        src = REPO / rel
        if not src.exists():
            continue  # stepfunctions/ may not exist in a partial checkout
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, target, ignore=_IGNORE)
        else:
            shutil.copy2(src, target)
    return dest


@functools.lru_cache(maxsize=1)
def _function_dir() -> Path:
    return _copy(FUNCTION_SOURCES, BUILD / "function")


def function_code() -> lambda_.Code:
    """The handlers' code (staged once per synthesis; CDK wants a Code object per stack,
    and identical contents make one asset)."""
    return lambda_.Code.from_asset(str(_function_dir()))


def layer_pins(requirements: Path = REPO / "requirements.txt") -> list[str]:
    """`name==version` of each LAYER_PACKAGES entry, as requirements.txt pins it (extras kept)."""
    pins: dict[str, str] = {}
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?==(\S+)$", line)
        if m:
            pins[m.group(1).lower()] = line
    missing = [p for p in LAYER_PACKAGES if p.lower() not in pins]
    if missing:
        raise RuntimeError(f"requirements.txt pins no version of {missing}: the Lambda layer installs exactly "
                           "the pinned versions; add `name==version` lines")
    return [pins[p.lower()] for p in LAYER_PACKAGES]


def _pip_args(pins: list[str]) -> list[str]:
    version = PYTHON_RUNTIME.removeprefix("python")
    return ["--platform", LAYER_PLATFORM, "--implementation", "cp", "--python-version", version,
            "--only-binary=:all:", *pins]


@jsii.implements(ILocalBundling)
class PipLayerBundler:
    """Installs the layer's wheels into <output>/python with the host's pip (no Docker)."""

    def __init__(self, pins: list[str], wheelhouse: Path):
        self.pins = pins
        self.wheelhouse = wheelhouse

    def try_bundle(self, output_dir: str, _options: object = None) -> bool:
        target = Path(output_dir) / "python"
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
        offline = pip + ["install", "--no-index", "--find-links", str(self.wheelhouse), "--target", str(target),
                         *_pip_args(self.pins)]
        if self.wheelhouse.is_dir() and subprocess.run(offline, capture_output=True).returncode == 0:
            return True
        self.wheelhouse.mkdir(parents=True, exist_ok=True)
        download = subprocess.run(pip + ["download", "--dest", str(self.wheelhouse), *_pip_args(self.pins)],
                                  capture_output=True, text=True)
        if download.returncode != 0:
            raise RuntimeError("building the Lambda dependency layer needs the pinned wheels once, from PyPI "
                               f"(kept in {self.wheelhouse} afterwards); pip download failed:\n{download.stderr[-2000:]}")
        shutil.rmtree(target, ignore_errors=True)
        done = subprocess.run(offline, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"pip could not install the layer from {self.wheelhouse}:\n{done.stderr[-2000:]}")
        return True


def dependency_layer_code() -> lambda_.Code:
    """The layer's code: bundled locally; its hash is that of the pins and the platform,
    so an unchanged requirements.txt reuses the bundle (and the deployed layer)."""
    pins = layer_pins()
    digest = hashlib.sha256("\n".join([PYTHON_RUNTIME, LAYER_PLATFORM, *pins]).encode()).hexdigest()
    source = BUILD / "layer-source"
    source.mkdir(parents=True, exist_ok=True)
    (source / "requirements.txt").write_text("\n".join(pins) + "\n")
    # The Docker image is required by the API but never used: local bundling always
    # succeeds or raises with the reason.
    return lambda_.Code.from_asset(str(source), asset_hash_type=AssetHashType.CUSTOM, asset_hash=digest,
                                   bundling=BundlingOptions(
                                       image=DockerImage.from_registry(f"public.ecr.aws/sam/build-{PYTHON_RUNTIME}"),
                                       local=PipLayerBundler(pins, BUILD / "wheels")))


RENDEZVOUS_DOCKERFILE = REPO / "infra" / "aws" / "docker" / "rendezvous.Dockerfile"


def rendezvous_image_context() -> Path:
    """A minimal build context for the rendezvous image: the package and its Dockerfile."""
    dest = _copy(("rendezvous",), BUILD / "rendezvous-image")
    shutil.copy2(RENDEZVOUS_DOCKERFILE, dest / "Dockerfile")
    return dest
