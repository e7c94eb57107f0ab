"""A read-only view of a synthesized CDK cloud assembly (`cdk.out/`): its CloudFormation
stacks (from manifest.json), their resources and outputs, the cross-stack exports and the
file assets (a state machine's DefinitionS3Location points at one). Nothing here resolves
intrinsic functions; see intrinsics.py."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

CDK_OUT_ENV = "SKYFN_CDK_OUT"
STACK_ARTIFACT = "aws:cloudformation:stack"
ASSET_MANIFEST_ARTIFACT = "cdk:asset-manifest"


class AssemblyError(Exception):
    """The cloud assembly is missing or malformed; the message says what to do."""


def _missing(path: Path, what: str) -> AssemblyError:
    return AssemblyError(f"no cloud assembly at {path}: {what}; run `make synth` (it writes cdk.out/) "
                         f"or set {CDK_OUT_ENV} to the folder `cdk synth` wrote")


def default_path() -> Path:
    """$SKYFN_CDK_OUT, else ./cdk.out."""
    return Path(os.environ.get(CDK_OUT_ENV) or "cdk.out")


@dataclass(frozen=True)
class Resource:
    stack: str
    logical_id: str
    type: str
    properties: dict[str, Any]
    raw: dict[str, Any]             # the whole template entry (Condition, DependsOn, ...)


@dataclass(frozen=True)
class Stack:
    name: str                       # the CloudFormation stack name
    artifact_id: str
    template_file: Path
    template: dict[str, Any]
    account: str | None             # from the artifact's environment, None when unresolved
    region: str | None
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def resources(self) -> dict[str, dict[str, Any]]:
        return self.template.get("Resources") or {}

    @property
    def outputs(self) -> dict[str, dict[str, Any]]:
        return self.template.get("Outputs") or {}

    @property
    def parameters(self) -> dict[str, dict[str, Any]]:
        return self.template.get("Parameters") or {}


def _environment(value: str | None) -> tuple[str | None, str | None]:
    # "aws://123456789012/us-east-1"; "unknown-account"/"unknown-region" when env-agnostic
    if not value or not value.startswith("aws://"):
        return None, None
    account, _, region = value.removeprefix("aws://").partition("/")
    return (None if account.startswith("unknown") else account), (None if region.startswith("unknown") else region)


class CloudAssembly:
    """The stacks of one `cdk.out/` folder, in manifest order (dependencies first, as CDK
    writes them)."""

    def __init__(self, path: Path, stacks: list[Stack], assets: dict[str, Path]):
        self.path = path
        self.stacks: dict[str, Stack] = {s.name: s for s in stacks}
        self._assets = assets       # S3 object key of a file asset -> its file in the assembly

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> "CloudAssembly":
        root = Path(path) if path is not None else default_path()
        if not root.is_dir():
            raise _missing(root, "the folder does not exist")
        manifest_file = root / "manifest.json"
        if not manifest_file.is_file():
            raise _missing(root, "it has no manifest.json")
        try:
            manifest = json.loads(manifest_file.read_text())
        except ValueError as exc:
            raise AssemblyError(f"{manifest_file} is not JSON ({exc}): synthesize again with `make synth`") from None
        stacks, assets = [], {}
        for artifact_id, artifact in (manifest.get("artifacts") or {}).items():
            props = artifact.get("properties") or {}
            if artifact.get("type") == STACK_ARTIFACT:
                template_file = root / props["templateFile"]
                try:
                    template = json.loads(template_file.read_text())
                except (OSError, ValueError) as exc:
                    raise AssemblyError(f"stack {artifact_id}: cannot read its template {template_file}: {exc}; "
                                        "synthesize again with `make synth`") from None
                account, region = _environment(artifact.get("environment"))
                stacks.append(Stack(props.get("stackName") or artifact_id, artifact_id, template_file, template,
                                    account, region, dict(props.get("tags") or {})))
            elif artifact.get("type") == ASSET_MANIFEST_ARTIFACT and props.get("file"):
                assets.update(_file_assets(root, root / props["file"]))
        if not stacks:
            raise _missing(root, "its manifest.json names no CloudFormation stack")
        return cls(root, stacks, assets)

    # -- resources -------------------------------------------------------------------

    def resources(self, type: str | None = None) -> Iterator[Resource]:
        """Every resource of every stack (of one CloudFormation type when `type` is given)."""
        for stack in self.stacks.values():
            for logical_id, entry in stack.resources.items():
                if type is None or entry.get("Type") == type:
                    yield Resource(stack.name, logical_id, entry.get("Type", ""), entry.get("Properties") or {}, entry)

    def resource(self, stack: str, logical_id: str) -> Resource | None:
        entry = self.stacks[stack].resources.get(logical_id) if stack in self.stacks else None
        if entry is None:
            return None
        return Resource(stack, logical_id, entry.get("Type", ""), entry.get("Properties") or {}, entry)

    def types(self) -> dict[str, int]:
        """Resource type -> how many resources of it the assembly has."""
        counts: dict[str, int] = {}
        for r in self.resources():
            counts[r.type] = counts.get(r.type, 0) + 1
        return counts

    def exports(self) -> dict[Any, tuple[str, Any]]:
        """Export name -> (exporting stack, the Output's value expression). CDK writes export
        names as plain strings; a name that is itself an expression is kept as its JSON
        text (the resolver resolves it)."""
        found: dict[Any, tuple[str, Any]] = {}
        for stack in self.stacks.values():
            for output in stack.outputs.values():
                name = (output.get("Export") or {}).get("Name")
                if name is not None:
                    key = name if isinstance(name, str) else json.dumps(name, sort_keys=True)
                    found[key] = (stack.name, output.get("Value"))
        return found

    # -- assembly-wide facts ---------------------------------------------------------

    def environment(self) -> tuple[str | None, str | None]:
        """(account, region) the stacks were synthesized for, when all agree and are known."""
        envs = {(s.account, s.region) for s in self.stacks.values()}
        return envs.pop() if len(envs) == 1 else (None, None)

    def stage_prefix(self) -> str | None:
        """The deployment's resource-name prefix, `<project>-<stage>` from the stack tags
        (e.g. skyfn-dev: functions are skyfn-dev-api, tables skyfn-dev-functions)."""
        prefixes = {f"{s.tags['project']}-{s.tags['stage']}" for s in self.stacks.values()
                    if s.tags.get("project") and s.tags.get("stage")}
        return prefixes.pop() if len(prefixes) == 1 else None

    def asset_file(self, object_key: str) -> Path | None:
        """The file in the assembly that a stack's S3 location (bucket = the CDK staging
        bucket, key = `object_key`) names."""
        return self._assets.get(object_key)


def _file_assets(root: Path, manifest_file: Path) -> dict[str, Path]:
    try:
        manifest = json.loads(manifest_file.read_text())
    except (OSError, ValueError):
        return {}
    found = {}
    for asset in (manifest.get("files") or {}).values():
        source = (asset.get("source") or {}).get("path")
        if not source:
            continue
        for dest in (asset.get("destinations") or {}).values():
            if dest.get("objectKey"):
                found[dest["objectKey"]] = root / source
    return found
