"""lambdas/settings_catalog.py (issue 25): each handler's list of the environment it reads is
what its code reads -- scanned from the source of every module the handler imports, both
ways -- and the cold-start check under SKYFN_SETTINGS_CHECK=strict refuses a function that
lacks a required variable, naming it, the handler and the stack to fix."""
from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys

import pytest

from lambdas import settings_catalog as sc
from stepfunctions import catalog
from tests.repo_modules import REPO, module_path
SOURCE_PACKAGES = ("lambdas", "skyfn", "rendezvous", "stepfunctions", "comm")
# Reads whose variable name is not in the code, with the reason they are not settings.
DYNAMIC_READS = {"lambdas.core.identity.secret_env": "the names SKYFN_SECRET_ENV maps (secrets, not settings)"}


# --- the scan: what a handler's code reads ----------------------------------------------
@functools.lru_cache(maxsize=None)
def _tree(module: str) -> ast.Module:
    return ast.parse(module_path(module).read_text())


def imported(module: str) -> set[str]:
    """The modules of this repository `module` imports, anywhere in the file (handlers
    import inside functions), with the packages whose __init__ the import runs."""
    path = module_path(module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            names |= {base} | {f"{base}.{a.name}" for a in node.names}
    out = set()
    for name in names:
        parts = name.split(".")
        if parts[0] in SOURCE_PACKAGES:
            out |= {p for k in range(1, len(parts) + 1) if module_path(p := ".".join(parts[:k]))}
    return out


@functools.lru_cache(maxsize=None)
def reachable(module: str) -> frozenset[str]:
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m not in seen and module_path(m):
            seen.add(m)
            todo += imported(m)
    return frozenset(seen)


def reads_of(source: str) -> tuple[set[str], list[str]]:
    """(variable names read, reads whose name the scan cannot tell) of one module's source.
    Reads: os.environ.get(X), os.environ[X], os.getenv(X) (os under any alias, environ or
    getenv imported from os, `e = os.environ.get`, a name bound to os.environ), and calls of the module's own helpers that
    pass their first parameter on to one (lambdas/config.py: _float("SKYFN_RESULT_TTL", ...)).
    X: a string literal or a module-level string constant."""
    tree = ast.parse(source)
    os_names, environ_names, getenv_names, consts = set(), set(), set(), {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            consts[node.targets[0].id] = node.value.value
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            os_names |= {a.asname or "os" for a in node.names if a.name == "os"}
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            environ_names |= {a.asname or a.name for a in node.names if a.name == "environ"}
            getenv_names |= {a.asname or a.name for a in node.names if a.name == "getenv"}

    def is_environ(e: ast.AST) -> bool:
        return ((isinstance(e, ast.Attribute) and e.attr == "environ" and isinstance(e.value, ast.Name)
                 and e.value.id in os_names) or (isinstance(e, ast.Name) and e.id in environ_names))

    def is_get(f: ast.AST) -> bool:
        return ((isinstance(f, ast.Attribute) and f.attr == "get" and is_environ(f.value))
                or (isinstance(f, ast.Attribute) and f.attr == "getenv" and isinstance(f.value, ast.Name)
                    and f.value.id in os_names)
                or (isinstance(f, ast.Name) and f.id in getenv_names))

    # `environ = os.environ if environ is None else environ`: a mapping defaulting to the environment
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(is_environ(v) for v in (
                (node.value.body, node.value.orelse) if isinstance(node.value, ast.IfExp) else (node.value,))):
            environ_names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    aliases = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and is_get(node.value)
               for t in node.targets if isinstance(t, ast.Name)}
    enclosing: dict[ast.AST, ast.FunctionDef] = {}
    for fn in ast.walk(tree):  # outer functions first: an inner one overwrites its own nodes
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            enclosing.update((n, fn) for n in ast.walk(fn))
    helpers: set[str] = set()
    while True:
        found, dynamic, grew = set(), [], False
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.args and (
                    is_get(node.func) or (isinstance(node.func, ast.Name) and node.func.id in aliases | helpers)):
                arg = node.args[0]
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and is_environ(node.value):
                arg = node.slice
            else:
                continue
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value)
            elif isinstance(arg, ast.Name) and arg.id in consts:
                found.add(consts[arg.id])
            elif (isinstance(arg, ast.Name) and (fn := enclosing.get(node)) is not None and fn.args.args
                  and fn.args.args[0].arg == arg.id):
                assert fn.name.startswith("_"), (
                    f"{fn.name} reads the variable named by its argument: the scan follows only a module's private "
                    "helpers; make it private, or read the variable where its name is written")
                grew |= fn.name not in helpers
                helpers.add(fn.name)
            else:
                dynamic.append(f"line {node.lineno}: {ast.unparse(node)}")
        if not grew:
            return found, dynamic


@functools.lru_cache(maxsize=None)
def module_reads(module: str) -> tuple[frozenset[str], tuple[str, ...]]:
    found, dynamic = reads_of(module_path(module).read_text())
    return frozenset(found), tuple(dynamic)


def handler_reads(handler: str) -> dict[str, set[str]]:
    """variable -> the modules reachable from `handler` that read it."""
    out: dict[str, set[str]] = {}
    for module in reachable(handler.rpartition(".")[0]):
        for name in module_reads(module)[0]:
            out.setdefault(name, set()).add(module)
    return out


# --- the scan finds what it must ----------------------------------------------------------
def test_the_scan_sees_every_form_of_read():
    source = '''
import os as _os
from os import environ, getenv
NAME = "CONST_VAR"
def _float(name, default):
    raw = _os.environ.get(name)
    return raw
def _positive(name, default):
    return _float(name, default)
def settings():
    e = _os.environ.get
    return (_positive("HELPER_VAR", 1), e("ALIAS_VAR", ""), environ["SUBSCRIPT_VAR"], getenv("GETENV_VAR"),
            _os.environ.get(NAME), _os.getenv("OS_GETENV_VAR"))
def check(environ=None):
    environ = _os.environ if environ is None else environ
    return environ.get("BOUND_VAR")
def dynamic(mapping):
    _os.environ["SET_ONLY"] = "x"
    return [_os.environ.get(k) for k in mapping]
'''
    found, dynamic = reads_of(source)
    assert found == {"CONST_VAR", "HELPER_VAR", "ALIAS_VAR", "SUBSCRIPT_VAR", "GETENV_VAR", "OS_GETENV_VAR",
                     "BOUND_VAR"}
    assert len(dynamic) == 1 and "_os.environ.get(k)" in dynamic[0]


def test_the_scan_sees_the_settings_read_through_helpers():
    config = module_reads("lambdas.config")[0]
    assert {"SKYFN_RESULT_TTL", "SKYFN_DIRECT_SESSION_TTL", "SKYFN_BACKLOG_MAX", "SKYFN_BACKLOG_MEMORY_FRACTION",
            "SKYFN_REDIS_URL"} <= config
    assert config == sc.SETTINGS
    assert "SKYFN_SECRET_ENV" in module_reads("lambdas")[0]  # `import os as _os`
    assert "lambdas.core.tasks.push" in reachable("lambdas.results")  # imported inside a function


# --- the lists are what the code reads ----------------------------------------------------
def test_every_read_names_its_variable():
    unknown = {m: module_reads(m)[1] for h in sc.HANDLERS for m in reachable(h.rpartition(".")[0])
               if module_reads(m)[1] and m not in DYNAMIC_READS}
    assert unknown == {}, f"environment reads whose variable the scan cannot name: {unknown}: write the name in the call"


@pytest.mark.parametrize("handler", sorted(sc.HANDLERS))
def test_each_handler_lists_exactly_what_its_code_reads(handler):
    entry = sc.HANDLERS[handler]
    reads = handler_reads(handler)
    unlisted = {name: sorted(mods) for name, mods in reads.items()
                if name not in entry.reads and name not in sc.AWS_PROVIDED}
    assert unlisted == {}, (f"{handler} reads {unlisted} (variable: modules) but lambdas/settings_catalog.py does not "
                            "list them: add each to its required (its template must set it) or optional reads")
    unread = sorted(entry.reads - set(reads))
    assert unread == [], f"{handler}: lambdas/settings_catalog.py lists {unread}, which no code it imports reads"
    assert not entry.required & entry.optional


def test_the_variables_lambda_provides_are_read():
    everything = set().union(*(handler_reads(h) for h in sc.HANDLERS))
    assert sc.AWS_PROVIDED <= everything


def test_every_listed_variable_is_documented_and_every_documented_one_listed():
    listed = set().union(*(e.reads for e in sc.HANDLERS.values()))
    assert sorted(listed - set(sc.VARIABLES)) == []
    assert sorted(set(sc.VARIABLES) - listed) == []


def test_the_list_covers_every_function_of_the_deployment():
    from infra.aws.config import AUTHORIZER, FUNCTIONS, UI, WS_AUTHORIZER, WS_ROUTES

    deployed = ({s.handler for s in FUNCTIONS.values()} | {s.handler for s in (AUTHORIZER, WS_ROUTES, WS_AUTHORIZER, UI)}
                | {s.handler for s in catalog.STEPS.values()})
    assert set(sc.HANDLERS) == deployed


def test_the_requirements_agree_with_what_the_cdk_app_is_told():
    from infra.aws.config import FUNCTIONS, PUSH_FUNCTIONS, PUSH_STEPS

    pushers = {FUNCTIONS[k].handler for k in PUSH_FUNCTIONS} | {catalog.STEPS[k].handler for k in PUSH_STEPS}
    for handler, entry in sc.HANDLERS.items():
        assert (sc.PUSH <= entry.required) == (handler in pushers), handler
    assert set(catalog.API_ENV) <= sc.HANDLERS["lambdas.api.handler"].required
    for step in catalog.STEPS.values():
        assert set(step.env) <= sc.HANDLERS[step.handler].required, step.key


# --- the check --------------------------------------------------------------------------
def _environment(handler: str, **extra: str) -> dict[str, str]:
    return {**{name: "x" for name in sc.HANDLERS[handler].required}, **extra}


def test_strict_check_names_the_missing_variable_the_handler_and_the_fix():
    env = _environment("lambdas.api.handler", SKYFN_SETTINGS_CHECK="strict", _HANDLER="lambdas.api.handler")
    del env["SKYFN_BUCKET"]
    with pytest.raises(sc.SettingsError) as err:
        sc.check_started(env)
    message = str(err.value)
    assert message.startswith("lambdas.api.handler needs SKYFN_BUCKET, which its function's environment does not "
                              "set: add it to the function in infra/aws/stacks/service.py")
    del env["SKYFN_WS_ENDPOINT"]
    with pytest.raises(sc.SettingsError, match="needs SKYFN_BUCKET, SKYFN_WS_ENDPOINT, .* add them"):
        sc.check_started(env)


def test_strict_check_passes_when_every_required_variable_is_set():
    for handler in sc.HANDLERS:
        sc.check_started(_environment(handler, SKYFN_SETTINGS_CHECK="strict", _HANDLER=handler))


def test_variables_from_secrets_count_as_set():
    handler = catalog.SPMD_INIT.handler
    env = _environment(handler, SKYFN_SETTINGS_CHECK="strict", _HANDLER=handler)
    del env["SKYFN_REDIS_PASSWORD"], env["SKYFN_RENDEZVOUS_SECRET"]
    with pytest.raises(sc.SettingsError, match="SKYFN_REDIS_PASSWORD, SKYFN_RENDEZVOUS_SECRET"):
        sc.check_started(env)
    env["SKYFN_SECRET_ENV"] = json.dumps({"SKYFN_REDIS_PASSWORD": "arn:aws:secretsmanager:r:1:secret:a",
                                          "SKYFN_RENDEZVOUS_SECRET": "arn:aws:secretsmanager:r:1:secret:b"})
    sc.check_started(env)


def test_without_strict_nothing_is_checked():
    for mode in ("", "off"):
        sc.check_started({"SKYFN_SETTINGS_CHECK": mode, "_HANDLER": "lambdas.api.handler"})
    sc.check_started({"_HANDLER": "no.such.handler"})


def test_strict_refuses_an_unknown_handler_a_missing_handler_name_and_an_unknown_mode():
    with pytest.raises(sc.SettingsError, match="lambdas.nope.handler is not listed"):
        sc.check_started({"SKYFN_SETTINGS_CHECK": "strict", "_HANDLER": "lambdas.nope.handler"})
    with pytest.raises(sc.SettingsError, match="_HANDLER"):
        sc.check_started({"SKYFN_SETTINGS_CHECK": "strict"})
    with pytest.raises(sc.SettingsError, match="allowed values"):
        sc.check_started({"SKYFN_SETTINGS_CHECK": "strcit", "_HANDLER": "lambdas.ui.handler"})


def _import_lambdas(env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    return subprocess.run([sys.executable, "-c", "import lambdas"], cwd=REPO, env={**base, **env},
                          capture_output=True, text=True, timeout=60)


def test_the_cold_start_of_a_function_runs_the_check():
    env = {"SKYFN_SETTINGS_CHECK": "strict", "_HANDLER": "lambdas.ui.handler", "PYTHONPATH": str(REPO)}
    refused = _import_lambdas(env)
    assert refused.returncode != 0
    assert ("SettingsError: lambdas.ui.handler needs SKYFN_WS_URL, which its function's environment does not set: "
            "add it to the function in infra/aws/stacks/status_page.py") in refused.stderr
    assert _import_lambdas({**env, "SKYFN_WS_URL": "wss://example/ci"}).returncode == 0
