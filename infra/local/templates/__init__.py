"""`skyfn local up --from-templates`: the service as the synthesized CloudFormation templates
(`cdk.out/`, or $SKYFN_CDK_OUT) describe it. assembly reads the cloud assembly, intrinsics
resolves CloudFormation expressions, naming gives each resource its local physical id and
attributes, model resolves the whole deployment (functions, data resources, rules, roles)
and provision creates the data resources in moto."""
from infra.local.templates.assembly import AssemblyError, CloudAssembly, Resource
from infra.local.templates.intrinsics import Physical, Resolver, UnresolvedReference
from infra.local.templates.model import Deployment
from infra.local.templates.settings import LocalSettings

__all__ = ["AssemblyError", "CloudAssembly", "Deployment", "LocalSettings", "Physical", "Resolver", "Resource",
           "UnresolvedReference"]
