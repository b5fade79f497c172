"""NKI kernels shipped with torch-neuronx, as PyTorch operators with autograd (``ops.py``);
the kernels themselves are in ``nki_kernels.py``."""

from torch_neuronx.kernels.ops import flash_attention, matmul, rms_norm, softmax, vit_attention

__all__ = ["flash_attention", "matmul", "rms_norm", "softmax", "vit_attention"]
