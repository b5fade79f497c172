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

Importing torchao (Transformers does, on every import) would also print messages that are not
about the user's code: on a torch built without CUDA, its CUDA-only extensions (``_C_mxfp8``,
``_C_cutlass_90a``) cannot load, and its config enums are registered as pytree constants, which
torch 2.13 logs as deprecated. Logging filters drop exactly those records (`_quiet_import`);
any other torchao load failure or pytree warning still shows.
"""

from __future__ import annotations

import functools
import importlib.machinery
import itertools
import logging
import os
import re
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


# torchao's extensions that link libtorch_cuda / libc10_cuda: they cannot load on a torch built
# without CUDA, and torchao works without them (they hold CUDA kernels only).
_CUDA_ONLY_EXTENSIONS = re.compile(r"_C_(mxfp8|cutlass_90a)\b[^/]*\.so")


def _torchao_dir() -> str | None:
    spec = importlib.machinery.PathFinder.find_spec("torchao")
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


class _CudaOnlyExtensionFilter(logging.Filter):
    """Drops torchao's ``Failed to load <its CUDA-only extension>`` warnings when torch has no CUDA
    (torchao/__init__.py logs the failure of each ``_C*.so`` it finds, then carries on)."""

    def __init__(self, package_dir: str):
        super().__init__()
        self._prefix = f"Failed to load {package_dir}{os.sep}"

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(self._prefix):
            return True
        name = message[len(self._prefix):].split(":", 1)[0]
        return not (os.sep not in name and _CUDA_ONLY_EXTENSIONS.fullmatch(name))


class _TorchaoEnumConstantFilter(logging.Filter):
    """Drops torch's "<enum> is an Enum subclass ... register_constant() ... deprecated" warning
    for torchao's own enums (``torchao.utils.register_as_pytree_constant`` on its config enums)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str) and record.msg.startswith("%s is an Enum subclass")):
            return True
        cls = record.args[0] if isinstance(record.args, tuple) and record.args else None
        return not (isinstance(cls, type) and getattr(cls, "__module__", "").split(".")[0] == "torchao")


def _quiet_import() -> None:
    """Installs the filters above once (a logger's filter sees the records logged on that logger)."""
    import torch

    loaders = (logging.getLogger("torchao"), logging.getLogger("torch.utils._pytree"))
    if any(isinstance(f, (_CudaOnlyExtensionFilter, _TorchaoEnumConstantFilter)) for lg in loaders for f in lg.filters):
        return
    package_dir = _torchao_dir()
    if package_dir is not None and torch.version.cuda is None:
        loaders[0].addFilter(_CudaOnlyExtensionFilter(package_dir))
    loaders[1].addFilter(_TorchaoEnumConstantFilter())


def register() -> None:
    from torch_neuronx._import_hook import on_import

    _quiet_import()
    for name, patch in _PATCHES.items():
        on_import(name, patch)
