"""Dynamo's view of the ``neuron`` device (``torch._dynamo.device_interface``).

Dynamo and Inductor reach a device's streams, events, properties and memory through this
interface: it lets Dynamo trace code that calls ``torch.neuron.*`` and lets Inductor size
its kernels for the device.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch._dynamo.device_interface import DeviceInterface


@dataclasses.dataclass
class _InductorDeviceProperties:
    # Inductor's reduction-splitting heuristics read `multi_processor_count`. Generated
    # kernels run on host threads (device memory is host memory), so that is the thread count.
    name: str
    total_memory: int
    multi_processor_count: int
    platform: str


class NeuronInterface(DeviceInterface):
    device = torch.neuron.device
    Event = torch.neuron.Event
    Stream = torch.neuron.Stream

    class Worker:
        # Used from compile worker processes, which must not initialize the device.
        @staticmethod
        def set_device(device: int) -> None:
            torch.neuron.set_device(device)

        @staticmethod
        def current_device() -> int:
            return torch.neuron.current_device()

        @staticmethod
        def get_device_properties(device: torch.types.Device = None) -> _InductorDeviceProperties:
            props = torch.neuron.get_device_properties(device)
            return _InductorDeviceProperties(
                name=props.name,
                total_memory=props.total_memory,
                multi_processor_count=torch.get_num_threads(),
                platform=props.platform,
            )

    current_device = staticmethod(torch.neuron.current_device)
    set_device = staticmethod(torch.neuron.set_device)
    device_count = staticmethod(torch.neuron.device_count)
    is_available = staticmethod(torch.neuron.is_available)
    stream = staticmethod(torch.neuron.stream)
    current_stream = staticmethod(torch.neuron.current_stream)
    set_stream = staticmethod(torch.neuron.set_stream)
    synchronize = staticmethod(torch.neuron.synchronize)
    memory_allocated = staticmethod(torch.neuron.memory_allocated)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        prev = torch.neuron.current_device()
        if device != prev:
            torch.neuron.set_device(device)
        return prev

    exchange_device = maybe_exchange_device

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        torch.neuron.set_stream(
            torch.neuron.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)
        )

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return torch.neuron.current_stream(device_idx).stream_id

    @staticmethod
    def get_compute_capability(device: torch.types.Device = None) -> Any:
        major, minor = torch.neuron.get_device_capability(device)
        return major * 10 + minor

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return torch.neuron.is_available()

    @staticmethod
    def is_triton_capable(device: torch.types.Device = None) -> bool:
        # Kernels for neuron are C++ (the CPU code generator): there is no Triton target.
        return False

    @staticmethod
    def raise_if_triton_unavailable(device: torch.types.Device = None) -> None:
        raise RuntimeError("Triton is not a code generator for the neuron device; Inductor emits C++ kernels for it")


# torch.neuron queries Dynamo folds to constants while tracing, as it does torch.cuda's;
# the value of the guarded ones is re-checked before compiled code runs.
_CONSTANT = ("is_available", "device_count", "get_device_capability", "is_bf16_supported")
_CONSTANT_GUARDED = ("current_device",)


def _register_constant_queries() -> None:
    import importlib

    trace_rules = importlib.import_module("torch._dynamo.trace_rules")
    vt = importlib.import_module("torch._dynamo.variables.torch")
    for name in _CONSTANT + _CONSTANT_GUARDED:
        trace_rules.manual_torch_name_rule_map[f"torch.neuron.{name}"] = vt.TorchInGraphFunctionVariable
        fn = getattr(torch.neuron, name)
        vt.constant_fold_functions[fn] = None
        if name in _CONSTANT_GUARDED:
            vt.constant_fold_functions_need_guards[fn] = None
    # RNG state is host-side state, not graph operations: like torch.cuda's (in torch's own
    # files), these functions are never traced: called in compiled code they run eagerly at a
    # graph break, and called from eager code between graphs Dynamo leaves their frames alone
    # (it would fake set_rng_state's real tensor, which fails under no_dispatch, e.g. in
    # torch.testing's freeze_rng_state).
    trace_rules.add("torch_neuronx.neuron.random")
    trace_rules.get_torch_obj_rule_map.cache_clear()


def register() -> None:
    from torch._dynamo.device_interface import register_interface_for_device

    register_interface_for_device("neuron", NeuronInterface)
    for i in range(torch.neuron.device_count()):
        register_interface_for_device(f"neuron:{i}", NeuronInterface)
