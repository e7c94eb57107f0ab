"""The install check (`make test-install`, part of `make test`): skyfn installed from its
wheels the way users install it, not from the checkout.

    python scripts/check_install.py [--wheels build/wheels] [--workdir build/install-check] [--json]

1. The SDK wheel alone into a fresh virtualenv, binary distributions only and no compiler
   (CC/CXX point at /bin/false): none of boto3, botocore, moto, pyarrow, numpy, pyzmq,
   aws-lambda-powertools, redis comes with it; `skyfn --help` works; `skyfn local up` and
   `skyfn-endpoint` say which extra to install; `import skyfn` (Client, Executor, skyfn.data)
   loads none of boto3, botocore, moto, zmq, pyarrow, numpy.
2. `skyfn[all]` (the same wheel, the skyfn-comm platform wheel, the extras' dependencies)
   into a second fresh virtualenv: the same sys.modules rule holds with all of them installed;
   the compiled communicator imports; `skyfn local up --detach` starts the embedded runtime.
3. From the SDK-only virtualenv: a function runs through that runtime (Client.run and an
   Executor map), and the sys.modules rule still holds after it ran. Then `skyfn local down`.

Dependencies are constrained to the exact pins of requirements.txt (the lock CI uses).
Exit code 1 with the failed step and its output.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY_MODULES = ("boto3", "botocore", "moto", "zmq", "pyarrow", "numpy")
HEAVY_DISTS = ("boto3", "botocore", "moto", "pyarrow", "numpy", "pyzmq", "aws-lambda-powertools", "redis",
               "cryptography")
SDK_CODE = ("import skyfn, sys; skyfn.Client; skyfn.Executor; import skyfn.config, skyfn.http, skyfn.data, "
            "skyfn.protocol\nprint(sorted({m.split('.')[0] for m in sys.modules}))")

RUN_THROUGH_RUNTIME = r'''
import json, sys, time
from skyfn import Client, Executor

def square(x):
    return x * x

t0 = time.monotonic()
with Client() as client:
    tid = client.run(square, 7, endpoint_id=client.endpoint_id("local"))
    one = client.get_result(tid, timeout=120)
with Executor(endpoint="local") as ex:
    mapped = list(ex.map(square, range(20)))
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(%r))
print(json.dumps({"run": one, "map": mapped, "seconds": round(time.monotonic() - t0, 2), "heavy": heavy}))
'''


class CheckFailed(Exception):
    pass


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(extra)
    return env


def run(cmd: list[str], *, what: str, env: dict | None = None, cwd: Path | None = None, expect: int = 0,
        timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=env or clean_env(), cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != expect:
        raise CheckFailed(f"{what}: `{' '.join(map(str, cmd))}` exited {proc.returncode} (expected {expect}):\n"
                          f"{(proc.stdout + proc.stderr)[-4000:]}")
    return proc


def constraints(dest: Path) -> Path:
    """requirements.txt's pins as a constraints file (pip refuses extras in constraints)."""
    lines = []
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            lines.append(re.sub(r"\[[^\]]*\]", "", line))
    dest.write_text("\n".join(lines) + "\n")
    return dest


def make_venv(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    base = getattr(sys, "_base_executable", sys.executable)
    run([base, "-m", "venv", str(path)], what=f"create {path}")
    return path / "bin" / "python"


def pip_install(python: Path, args: list[str], cons: Path, wheels: Path, what: str) -> float:
    # no compiler: a dependency that would need building fails instead of compiling
    env = clean_env(CC="/bin/false", CXX="/bin/false", PIP_ONLY_BINARY=":all:")
    t0 = time.monotonic()
    run([str(python), "-m", "pip", "install", "-q", "--only-binary", ":all:", "--constraint", str(cons),
         "--find-links", str(wheels), *args], what=what, env=env)
    return round(time.monotonic() - t0, 1)


def distributions(python: Path) -> list[str]:
    out = run([str(python), "-c", "import importlib.metadata as m, json; "
               "print(json.dumps(sorted({d.metadata['Name'].lower() for d in m.distributions()})))"],
              what="list distributions").stdout
    return json.loads(out)


def modules_after(python: Path, code: str, what: str, env: dict | None = None) -> set[str]:
    out = run([str(python), "-c", code], what=what, env=env).stdout.strip().splitlines()[-1]
    return set(json.loads(out.replace("'", '"')))


def check(wheels: Path, work: Path) -> dict:
    sdk_wheel = next(wheels.glob("skyfn-*-py3-none-any.whl"), None)
    if sdk_wheel is None or not next(wheels.glob("skyfn_comm-*.whl"), None):
        raise CheckFailed(f"no skyfn / skyfn-comm wheels in {wheels}: run scripts/build_wheels.py first")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    # every command runs from here: from the checkout, `python -c` would import its skyfn, not the wheel's
    os.chdir(work)
    cons = constraints(work / "constraints.txt")
    report: dict = {"sdk_wheel": sdk_wheel.name}

    # 1. the SDK alone
    sdk_py = make_venv(work / "sdk")
    report["sdk_install_seconds"] = pip_install(sdk_py, [str(sdk_wheel)], cons, wheels, "install the SDK wheel")
    dists = distributions(sdk_py)
    brought = sorted(set(dists) & set(HEAVY_DISTS))
    if brought:
        raise CheckFailed(f"the SDK wheel brought {brought}")
    report["sdk_distributions"] = len(dists)
    sdk_bin = sdk_py.parent
    help_out = run([str(sdk_bin / "skyfn"), "--help"], what="skyfn --help (SDK only)").stdout
    if "local" not in help_out or "login" not in help_out:
        raise CheckFailed(f"skyfn --help does not list its commands:\n{help_out}")
    home = work / "home"
    home.mkdir()
    local = run([str(sdk_bin / "skyfn"), "local", "up", "--detach"], what="skyfn local up (SDK only)",
                env=clean_env(SKYFN_HOME=str(home)), expect=1)
    if "pip install 'skyfn[local]'" not in local.stderr:
        raise CheckFailed(f"skyfn local up without the runtime does not say how to install it:\n{local.stderr}")
    ep = run([str(sdk_bin / "skyfn-endpoint"), "list"], what="skyfn-endpoint (SDK only)", expect=1)
    if "pip install 'skyfn[endpoint]'" not in ep.stderr:
        raise CheckFailed(f"skyfn-endpoint without the agent does not say how to install it:\n{ep.stderr}")
    loaded = modules_after(sdk_py, SDK_CODE, "import skyfn (SDK only)") & set(HEAVY_MODULES)
    if loaded:
        raise CheckFailed(f"import skyfn loaded {sorted(loaded)} (SDK only)")

    # 2. everything
    full_py = make_venv(work / "full")
    report["full_install_seconds"] = pip_install(full_py, [f"skyfn[all] @ {sdk_wheel.as_uri()}"], cons, wheels,
                                                 "install skyfn[all] from the wheels")
    full_dists = distributions(full_py)
    missing = [d for d in ("skyfn-comm", "boto3", "moto", "pyzmq", "numpy", "pyarrow") if d not in full_dists]
    if missing:
        raise CheckFailed(f"skyfn[all] did not bring {missing}")
    report["full_distributions"] = len(full_dists)
    loaded = modules_after(full_py, SDK_CODE, "import skyfn (full install)") & set(HEAVY_MODULES)
    if loaded:
        raise CheckFailed(f"import skyfn loaded {sorted(loaded)} with everything installed")
    run([str(full_py), "-c", "import comm, comm._core; from comm import Communicator; "
         "assert comm._core.__file__.endswith('.so')"], what="the compiled communicator imports", cwd=work)
    full_bin = full_py.parent
    env = clean_env(SKYFN_HOME=str(home))
    run([str(full_bin / "skyfn-endpoint"), "--help"], what="skyfn-endpoint --help (full install)", env=env)
    t0 = time.monotonic()
    run([str(full_bin / "skyfn"), "local", "up", "--detach"], what="skyfn local up (full install)", env=env,
        cwd=work, timeout=300)
    report["local_up_seconds"] = round(time.monotonic() - t0, 1)
    try:
        # 3. a function through it, from the SDK-only virtualenv
        out = run([str(sdk_py), "-c", RUN_THROUGH_RUNTIME % (HEAVY_MODULES,)],
                  what="run a function through the embedded runtime (SDK only)", env=env, cwd=work, timeout=300)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        if result["run"] != 49 or result["map"] != [x * x for x in range(20)]:
            raise CheckFailed(f"wrong results through the runtime: {result}")
        if result["heavy"]:
            raise CheckFailed(f"running tasks loaded {result['heavy']} in the SDK")
        report["run_seconds"] = result["seconds"]
    finally:
        run([str(full_bin / "skyfn"), "local", "down"], what="skyfn local down", env=env, cwd=work, timeout=120)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", default=str(REPO / "build" / "wheels"))
    ap.add_argument("--workdir", default=str(REPO / "build" / "install-check"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        report = check(Path(args.wheels).resolve(), Path(args.workdir).resolve())
    except (CheckFailed, subprocess.TimeoutExpired) as exc:
        print(f"install check FAILED: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.json else
          "install check passed: " + ", ".join(f"{k} {v}" for k, v in report.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
