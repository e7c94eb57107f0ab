"""Resolves CloudFormation intrinsic functions in template values to plain JSON values:
Ref, Fn::GetAtt, Fn::Join, Fn::Sub, Fn::Select, Fn::Split, Fn::ImportValue, Fn::FindInMap,
Fn::Base64 and the pseudo parameters. What a Ref or an attribute of a resource is comes
from a registry of physical ids (naming.py builds the one the local runtime uses; a
plain dict does for tests). The templates skyfn synthesizes use no Conditions, so Fn::If
and friends are refused by name rather than half supported."""
from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from infra.local.templates.assembly import CloudAssembly

DEFAULT_ACCOUNT = "123456789012"   # moto's default account and region
DEFAULT_REGION = "us-east-1"


class UnresolvedReference(Exception):
    """An expression names something that has no local value. `stack` is the stack whose
    template holds the expression, `logical_id` what it names, `path` where it sits."""

    def __init__(self, stack: str, logical_id: str, path: str, reason: str):
        self.stack, self.logical_id, self.path, self.reason = stack, logical_id, path, reason
        super().__init__(f"stack {stack}: cannot resolve {logical_id!r} at {path or '(top)'}: {reason}")


@dataclass(frozen=True)
class Physical:
    """What CloudFormation gives for one resource: its Ref value and its attributes."""
    ref: Any
    attrs: Mapping[str, Any] = field(default_factory=dict)


# (stack name, logical id) -> Physical; a lookup of an unknown key raises KeyError.
PhysicalIds = Mapping[tuple[str, str], Physical]


class _NoValue:
    def __repr__(self) -> str:
        return "AWS::NoValue"


NO_VALUE = _NoValue()
_SUB_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_SSM_PARAMETER = "AWS::SSM::Parameter::Value<"


def is_intrinsic(value: Any) -> bool:
    if not isinstance(value, dict) or len(value) != 1:
        return False
    (key,) = value
    return key == "Ref" or key.startswith("Fn::")


def _text(value: Any, stack: str, path: str, what: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise UnresolvedReference(stack, what, path, f"expected a string, got {json.dumps(value)[:120]}")


class Resolver:
    """Resolves the expressions of one assembly. `parameters` gives template parameter
    values: "Name" for every stack, "Stack.Name" for one (they win over a template's
    Default; an SSM-typed parameter has no local value unless given)."""

    def __init__(self, assembly: CloudAssembly, physical: PhysicalIds, *, region: str = DEFAULT_REGION,
                 account: str = DEFAULT_ACCOUNT, partition: str = "aws", url_suffix: str = "amazonaws.com",
                 parameters: Mapping[str, Any] | None = None):
        self.assembly = assembly
        self.physical = physical
        self.region, self.account, self.partition, self.url_suffix = region, account, partition, url_suffix
        self.parameters = dict(parameters or {})
        self._exports: dict[str, tuple[str, Any]] | None = None

    # -- entry points ----------------------------------------------------------------

    def resolve(self, stack: str, value: Any, path: str = "") -> Any:
        """`value` (any template JSON) with every intrinsic function replaced by its value;
        AWS::NoValue drops the key or list item holding it."""
        if isinstance(value, dict):
            if is_intrinsic(value):
                (fn, arg), = value.items()
                return self._call(stack, fn, arg, f"{path}/{fn}" if path else fn)
            out = {}
            for k, v in value.items():
                resolved = self.resolve(stack, v, f"{path}.{k}" if path else k)
                if resolved is not NO_VALUE:
                    out[k] = resolved
            return out
        if isinstance(value, list):
            items = (self.resolve(stack, v, f"{path}[{i}]") for i, v in enumerate(value))
            return [v for v in items if v is not NO_VALUE]
        return value

    def ref(self, stack: str, name: str, path: str = "") -> Any:
        pseudo = self._pseudo(stack, name)
        if pseudo is not None:
            return pseudo
        template = self.assembly.stacks[stack].template
        if name in (template.get("Parameters") or {}):
            return self._parameter(stack, name, template["Parameters"][name], path)
        return self._physical(stack, name, path).ref

    def get_att(self, stack: str, logical_id: str, attribute: str, path: str = "") -> Any:
        physical = self._physical(stack, logical_id, path)
        if attribute not in physical.attrs:
            rtype = self.assembly.stacks[stack].resources[logical_id].get("Type")
            known = ", ".join(sorted(physical.attrs)) or "none"
            raise UnresolvedReference(stack, f"{logical_id}.{attribute}", path,
                                      f"{rtype} has no local value for attribute {attribute} (known: {known})")
        return physical.attrs[attribute]

    def import_value(self, stack: str, name: str, path: str = "") -> Any:
        exports = self._export_table()
        if name not in exports:
            raise UnresolvedReference(stack, name, path, "no stack of the assembly exports this name")
        exporter, expression = exports[name]
        return self.resolve(exporter, expression, f"{exporter}.Outputs[{name}]")

    def referenced(self, stack: str, value: Any) -> tuple[str, str] | None:
        """(stack, logical id) of the resource `value` points at through Ref, Fn::GetAtt or
        Fn::ImportValue of such an export, else None (a literal, a join, ...)."""
        if not is_intrinsic(value):
            return None
        (fn, arg), = value.items()
        if fn == "Ref" and isinstance(arg, str) and arg in self.assembly.stacks[stack].resources:
            return stack, arg
        if fn == "Fn::GetAtt":
            logical = arg[0] if isinstance(arg, list) else str(arg).split(".", 1)[0]
            return (stack, logical) if logical in self.assembly.stacks[stack].resources else None
        if fn == "Fn::ImportValue" and isinstance(arg, str) and arg in self._export_table():
            return self.referenced(*self._export_table()[arg])
        return None

    # -- the functions ---------------------------------------------------------------

    def _call(self, stack: str, fn: str, arg: Any, path: str) -> Any:
        if fn == "Ref":
            return self.ref(stack, _text(arg, stack, path, "Ref"), path)
        if fn == "Fn::GetAtt":
            if isinstance(arg, str):
                logical, _, attribute = arg.partition(".")
            elif isinstance(arg, list) and len(arg) == 2:
                logical = arg[0]
                attribute = _text(self.resolve(stack, arg[1], path), stack, path, "Fn::GetAtt")
            else:
                raise UnresolvedReference(stack, "Fn::GetAtt", path, f"malformed: {json.dumps(arg)}")
            return self.get_att(stack, logical, attribute, path)
        if fn == "Fn::Join":
            delimiter, items = arg
            items = self.resolve(stack, items, path)
            if not isinstance(items, list):
                raise UnresolvedReference(stack, "Fn::Join", path, "the second argument is not a list")
            return delimiter.join(_text(v, stack, path, "Fn::Join") for v in items)
        if fn == "Fn::Sub":
            return self._sub(stack, arg, path)
        if fn == "Fn::Select":
            index, items = self.resolve(stack, arg, path)
            index = int(index)
            if not isinstance(items, list) or not 0 <= index < len(items):
                raise UnresolvedReference(stack, "Fn::Select", path, f"index {index} is outside {items!r}")
            return items[index]
        if fn == "Fn::Split":
            delimiter, source = self.resolve(stack, arg, path)
            return _text(source, stack, path, "Fn::Split").split(delimiter)
        if fn == "Fn::ImportValue":
            name = _text(self.resolve(stack, arg, path), stack, path, "Fn::ImportValue")
            return self.import_value(stack, name, path)
        if fn == "Fn::Base64":
            return base64.b64encode(_text(self.resolve(stack, arg, path), stack, path, fn).encode()).decode()
        if fn == "Fn::FindInMap":
            mapping, top, second = self.resolve(stack, arg, path)
            try:
                return self.assembly.stacks[stack].template["Mappings"][mapping][top][second]
            except KeyError:
                raise UnresolvedReference(stack, f"{mapping}.{top}.{second}", path,
                                          "no such entry in Mappings") from None
        raise UnresolvedReference(stack, fn, path, "this intrinsic function is not supported locally")

    def _sub(self, stack: str, arg: Any, path: str) -> str:
        if isinstance(arg, list):
            template, variables = arg[0], self.resolve(stack, arg[1] if len(arg) > 1 else {}, path)
        else:
            template, variables = arg, {}

        def substitute(match: re.Match) -> str:
            inner = match.group(1)
            if inner.startswith("!"):
                return "${" + inner[1:] + "}"          # ${!Literal} stays literal
            name = inner.strip()
            if name in variables:
                return _text(variables[name], stack, path, name)
            if "." in name and not name.startswith("AWS::"):
                logical, _, attribute = name.partition(".")
                return _text(self.get_att(stack, logical, attribute, path), stack, path, name)
            return _text(self.ref(stack, name, path), stack, path, name)

        return _SUB_VARIABLE.sub(substitute, _text(template, stack, path, "Fn::Sub"))

    # -- where values come from --------------------------------------------------------

    def _pseudo(self, stack: str, name: str) -> Any:
        if not name.startswith("AWS::"):
            return None
        values = {
            "AWS::Region": self.region,
            "AWS::AccountId": self.account,
            "AWS::Partition": self.partition,
            "AWS::URLSuffix": self.url_suffix,
            "AWS::StackName": stack,
            "AWS::StackId": f"arn:{self.partition}:cloudformation:{self.region}:{self.account}:stack/{stack}/local",
            "AWS::NotificationARNs": [],
            "AWS::NoValue": NO_VALUE,
        }
        if name not in values:
            raise UnresolvedReference(stack, name, "", "unknown pseudo parameter")
        return values[name]

    def _parameter(self, stack: str, name: str, spec: dict, path: str) -> Any:
        for key in (f"{stack}.{name}", name):
            if key in self.parameters:
                return self.parameters[key]
        if "Default" not in spec or str(spec.get("Type", "")).startswith(_SSM_PARAMETER):
            raise UnresolvedReference(stack, name, path, "a template parameter without a local value: pass it in "
                                                         "`parameters`")
        default = spec["Default"]
        if str(spec.get("Type", "")).startswith(("List<", "CommaDelimitedList")) and isinstance(default, str):
            return default.split(",")
        return default

    def _physical(self, stack: str, logical_id: str, path: str) -> Physical:
        try:
            return self.physical[(stack, logical_id)]
        except KeyError:
            pass
        resources = self.assembly.stacks[stack].resources if stack in self.assembly.stacks else {}
        if logical_id in resources:
            reason = f"no physical id for this {resources[logical_id].get('Type')} resource"
        else:
            reason = "no resource or parameter of this logical id in the stack"
        raise UnresolvedReference(stack, logical_id, path, reason)

    def _export_table(self) -> dict[str, tuple[str, Any]]:
        if self._exports is None:
            table = {}
            for name, (stack, expression) in self.assembly.exports().items():
                if not isinstance(name, str) or name.startswith("{"):
                    name = _text(self.resolve(stack, json.loads(name), f"{stack}.Outputs.Export.Name"), stack,
                                 "Export.Name", "Export.Name")
                table[name] = (stack, expression)
            self._exports = table
        return self._exports
