"""torchao's MXFP8 training recipe on ``neuron``.

``quantize_(model, MXFP8TrainingOpConfig.from_recipe(...))`` routes every converted linear
through ``torchao.prototype.moe_training.mxfp8_linear._to_mxfp8_then_scaled_mm``, which fixes
the MX cast kernels to torchao's Triton (dim 0) and CUDA (dim 1) ones, kernels that exist only
on NVIDIA GPUs. For ``neuron`` inputs the same autograd function (``mx_mm``: MXFP8 forward,
grad-input and grad-weight GEMMs) runs with torchao's device-generic PyTorch casts instead, and
its GEMMs are the device's native MX ``torch._scaled_mm`` (Trainium 3; on Trainium 2 they raise
the platform error). Other devices, and the EMULATED recipe, reach torchao unchanged.

torchao is imported lazily by users, so the function is replaced when its modules load (an
import hook) or at once when they already have.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

_MODULES = ("torchao.prototype.moe_training.mxfp8_linear", "torchao.prototype.moe_training.tensor")
_NAME = "_to_mxfp8_then_scaled_mm"


def _wrap(original):
    def _to_mxfp8_then_scaled_mm(input_hp, weight_hp, kernel_preference, scale_calculation_mode,
                                 wgrad_with_hp=False):
        from torchao.prototype.mx_formats.config import MXFP8Dim0CastKernelChoice, MXFP8Dim1CastKernelChoice
        from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

        if input_hp.device.type != "neuron" or kernel_preference == KernelPreference.EMULATED:
            return original(input_hp, weight_hp, kernel_preference, scale_calculation_mode, wgrad_with_hp)
        from torchao.prototype.moe_training.mxfp8_linear import mx_mm

        e4m3 = __import__("torch").float8_e4m3fn
        return mx_mm.apply(input_hp, weight_hp, e4m3, e4m3, e4m3, 32, kernel_preference,
                           MXFP8Dim0CastKernelChoice.TORCH, MXFP8Dim1CastKernelChoice.TORCH, scale_calculation_mode,
                           wgrad_with_hp)

    _to_mxfp8_then_scaled_mm.__wrapped__ = original
    _to_mxfp8_then_scaled_mm.__doc__ = original.__doc__
    _to_mxfp8_then_scaled_mm._torch_neuronx = True
    return _to_mxfp8_then_scaled_mm


def _patch(module) -> None:
    original = getattr(module, _NAME, None)
    if original is None or getattr(original, "_torch_neuronx", False):
        return
    # Each module holds its own reference (tensor.py imports the name from mxfp8_linear).
    linear = sys.modules.get(_MODULES[0])
    wrapped = getattr(linear, _NAME, None) if linear is not None else None
    if wrapped is None or not getattr(wrapped, "_torch_neuronx", False) or wrapped.__wrapped__ is not original:
        wrapped = _wrap(original)
    setattr(module, _NAME, wrapped)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def register() -> None:
    for name in _MODULES:
        if name in sys.modules:
            _patch(sys.modules[name])
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
