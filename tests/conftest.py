"""Shared pytest fixtures."""

import pytest

from _subprocess import run_python as _run_python


@pytest.fixture
def run_python():
    """``run_python(code, env=None, expect_rc=0, args=None) -> output`` in a fresh interpreter."""
    return _run_python
