"""Builds strata._core with the repository's CMake (target strata_python) for `pip install .`.

The build needs what tools/setup.sh installs (a C++20 compiler, CMake, the Debian -dev packages,
pybind11-dev, python3-dev). STRATA_CMAKE_ARGS adds CMake arguments, e.g. -DSTRATA_CUDA=OFF.
"""
import os
import pathlib
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = pathlib.Path(self.build_temp).resolve() / "cmake"
        configure = ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                     "-DSTRATA_PYTHON=ON", "-DSTRATA_BUILD_TESTS=OFF",
                     f"-DPython3_EXECUTABLE={sys.executable}"]
        configure += shlex.split(os.environ.get("STRATA_CMAKE_ARGS", ""))
        subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", str(build), "--target", "strata_python",
                               "--parallel", str(os.cpu_count() or 1)])
        built = sorted((build / "python" / "strata").glob("_core*.so"))
        if not built:
            raise RuntimeError(f"the CMake build left no _core*.so in {build}/python/strata")
        dest = pathlib.Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[0], dest)


setup(
    packages=["strata"],
    package_dir={"": "python"},
    ext_modules=[CMakeExtension("strata._core")],
    cmdclass={"build_ext": CMakeBuild},
    # Not build/: that is the CMake build folder of tools/build.sh.
    options={"build": {"build_base": "build-pip"}},
)
