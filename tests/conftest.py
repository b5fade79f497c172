"""Shared pytest fixtures."""

import os
import sys
from pathlib import Path

import pytest

from _subprocess import run_python as _run_python

# The coverage sweeps are scripts in the repository's coverage/ folder, outside the installed
# package; their tests import them as top-level modules (as the scripts import each other).
sys.path.append(str(next(p / "coverage" for p in Path(__file__).resolve().parents if (p / "coverage" / "_sweep.py").is_file())))


@pytest.fixture
def run_python():
    """``run_python(code, env=None, expect_rc=0, args=None, quiet=False) -> output`` in a fresh interpreter."""
    return _run_python


@pytest.fixture(autouse=True)
def _restore_environment():
    """Every test ends with the environment it started with. Libraries leave variables behind:
    PEFT's BOFT sets CC=CXX=gcc to build its CUDA extension and, when the build fails (always,
    without CUDA), never unsets them; every torchrun rank started later then had Inductor link
    its C++ kernels with gcc, without libstdc++ ("undefined symbol ... basic_ostringstream")."""
    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)
