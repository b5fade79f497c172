"""Inductor code generation for ``neuron``.

Device memory is host memory, so Inductor's C++/OpenMP code generator (``CppScheduling``)
applies unchanged: its kernels read and write neuron tensors in place, the Python wrapper
allocates their buffers with ``empty_strided(..., device=torch.device("neuron", i))`` (our
allocator, so memory stats stay exact), and ops Inductor does not fuse run as neuron ATen ops.

Inductor special-cases the CPU by comparing ``device.type == "cpu"`` in a few heuristics that
decide how C++ code is generated. Where a heuristic exists because the code generator is
C++, ``neuron`` must take the CPU branch; `_patch_host_device_checks` does that for the ones
that matter, each narrowly and only for the torch versions checked.
"""

from __future__ import annotations

import functools
import inspect
import sys

from torch._inductor.codegen.common import (
    DeviceOpOverrides,
    register_backend_for_device,
    register_device_op_overrides,
)

DEVICE = "neuron"


class NeuronDeviceOpOverrides(DeviceOpOverrides):
    """Python snippets the wrapper code emits for device bookkeeping."""

    def import_get_raw_stream_as(self, name: str) -> str:
        return f"def {name}(idx):\n    return torch.neuron.current_stream(idx).stream_id\n"

    def set_device(self, device_idx: int) -> str:
        return f"torch.neuron.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.neuron.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.neuron.device({device_idx})"

    def cpp_kernel_type(self) -> str:
        return "void*"


def _wrapper_classes():
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen

    class _NeuronKernelCalls:
        # C++ kernels on neuron are called as on the CPU: no stream argument, since they run
        # synchronously on the calling thread, which is what the current stream means here.
        # There is no device guard around them either (Inductor guards GPUs only), so buffers
        # name their device index explicitly: a graph for neuron:1 allocates on neuron:1
        # whatever the current device.
        def make_allocation(self, name, device, dtype, shape, stride, allocation_shape=None, is_pinned=False):
            line = super().make_allocation(name, device, dtype, shape, stride, allocation_shape, is_pinned)
            if device.type == DEVICE:
                idx = 0 if device.index is None else device.index
                line = line.replace(f"device='{DEVICE}'", f"device=torch.device('{DEVICE}', {idx})", 1)
            return line

        def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
            from torch._inductor.virtualized import V

            device = device or V.graph.get_current_device_or_throw()
            if not triton and device.type == DEVICE:
                self.writeline(self.wrap_kernel_call(kernel_name, call_args))
                return
            super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)

    class NeuronSubgraphWrapperCodegen(_NeuronKernelCalls, SubgraphPythonWrapperCodegen):
        pass

    class NeuronPythonWrapperCodegen(_NeuronKernelCalls, PythonWrapperCodegen):
        @staticmethod
        def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
            if is_subgraph:
                return NeuronSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
            return NeuronPythonWrapperCodegen()

    return NeuronPythonWrapperCodegen


def _is_host_codegen(device_type: str | None) -> bool:
    return device_type in ("cpu", DEVICE)


def _patch_host_device_checks() -> None:
    # Checked against torch 2.13: each patched function compares device.type with "cpu" to
    # pick the C++ code generator's path; neuron generates the same C++ code.
    import torch._inductor.choices as choices
    import torch._inductor.scheduler as scheduler
    import torch._inductor.utils as utils

    orig_backend = utils.get_current_backend
    if getattr(orig_backend, "_neuron_patched", False):
        return

    @functools.wraps(orig_backend)
    def get_current_backend(device_type: str | None = None) -> str:
        if device_type is None:
            from torch._inductor.virtualized import V

            device_type = V.graph.get_current_device_or_throw().type
        if device_type == DEVICE:
            return "cpp"
        return orig_backend(device_type)

    get_current_backend._neuron_patched = True
    # Modules import it by name; replace every binding of the original.
    import sys

    for mod in list(sys.modules.values()):
        name = getattr(mod, "__name__", "")
        if name.startswith("torch._inductor") and getattr(mod, "get_current_backend", None) is orig_backend:
            mod.get_current_backend = get_current_backend

    def is_cpu(self) -> bool:
        # Loop reordering/inversion is not validated for the C++ code generator.
        device = self.get_device()
        return device is not None and _is_host_codegen(device.type)

    scheduler.BaseSchedulerNode.is_cpu = is_cpu
    _patch_cache_key()

    orig_heuristics = choices.InductorChoices.get_config_heuristics

    def get_config_heuristics(self, device_type: str | None = "cuda"):
        return orig_heuristics(self, "cpu" if device_type == DEVICE else device_type)

    choices.InductorChoices.get_config_heuristics = get_config_heuristics
    _patch_cat_lowering()


def _patch_cache_key() -> None:
    # C++ kernels specialize on the thread count they are generated for (the FlexAttention
    # template sizes per-thread buffers by it), so the FX graph cache puts that count in the key
    # of graphs that may generate C++ code, which it decides by looking for CPU tensors in the
    # inputs and the graph. A neuron graph generates the same C++ code: without the count in its
    # key, a kernel compiled with one thread and loaded from the cache by a process with two
    # overruns its buffers (heap corruption). So neuron tensors count as host tensors there.
    import torch
    from torch._inductor.codecache import FxGraphHashDetails

    orig = FxGraphHashDetails.__dict__["_contains_cpu_tensor"].__func__
    if getattr(orig, "_neuron_patched", False):
        return

    def contains_host_tensor(cls, value) -> bool:
        if isinstance(value, torch.Tensor):
            return _is_host_codegen(value.device.type)
        return orig(cls, value)  # containers: recurses through cls, so through this function

    contains_host_tensor._neuron_patched = True
    FxGraphHashDetails._contains_cpu_tensor = classmethod(contains_host_tensor)


def _patch_cat_lowering() -> None:
    # Inductor lowers cat on the CPU to a ConcatKernel (each input copied into its slice), never
    # to the masked pointwise cat it uses on GPUs: the C++ vectorizer does not handle every masked
    # load of that form (mixed int64/float masks fail to compile), and it is slower on the CPU.
    # The same choice for neuron, after the original's input handling (dtype promotion, empties).
    import torch
    import torch._inductor.config as config
    import torch._inductor.ir as ir
    import torch._inductor.lowering as lowering
    from torch._inductor.virtualized import V

    aten = torch.ops.aten
    orig = lowering.lowerings[aten.cat.default]
    if getattr(orig, "_neuron_patched", False):
        return

    def cat(inputs, dim=0):
        device = inputs[0].get_device() if inputs else None
        if device is None or device.type != DEVICE or config.force_pointwise_cat:
            return orig(inputs, dim)
        kept = [t for t in inputs if not (len(t.get_size()) == 1
                                          and V.graph.sizevars.statically_known_equals(t.get_size()[0], 0))]
        if len(kept) <= 1:  # ATen's cat skips 1-D empty tensors
            return orig(inputs, dim)
        if all(t.get_dtype() in (torch.int8, torch.uint8) for t in kept):  # not vectorized: eager, as on the CPU
            for t in inputs:
                t.realize()
            return lowering.fallback_handler(aten.cat.default)(inputs, dim)
        dim = lowering._validate_dim(kept[0], dim, 0)
        dtype = lowering.get_promoted_dtype(*kept, type_promotion_kind=lowering.ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
        return lowering.TensorBox(ir.ConcatKernel.create([lowering.to_dtype(t, dtype) for t in kept], dim))

    cat._neuron_patched = True
    for key, fn in list(lowering.lowerings.items()):
        if fn is orig:
            lowering.lowerings[key] = cat


def register() -> None:
    """Register the code generators for ``neuron`` (called once ``torch._inductor`` loads)."""
    from torch._inductor.codegen.common import get_scheduling_for_device
    from torch._inductor.codegen.cpp import CppScheduling
    from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen

    from torch_neuronx.compile import _passes

    python_wrapper = _wrapper_classes()
    if get_scheduling_for_device(DEVICE) is None:
        register_backend_for_device(
            DEVICE,
            CppScheduling,
            python_wrapper,
            # No C++ wrapper: its extern calls go through per-device C shims neuron lacks;
            # the neuron backend rejects cpp_wrapper=True with a clear error.
            None,
            WrapperFxCodegen,
            # This module's source enters the pass stage's cache key: generated code is reused
            # only by the code generator that made it.
            device_custom_pass=_passes.NeuronPostGradPasses(inspect.getsource(sys.modules[__name__])),
        )
    register_device_op_overrides(DEVICE, NeuronDeviceOpOverrides())
    _patch_host_device_checks()
