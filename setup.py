"""What goes into the `skyfn` distribution (metadata: pyproject.toml).

- A wheel or an sdist (`python -m build`, `pip install .`): pure Python -- skyfn, endpoint_agent,
  lambdas, infra, rendezvous, stepfunctions -- and never the communicator, which is its own
  platform wheel, skyfn-comm (packaging/skyfn-comm, scripts/build_wheels.py; `skyfn[comm]`).
- An editable install (`pip install -e .`, what `make install` runs): also `comm`, with its
  extension comm._core compiled in place (Cython binding comm/_core.pyx over the C++17 core
  in comm/cpp, the same sources CMake builds), so a checkout has everything.
"""
import sys
from glob import glob
from pathlib import Path

from setuptools import find_packages, setup

PURE = ["skyfn", "skyfn.*", "lambdas", "lambdas.*", "endpoint_agent", "endpoint_agent.*", "infra", "infra.*",
        "rendezvous", "rendezvous.*", "stepfunctions", "stepfunctions.*"]
EDITABLE = any(cmd in sys.argv for cmd in ("editable_wheel", "develop", "build_ext"))


def comm_extension():
    from Cython.Build import cythonize
    from setuptools import Extension

    core = Extension(
        "comm._core",
        sources=["comm/_core.pyx"] + sorted(glob("comm/cpp/src/*.cpp")),
        include_dirs=["comm", "comm/cpp/include", "comm/cpp/src"],
        language="c++",
        extra_compile_args=["-std=c++17", "-O2", "-pthread", "-g0"],
        extra_link_args=["-pthread"],
    )
    return cythonize([core], language_level=3)


def data_dirs(packages):
    """Directories of data files only (stepfunctions/definitions, infra/aws/docker, ...) under
    the packages: shipped whole, each as a package of its own."""
    out = []
    for pkg in packages:
        for sub in sorted(Path(*pkg.split(".")).iterdir()):
            if sub.is_dir() and sub.name != "__pycache__" and not (sub / "__init__.py").exists():
                out.append(f"{pkg}.{sub.name}")
    return out


PACKAGES = find_packages(include=PURE + (["comm", "comm.*"] if EDITABLE else []))
DATA = data_dirs([p for p in PACKAGES if not p.startswith("comm")])

setup(
    packages=PACKAGES + DATA,
    # data files beside the code: ASL definitions, the status page, READMEs, the rendezvous Dockerfile
    package_data={"": ["*.json", "*.html", "*.js", "*.css", "*.svg", "*.md"], **{d: ["*"] for d in DATA}},
    ext_modules=comm_extension() if EDITABLE else [],
    options={"build_ext": {"parallel": 2}},
)
