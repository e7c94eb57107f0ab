"""Install footprint: skyfn's SDK against globus-compute-sdk, each into a fresh virtualenv
from the same package index (pip's configured one), in the same run.

    python -m benchmarks.install [--wheels build/wheels] [--gc-version 4.19.0] [--runs 9] [--json]

For each: the size on disk its install adds to the virtualenv's site-packages (disk blocks,
as du counts them; the empty virtualenv's pip is subtracted), the number of distributions it
brings, and the cold import time -- a fresh interpreter per run, median of --runs, minus the
median of an interpreter that imports nothing -- of what a user's script imports:
`import skyfn; skyfn.Client; skyfn.Executor` and `from globus_compute_sdk import Client,
Executor` (the bare `import skyfn` / `import globus_compute_sdk` is reported too). skyfn's
SDK is its wheel (scripts/build_wheels.py) with requirements.txt's pins as constraints.
The last line is one JSON object (--json) with `sdk_size_over_gc` and `sdk_import_over_gc`
(goal: at most 1.0 each).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GC_VERSION = "4.19.0"

IMPORTS = {
    "sdk": ("import skyfn; skyfn.Client; skyfn.Executor", "import skyfn"),
    "gc": ("from globus_compute_sdk import Client, Executor", "import globus_compute_sdk"),
}


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    proc = subprocess.run(cmd, env=_env(), cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return proc.stdout


def disk_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def site_packages(venv: Path) -> Path:
    (sp,) = (venv / "lib").glob("python3*/site-packages")
    return sp


def dists(python: Path, cwd: Path) -> set[str]:
    """Distributions installed in the virtualenv (run from `cwd`: a checkout's egg-info must not count)."""
    out = _run([str(python), "-c", "import importlib.metadata as m\n"
                "print('\\n'.join(sorted({d.metadata['Name'].lower() for d in m.distributions()})))"], cwd=cwd)
    return set(out.split())


def import_seconds(python: Path, code: str, runs: int, cwd: Path) -> float:
    def once(stmt: str) -> float:
        t = time.perf_counter()
        _run([str(python), "-c", stmt], cwd=cwd)
        return time.perf_counter() - t

    once(code)  # the first import after install may still write bytecode
    base, full = [], []
    for _ in range(runs):  # interleaved, so load on the machine hits both alike
        base.append(once("pass"))
        full.append(once(code))
    return max(0.0, statistics.median(full) - statistics.median(base))


def measure(name: str, requirements: list[str], pip_args: list[str], runs: int, work: Path) -> dict:
    venv = work / name
    base = getattr(sys, "_base_executable", sys.executable)
    _run([base, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    sp = site_packages(venv)
    before_bytes, before_dists = disk_bytes(sp), dists(python, work)
    t = time.perf_counter()
    _run([str(python), "-m", "pip", "install", "-q", "--only-binary", ":all:", *pip_args, *requirements])
    install_s = time.perf_counter() - t
    added = dists(python, work) - before_dists
    full_code, bare_code = IMPORTS[name]
    return {
        "size_bytes": disk_bytes(sp) - before_bytes,
        "distributions": len(added),
        "distribution_names": sorted(added),
        "install_seconds": round(install_s, 1),
        "import_seconds": round(import_seconds(python, full_code, runs, work), 4),
        "bare_import_seconds": round(import_seconds(python, bare_code, runs, work), 4),
    }


def constraints(dest: Path) -> Path:
    """requirements.txt's pins as a constraints file: the install check's own (scripts/ is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_install", REPO / "scripts" / "check_install.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.constraints(dest)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", default=str(REPO / "build" / "wheels"), help="where skyfn's SDK wheel is")
    ap.add_argument("--gc-version", default=GC_VERSION, help="globus-compute-sdk version")
    ap.add_argument("--runs", type=int, default=9, help="fresh interpreters per import timing")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    wheel = next(Path(args.wheels).glob("skyfn-*-py3-none-any.whl"), None)
    if wheel is None:
        print(f"error: no skyfn SDK wheel in {args.wheels}: run `make wheels` first", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="skyfn-bench-install-"))
    try:
        cons = constraints(work / "constraints.txt")
        sdk = measure("sdk", [str(wheel.resolve())], ["--constraint", str(cons)], args.runs, work)
        gc = measure("gc", [f"globus-compute-sdk=={args.gc_version}"], [], args.runs, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {
        "sdk": sdk, "gc": gc, "gc_version": args.gc_version, "runs": args.runs,
        "sdk_size_over_gc": round(sdk["size_bytes"] / gc["size_bytes"], 3),
        "sdk_import_over_gc": round(sdk["import_seconds"] / gc["import_seconds"], 3) if gc["import_seconds"] else None,
        "sdk_distributions_over_gc": round(sdk["distributions"] / gc["distributions"], 3),
        "sdk_bare_import_over_gc": (round(sdk["bare_import_seconds"] / gc["bare_import_seconds"], 3)
                                    if gc["bare_import_seconds"] else None),
    }
    if not args.json:
        for k in ("sdk", "gc"):
            r = out[k]
            print(f"{k:>3}: {r['size_bytes'] / 1e6:6.1f} MB on disk, {r['distributions']:3d} distributions, "
                  f"import {r['import_seconds'] * 1000:6.1f} ms (bare {r['bare_import_seconds'] * 1000:.1f} ms)")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
