"""Shared setup of the Python module's tests.

ctest runs them as `python_bindings`, with PYTHONPATH at build/python (the
built package). They reuse the CLI parity test's float64 references and its
criterion (tests/parity/reference.py, compare.py).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("MULTIHEAD_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "parity"))

import pytest  # noqa: E402

import multihead  # noqa: E402


@pytest.fixture(scope="session")
def cli():
    """The `multihead` CLI, for parity with the C++ results: MULTIHEAD_CLI
    (ctest sets it), else the checkout's build/tools/multihead."""
    path = os.environ.get("MULTIHEAD_CLI") or os.path.join(SOURCE_DIR, "build", "tools", "multihead")
    if not os.environ.get("MULTIHEAD_CLI") and not os.path.exists(path):
        pytest.skip("no multihead CLI: set MULTIHEAD_CLI")
    assert os.access(path, os.X_OK), f"MULTIHEAD_CLI={path} is not an executable"
    return path


def pytest_report_header(config):
    return f"multihead {multihead.__version__} from {os.path.dirname(multihead.__file__)}"
