"""Packaging: `pip wheel . --no-build-isolation` makes a wheel that installs
and imports (multihead and multihead.torch) in a fresh
`python3 -m venv --system-site-packages` environment, offline.

Two modes:
- default (ctest python_wheel, ~10 s): the wheel packages the extension this
  build already made (setup.py's MULTIHEAD_EXTENSION), so it checks the
  packaging itself (metadata, the package's files, what installs) cheaply;
- MULTIHEAD_WHEEL_FROM_SOURCE=1: pip runs setup.py's CMake build from a
  copy of the source tree (a full Release build of the library: 9 min 14 s
  with CMAKE_BUILD_PARALLEL_LEVEL=1 on the shared, loaded 2-core machine).
"""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

import multihead
from conftest import SOURCE_DIR

PYTHON = "/usr/bin/python3"
FROM_SOURCE = os.environ.get("MULTIHEAD_WHEEL_FROM_SOURCE") == "1"


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def source_copy(dest):
    """The files pip needs: everything for a build from source, else the
    package's metadata and Python files."""
    if FROM_SOURCE:
        files = run(["git", "-C", SOURCE_DIR, "ls-files"]).stdout.split()
    else:
        files = ["setup.py", "pyproject.toml", "README.md"] + [
            os.path.relpath(p, SOURCE_DIR) for p in glob.glob(os.path.join(SOURCE_DIR, "python", "multihead", "*"))]
    for f in files:
        src = os.path.join(SOURCE_DIR, f)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dest, f)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, f))


@pytest.mark.skipif(sys.executable != PYTHON and not os.path.samefile(sys.executable, PYTHON),
                    reason="the extension is built for /usr/bin/python3")
def test_wheel_installs_and_imports_in_a_fresh_venv(tmp_path):
    src, out, venv = tmp_path / "src", tmp_path / "wheels", tmp_path / "venv"
    source_copy(str(src))
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the venv must find the installed package, not the build tree
    if not FROM_SOURCE:
        ext = os.path.join(os.path.dirname(multihead.__file__), "_multihead" + sysconfig.get_config_var("EXT_SUFFIX"))
        assert os.path.isfile(ext), ext
        env["MULTIHEAD_EXTENSION"] = ext
    run([PYTHON, "-m", "pip", "wheel", ".", "--no-build-isolation", "--no-deps", "--no-index", "-w", str(out)],
        cwd=src, env=env)
    wheels = glob.glob(str(out / "multihead-*.whl"))
    assert len(wheels) == 1, wheels
    run([PYTHON, "-m", "venv", "--system-site-packages", str(venv)], env=env)
    py = str(venv / "bin" / "python")
    run([py, "-m", "pip", "install", "--no-deps", "--no-index", wheels[0]], env=env)
    check = (
        "import os, sys, multihead\n"
        "assert 'torch' not in sys.modules\n"
        f"assert multihead.__file__.startswith({str(venv)!r}), multihead.__file__\n"
        "import numpy as np, torch, multihead.torch as mt\n"
        "m = multihead.MultiheadAttention(8, 2); x = np.ones((3, 1, 8), np.float32)\n"
        "assert m(x, x, x)[0].shape == (3, 1, 8)\n"
        "t = mt.MultiheadAttention(8, 2); y = torch.randn(3, 1, 8, requires_grad=True)\n"
        "t(y, y, y)[0].sum().backward(); assert y.grad.shape == (3, 1, 8)\n"
        "print('imported', multihead.__version__)\n")
    r = run([py, "-c", check], cwd=str(tmp_path), env=env)
    assert "imported" in r.stdout
