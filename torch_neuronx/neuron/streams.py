"""Streams and events of ``torch.neuron`` (the shape of torch.cuda.streams).

Execution is synchronous: work is complete when the call that launched it returns, so
stream order and cross-stream waits hold trivially and events complete when recorded.
Timing events measure the host time between records.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_neuronx import _C
from torch_neuronx.neuron._utils import _get_device_index


class Stream(torch.Stream):
    """A neuron stream. ``priority``: 0 (default) or -1 (high), as on CUDA."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs):
        if {"stream_id", "device_index", "device_type"} <= kwargs.keys():
            return super().__new__(cls, **kwargs)
        idx = _get_device_index(device, optional=True)
        _C._check_device(idx)
        return super().__new__(cls, device=torch.device("neuron", idx), priority=priority)

    @property
    def priority(self) -> int:
        return _C._stream_priority(self.device_index, self.stream_id)

    @staticmethod
    def priority_range() -> tuple[int, int]:
        return tuple(_C._stream_priority_range())

    def __repr__(self) -> str:
        return f"<torch.neuron.Stream device=neuron:{self.device_index} stream_id={self.stream_id}>"


class _EventMeta(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, torch.Event) and obj.device.type == "neuron"


class Event(metaclass=_EventMeta):
    """A neuron event (a ``torch.Event`` on the current neuron device); ``enable_timing=True``
    allows :meth:`elapsed_time`. torch.Event's methods check the exact type of their
    argument, so this returns plain torch.Event objects."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        if interprocess:
            raise NotImplementedError("interprocess events are not supported on the neuron device")
        return torch.Event(device=torch.device("neuron", _C._current_device()),
                           enable_timing=enable_timing, blocking=blocking)


def _wrap(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def current_stream(device: Any = None) -> Stream:
    if torch.compiler.is_compiling():
        # Dynamo models streams itself (see torch.neuron.is_available).
        return torch.accelerator.current_stream() if device is None else torch.accelerator.current_stream(device)
    idx = _get_device_index(device, optional=True)
    _C._check_device(idx)
    return _wrap(torch.accelerator.current_stream(idx))


def default_stream(device: Any = None) -> Stream:
    idx = _get_device_index(device, optional=True)
    _C._check_device(idx)
    device_type = torch.accelerator.current_stream(idx).device_type
    return Stream(stream_id=0, device_index=idx, device_type=device_type)


def set_stream(stream: torch.Stream) -> None:
    if stream is None:
        return
    torch.accelerator.set_stream(stream)


class StreamContext:
    """Makes ``stream`` current on its device inside the ``with`` block."""

    def __init__(self, stream: torch.Stream | None):
        self.stream = stream
        self.prev: torch.Stream | None = None

    def __enter__(self):
        if self.stream is None:
            return self
        self.prev = torch.accelerator.current_stream(self.stream.device_index)
        torch.accelerator.set_stream(self.stream)
        return self

    def __exit__(self, *args):
        if self.stream is not None and self.prev is not None:
            torch.accelerator.set_stream(self.prev)
        return False


def stream(stream: torch.Stream | None) -> StreamContext:
    return StreamContext(stream)
