"""The ``TORCH_NEURONX_*`` switches of the compile stack, parsed one way."""

from __future__ import annotations

import os


def env_flag(name: str, default: bool) -> bool:
    """A boolean environment variable: 1/true/yes/on or 0/false/no/off; unset or empty is ``default``."""
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    if v.lower() in ("1", "true", "yes", "on"):
        return True
    if v.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={v!r} is not a boolean; use 1 or 0")
