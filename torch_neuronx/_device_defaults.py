"""Per-device choices PyTorch keys by device type, made for ``neuron``.

Some PyTorch functions pick an algorithm from a table indexed by ``device.type`` and
fall back to a guess for devices they do not know. Where the guess is wrong for a
NeuronCore, the right entry is registered here, once, at device registration.
"""

from __future__ import annotations

import torch


def register() -> None:
    _linear_cross_entropy_accumulation()


def _linear_cross_entropy_accumulation() -> None:
    # F.linear_cross_entropy's chunked path accumulates fp16/bf16 in the input dtype on
    # unknown devices ("compact"), assuming native low-precision GEMMs. NeuronCore
    # matmuls accumulate in fp32 (PSUM), and the simulator's low-precision GEMMs are
    # CPU ones: the CPU's choice (fp32 accumulation, "accurate") is right for both.
    try:
        from torch.nn.modules import linear_cross_entropy_options as lce
    except ImportError:  # a torch without linear_cross_entropy
        return
    defaults = getattr(lce, "_AUTO_DEFAULTS", None)
    options = getattr(lce, "LinearCrossEntropyOptions", None)
    if defaults is None or options is None or not hasattr(options, "_resolve_auto_acc_dtype"):
        return
    for dtype in (torch.float16, torch.bfloat16):
        if ("cpu", dtype) in defaults:
            defaults.setdefault(("neuron", dtype), defaults[("cpu", dtype)])
    resolve = options._resolve_auto_acc_dtype

    def _resolve_auto_acc_dtype(dtype, device):
        if device is not None and device.type == "neuron" and dtype in (torch.float16, torch.bfloat16):
            return torch.float32
        return resolve(dtype, device)

    options._resolve_auto_acc_dtype = staticmethod(_resolve_auto_acc_dtype)
