"""setuptools glue for `pip install .`: CMake builds the extension.

The extension `multihead._multihead` is the CMake target multihead_python
(python/CMakeLists.txt), built for the interpreter running pip, with the
library linked in statically; setuptools then packages it with the files of
python/multihead/. The metadata is in pyproject.toml.

Environment: CMAKE_ARGS (extra -D options, split on spaces),
CMAKE_BUILD_PARALLEL_LEVEL (jobs, default 2), MULTIHEAD_EXTENSION (the path
of an extension already built for this interpreter, e.g.
build/python/multihead/_multihead.cpython-311-x86_64-linux-gnu.so: packaged
as it is, without running CMake; the wheel test uses it to check the
packaging in seconds).
"""
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        prebuilt = os.environ.get("MULTIHEAD_EXTENSION")
        if prebuilt:
            if os.path.basename(prebuilt) != os.path.basename(self.get_ext_filename(ext.name)):
                raise RuntimeError(f"MULTIHEAD_EXTENSION: expected an extension named "
                                   f"{os.path.basename(self.get_ext_filename(ext.name))} (this interpreter's), "
                                   f"got {prebuilt}")
            shutil.copyfile(prebuilt, target)
            return
        build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        configure = [
            "cmake", "-S", ROOT, "-B", build_dir,
            "-DCMAKE_BUILD_TYPE=Release",
            "-DMULTIHEAD_BUILD_PYTHON=ON",
            "-DMULTIHEAD_BUILD_TESTS=OFF",
            "-DMULTIHEAD_BUILD_TOOLS=OFF",
            f"-DMULTIHEAD_PYTHON_EXECUTABLE={sys.executable}",
        ] + os.environ.get("CMAKE_ARGS", "").split()
        subprocess.run(configure, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")
        subprocess.run(["cmake", "--build", build_dir, "--target", "multihead_python", "-j", jobs], check=True)
        built = os.path.join(build_dir, "python", "multihead", os.path.basename(self.get_ext_filename(ext.name)))
        shutil.copyfile(built, target)


setup(ext_modules=[CMakeExtension("multihead._multihead")], cmdclass={"build_ext": CMakeBuild})
