"""Run a Python snippet in a fresh interpreter (for env-var, autoload and fork tests)."""

import os
import subprocess
import sys


def run_python(code: str, env: dict | None = None, expect_rc: int | None = 0, args: list | None = None,
               quiet: bool = False) -> str:
    """``quiet``: the interpreter must also print nothing on stderr (no warning, no log line)."""
    full_env = dict(os.environ)
    for k, v in (env or {}).items():
        if v is None:
            full_env.pop(k, None)
        else:
            full_env[k] = v
    cmd = [sys.executable] + (args if args is not None else ["-c", code])
    proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=300)
    if expect_rc is not None and proc.returncode != expect_rc:
        raise AssertionError(
            f"exit {proc.returncode} (expected {expect_rc})\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    if quiet and proc.stderr:
        raise AssertionError(f"expected nothing on stderr, got:\n{proc.stderr}")
    return proc.stdout + (proc.stderr if expect_rc not in (None, 0) else "")
