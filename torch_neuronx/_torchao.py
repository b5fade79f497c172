"""torchao's MXFP8 training recipe on ``neuron``.

``quantize_(model, MXFP8TrainingOpConfig.from_recipe(...))`` routes every converted linear
through ``torchao.prototype.moe_training.mxfp8_linear._to_mxfp8_then_scaled_mm``, which fixes
the MX cast kernels to torchao's Triton (dim 0) and CUDA (dim 1) ones, kernels that exist only
on NVIDIA GPUs. For ``neuron`` inputs the same autograd function (``mx_mm``: MXFP8 forward,
grad-input and grad-weight GEMMs) runs with torchao's device-generic PyTorch casts instead, and
its GEMMs are the device's native MX ``torch._scaled_mm`` (Trainium 3; on Trainium 2 they raise
the platform error). Other devices, and the EMULATED recipe, reach torchao unchanged.

Converting a model whose parameters are on ``neuron`` to FP8 or MXFP8 training
(``convert_to_float8_training``, ``quantize_`` with torchao's training configs) raises the
platform error at once on Trainium 2, instead of at the first FP8 matmul.

torchao is imported lazily by users, so its functions are wrapped when its modules load (an
import hook) or at once when they already have.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import itertools
import sys

_MX_LINEAR = "_to_mxfp8_then_scaled_mm"
_CONVERT = "convert_to_float8_training"


def _on_neuron(module) -> bool:
    import torch

    return isinstance(module, torch.nn.Module) and any(
        t.device.type == "neuron" for t in itertools.chain(module.parameters(), module.buffers()))


def _refuse_on_trn2(what: str, module) -> None:
    if _on_neuron(module):
        from torch_neuronx import _C

        _C._check_fp8_platform(what)


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

    functools.update_wrapper(_to_mxfp8_then_scaled_mm, original)
    _to_mxfp8_then_scaled_mm._torch_neuronx = True
    return _to_mxfp8_then_scaled_mm


def _wrap_convert(original):
    @functools.wraps(original)
    def convert_to_float8_training(module, *args, **kwargs):
        _refuse_on_trn2("convert_to_float8_training", module)
        return original(module, *args, **kwargs)

    convert_to_float8_training._torch_neuronx = True
    return convert_to_float8_training


def _wrap_handler(original, name):
    @functools.wraps(original)
    def handler(module, config, *args, **kwargs):
        _refuse_on_trn2(f"quantize_ with {name}", module)
        return original(module, config, *args, **kwargs)

    handler._torch_neuronx = True
    return handler


def _replace(module, name, wrap, source=None) -> None:
    """Wraps ``module.name`` once; a module that imported the name from ``source`` (already
    wrapped) gets the same wrapper."""
    original = getattr(module, name, None)
    if original is None or getattr(original, "_torch_neuronx", False):
        return
    done = getattr(sys.modules.get(source), name, None) if source else None
    if done is None or getattr(done, "__wrapped__", None) is not original:
        done = wrap(original)
    setattr(module, name, done)


def _patch_training_configs(module) -> None:
    from torchao.quantization.transform_module import _QUANTIZE_CONFIG_HANDLER

    for cls_name in ("Float8TrainingOpConfig", "MXFP8TrainingOpConfig"):
        cls = getattr(module, cls_name, None)
        handler = _QUANTIZE_CONFIG_HANDLER.get(cls)
        if handler is not None and not getattr(handler, "_torch_neuronx", False):
            _QUANTIZE_CONFIG_HANDLER[cls] = _wrap_handler(handler, cls_name)


_PATCHES = {
    "torchao.prototype.moe_training.mxfp8_linear": lambda m: _replace(m, _MX_LINEAR, _wrap),
    "torchao.prototype.moe_training.tensor": lambda m: _replace(
        m, _MX_LINEAR, _wrap, "torchao.prototype.moe_training.mxfp8_linear"),
    "torchao.prototype.moe_training.config": _patch_training_configs,
    "torchao.float8.float8_linear_utils": lambda m: _replace(m, _CONVERT, _wrap_convert),
    "torchao.float8": lambda m: _replace(m, _CONVERT, _wrap_convert, "torchao.float8.float8_linear_utils"),
}


def _patch(module) -> None:
    _PATCHES[module.__name__](module)


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
        if fullname not in _PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def register() -> None:
    for name in _PATCHES:
        if name in sys.modules:
            _patch(sys.modules[name])
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
