"""Device-argument parsing shared by torch.neuron (the shape of torch.cuda._utils)."""

from __future__ import annotations

from typing import Any

import torch

from torch_neuronx import _C


def _get_device_index(device: Any, optional: bool = False, allow_cpu: bool = False) -> int:
    """Index of ``device`` (int, str, torch.device or None).

    ``None`` or a device without an index means the current device when ``optional``;
    a CPU device gives -1 when ``allow_cpu``. Anything else raises ValueError.
    """
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type == "cpu" and allow_cpu:
            return -1
        if device.type != "neuron":
            raise ValueError(f"Expected a neuron device, but got: {device}")
        if device.index is None:
            if not optional:
                raise ValueError(f"Expected a neuron device with a specified index or an integer, but got: {device}")
            return _C._current_device()
        return device.index
    if device is None:
        if not optional:
            raise ValueError("Expected a neuron device or an integer, but got: None")
        return _C._current_device()
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    raise ValueError(f"Expected a neuron device, a device string or an integer, but got: {device!r}")
