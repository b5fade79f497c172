"""``neuron`` as a device for safetensors.

safetensors checks the ``device`` of ``safe_open`` / ``load_file`` against the names it
knows (``cpu``, ``cuda``, ``mps``, ``npu``, ...) and raises ``device neuron is invalid``
for anything else, ``torch.device`` objects included. A bare index is the one spelling it
leaves to torch, which reads it as the current accelerator: ``device=0`` loads onto
``neuron:0``. Accelerate (checkpoint loading, disk offload) and Diffusers (group offloading
to disk) pass the user's device straight through, so ``safe_open`` is wrapped to hand
safetensors the index of a ``neuron`` device; every other argument reaches it unchanged.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

_PYTORCH = ("pt", "torch", "pytorch")
_UNSET = object()


def _neuron_index(device: Any) -> int | None:
    """The index of ``device`` when it names a neuron device, else None."""
    if isinstance(device, str) and device.split(":", 1)[0] == "neuron":
        try:
            device = torch.device(device)
        except RuntimeError:  # e.g. "neuron:x": safetensors reports it
            return None
    if not isinstance(device, torch.device) or device.type != "neuron":
        return None
    index = device.index if device.index is not None else torch.neuron.current_device()
    # safetensors hands the index to torch, which resolves it to the current accelerator.
    resolved = torch.device(index)
    if resolved.type != "neuron":
        raise RuntimeError(
            f"cannot open safetensors on {device}: safetensors only takes a bare index for this device, and "
            f"torch resolves that index to {resolved} (the current accelerator is not neuron). Load on "
            f"'cpu' and move the tensors with .to({str(device)!r})."
        )
    return index


def _wrap(original):
    def safe_open(filename, framework, device=_UNSET, *args, **kwargs):
        if device is _UNSET:
            return original(filename, framework, *args, **kwargs)
        if isinstance(framework, str) and framework in _PYTORCH:
            index = _neuron_index(device)
            if index is not None:
                device = index
        return original(filename, framework, device, *args, **kwargs)

    for name in ("__doc__", "__name__", "__qualname__", "__module__"):
        setattr(safe_open, name, getattr(original, name))
    safe_open.__wrapped__ = original
    safe_open._torch_neuronx = True
    return safe_open


def register() -> None:
    """Wraps ``safetensors.safe_open`` (and ``safetensors.torch``'s reference to it). Called
    while torch imports, before ``safetensors.torch`` and the libraries built on it have
    looked the name up."""
    try:
        import safetensors
    except ImportError:
        return
    original = getattr(safetensors, "safe_open", None)
    if original is None or getattr(original, "_torch_neuronx", False):
        return
    wrapped = _wrap(original)
    safetensors.safe_open = wrapped
    st_torch = sys.modules.get("safetensors.torch")
    if st_torch is not None and getattr(st_torch, "safe_open", None) is original:
        st_torch.safe_open = wrapped
