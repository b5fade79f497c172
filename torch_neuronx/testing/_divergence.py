"""Which aten op first computes something different on ``neuron`` than on CPU.

When a model's outputs differ from CPU, the difference starts somewhere. ``find_divergence``
runs the model once more on the device and replays every aten op on exact CPU copies
(:class:`CPUCopy`) of the inputs that op actually received, comparing its results and the
arguments it wrote to. The first op whose results differ is the culprit; if none does, the
difference comes from Python code that depends on the device, not from the device's ops.
Every op's inputs are copied, so this is slow: it is for locating a known mismatch.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torch_neuronx.testing._compare import CPUCopy, UnsupportedLayout, compare, op_tolerance, tensors

# Ops whose results are unspecified memory: nothing to compare.
_UNINITIALIZED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"}


@dataclass
class Divergence:
    """The first aten op whose result on ``neuron`` differs from CPU's on the same inputs."""

    op: str  # e.g. "aten::sigmoid"
    index: int  # ops replayed before it
    message: str  # the largest difference (Diff.summary())
    inputs: str  # dtypes, shapes and strides of the tensor arguments
    where: str  # the innermost frame outside torch ("modeling_llama.py:120 in forward"), or the autograd node

    def __str__(self) -> str:
        return f"{self.op} (op #{self.index + 1}, inputs {self.inputs}) at {self.where}: {self.message}"


def find_divergence(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Divergence | None, int]:
    """Runs ``fn(*args, **kwargs)`` (on neuron tensors) with every aten op replayed on CPU.

    Returns ``(first divergence or None, number of ops compared)``. Random ops (their
    streams are the device generator's) and ops returning uninitialized memory are run
    but not compared.
    """
    mode = _Replay()
    try:
        with mode:
            fn(*args, **kwargs)
    finally:
        _settle_autograd_threads()
    return mode.first, mode.compared


def _settle_autograd_threads() -> None:
    # Backward ops on a device run on the autograd engine's thread for that device. That
    # thread drops its reference to a finished backward task (whose saved thread-local
    # state holds the replay mode, a Python object) only after the caller has returned; if
    # the interpreter is shutting down by then, the release aborts the process. A tiny
    # backward on each device's thread, outside the mode, and a short pause give those
    # threads the time to let go while Python is fully alive (measured: no abort in 60
    # runs that exit right after, against about 1 in 8 without).
    for i in range(torch.neuron.device_count()):
        torch.zeros((), device=torch.device("neuron", i), requires_grad=True).sum().backward()
    time.sleep(0.05)


def _describe(values: list) -> str:
    parts = [f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}" + ("" if t.is_contiguous() else f"@{t.stride()}")
             for t in values if isinstance(t, torch.Tensor)]
    return ", ".join(parts) or "no tensors"


def _user_frame() -> str:
    """The innermost stack frame that is not torch's or this module's: the model's code;
    in the backward pass, the autograd node being run (it names the forward op)."""
    node = torch._C._current_autograd_node()
    if node is not None:
        return f"the backward pass, in {node.name()}"
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename).as_posix()
        if "/torch/" in path or "/torch_neuronx/testing/" in path or path.startswith("<"):
            continue
        return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
    return "unknown"


def _written(func, args: tuple, kwargs: dict) -> list:
    """The arguments an op writes to (in-place ``self``, ``out=``), from its schema."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            value = args[i] if i < len(args) else kwargs.get(a.name)
            if value is not None:
                out.append(value)
    return out


class _Replay(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.first: Divergence | None = None
        self.compared = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        skip = (
            self.first is not None
            or func.__name__.split(".")[0] in _UNINITIALIZED
            or torch.Tag.nondeterministic_seeded in func.tags
            or not any(t.device.type == "neuron" for t in tensors((args, kwargs)))
        )
        if skip:
            return func(*args, **kwargs)
        copy = CPUCopy()  # before the op runs: in-place ops change their inputs
        try:
            c_args, c_kwargs = copy(args), copy(kwargs)
        except UnsupportedLayout:
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        try:
            ref = func(*c_args, **c_kwargs)
        except Exception:  # noqa: BLE001 - CPU cannot run this call: nothing to compare
            return out
        d = compare([out, _written(func, args, kwargs)], [ref, _written(func, c_args, c_kwargs)],
                    tolerance=op_tolerance, device_type=None)
        if not d.ok:
            name = func._schema.name + (f".{func._schema.overload_name}" if func._schema.overload_name else "")
            self.first = Divergence(name, self.compared, d.summary(), _describe(list(args)), _user_frame())
        self.compared += 1
        return out
