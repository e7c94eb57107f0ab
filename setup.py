"""Build of skyfn's compiled part: the communicator extension comm._core (Cython binding
comm/_core.pyx over the C++17 core in comm/cpp, the same sources CMake builds). Everything
else is declared in pyproject.toml; `pip install .` and `pip install -e .` both run this.
"""
from glob import glob

from Cython.Build import cythonize
from setuptools import Extension, setup

comm_core = Extension(
    "comm._core",
    sources=["comm/_core.pyx"] + sorted(glob("comm/cpp/src/*.cpp")),
    include_dirs=["comm", "comm/cpp/include", "comm/cpp/src"],
    language="c++",
    extra_compile_args=["-std=c++17", "-O2", "-pthread", "-g0"],
    extra_link_args=["-pthread"],
)

setup(
    ext_modules=cythonize([comm_core], language_level=3),
    options={"build_ext": {"parallel": 2}},
)
