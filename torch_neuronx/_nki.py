"""NKI kernels as PyTorch operators: ``nki_op`` and ``wrap_nki`` (AWS's names).

An ``@nki.jit`` kernel called with ``neuron`` tensors already runs on their device memory
(no copies) and returns ``neuron`` tensors. ``nki_op`` makes a function that calls kernels a
``torch.library`` custom op, so autograd (``register_autograd``) and ``torch.compile`` (one
graph node, no graph break) treat it like any operator. Its fake implementation is the
function itself: under FakeTensorMode a kernel call traces and verifies the kernel (cached)
and returns empty results of the kernel's output shapes without running it.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

import nki
from nki._jit import Kernel, _Launch

__all__ = ["nki_op", "wrap_nki"]


def nki_op(name: str, *, mutates_args: Iterable[str] | str = (), device_types=None, schema: str | None = None):
    """Register the decorated function as the custom op ``name`` ("namespace::op").

    The function takes and returns tensors and calls NKI kernels (directly or through
    ``wrap_nki``); ``mutates_args`` names the arguments a kernel writes, as in
    ``torch.library.custom_op``. Returns the op: call it, and use ``op.register_autograd``.
    """
    if not isinstance(name, str) or "::" not in name:
        raise ValueError(f"nki_op: the name is 'namespace::op_name', got {name!r}")
    if isinstance(mutates_args, dict):
        mutates_args = tuple(mutates_args)

    def register(fn: Callable):
        op = torch.library.custom_op(name, fn, mutates_args=mutates_args, device_types=device_types, schema=schema)
        op.register_fake(fn)
        return op

    return register


class _Wrapped:
    """``wrap_nki(kernel)[grid](*args)``: the kernel launched on a grid, from PyTorch code."""

    def __init__(self, kernel: Kernel, grid: tuple = ()):
        self._kernel, self._grid = kernel, grid

    def __getitem__(self, grid) -> "_Wrapped":
        launch = self._kernel[grid]
        return _Wrapped(self._kernel, launch.grid)

    def __call__(self, *args, **kwargs):
        return _Launch(self._kernel, self._grid)(*args, **kwargs)


def wrap_nki(kernel) -> _Wrapped:
    """A PyTorch-callable handle on an NKI kernel (a plain function is ``nki.jit``-ed first)."""
    if isinstance(kernel, _Wrapped):
        return kernel
    if not isinstance(kernel, Kernel):
        kernel = nki.jit(kernel)
    return _Wrapped(kernel)
