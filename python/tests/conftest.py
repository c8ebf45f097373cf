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

import multihead  # noqa: E402


def pytest_report_header(config):
    return f"multihead {multihead.__version__} from {os.path.dirname(multihead.__file__)}"
