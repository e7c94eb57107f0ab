"""The extension of skyfn-comm: comm._core, the Cython binding comm/_core.pyx over the C++17
core in comm/cpp (the sources CMake builds in the repository). Run from the staged directory
scripts/build_wheels.py makes, where comm/ sits beside this file."""
from glob import glob

from Cython.Build import cythonize
from setuptools import Extension, setup

core = Extension(
    "comm._core",
    sources=["comm/_core.pyx"] + sorted(glob("comm/cpp/src/*.cpp")),
    include_dirs=["comm", "comm/cpp/include", "comm/cpp/src"],
    language="c++",
    extra_compile_args=["-std=c++17", "-O2", "-pthread", "-g0"],
    extra_link_args=["-pthread"],
)

setup(
    packages=["comm"],
    ext_modules=cythonize([core], language_level=3),
    options={"build_ext": {"parallel": 2}},
)
