"""PyTorch operators over the shipped NKI kernels: custom ops (``torch.ops.neuron_nki.*``) with
autograd, usable eagerly and inside ``torch.compile`` (one graph node each).

    from torch_neuronx.kernels import rms_norm, softmax, matmul, flash_attention
"""

from __future__ import annotations

import math

import torch

from torch_neuronx._nki import nki_op
from torch_neuronx.kernels import nki_kernels as K

__all__ = ["matmul", "softmax", "rms_norm", "flash_attention", "vit_attention"]


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).contiguous()


# ---- matmul -------------------------------------------------------------------------------------
@nki_op("neuron_nki::matmul")
def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return K.matmul_kernel(a.contiguous(), b.contiguous())


def _matmul_backward(ctx, g):
    a, b = ctx.saved_tensors
    return _matmul(g, b.t()), _matmul(a.t(), g)


def _matmul_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


_matmul.register_autograd(_matmul_backward, setup_context=_matmul_setup)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for 2-D a [M, K], b [K, N] by the tiled NKI matmul (fp32 accumulation)."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: expected a [M, K] and b [K, N], got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"matmul: a is {a.dtype} and b is {b.dtype}; they must match")
    return _matmul(a, b)


# ---- softmax ------------------------------------------------------------------------------------
@nki_op("neuron_nki::softmax")
def _softmax(x: torch.Tensor) -> torch.Tensor:
    return K.softmax_kernel(_rows(x)).reshape(x.shape)


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _softmax_backward(ctx, g):
    (y,) = ctx.saved_tensors
    yf, gf = y.float(), g.float()
    return (yf * (gf - (gf * yf).sum(-1, keepdim=True))).to(g.dtype)


_softmax.register_autograd(_softmax_backward, setup_context=_softmax_setup)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax over the last dimension (fp32 inside, result in x's dtype)."""
    if dim not in (-1, x.dim() - 1):
        raise ValueError("softmax: the NKI kernel normalizes the last dimension; move it last first")
    return _softmax(x)


# ---- RMSNorm ------------------------------------------------------------------------------------
@nki_op("neuron_nki::rms_norm")
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return K.rmsnorm_kernel(_rows(x), weight.contiguous(), eps).reshape(x.shape)


def _rms_norm_setup(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _rms_norm_backward(ctx, g):
    x, w = ctx.saved_tensors
    xf, gf, wf = x.float(), g.float(), w.float()
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + ctx.eps)
    gw = gf * wf
    dx = r * gw - xf * r.pow(3) * (gw * xf).mean(-1, keepdim=True)
    dw = (gf * xf * r).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(w.dtype), None


_rms_norm.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(mean(x**2, -1) + eps) * weight`` (fp32 inside, result in x's dtype)."""
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"rms_norm: weight has shape {tuple(weight.shape)}, expected ({x.shape[-1]},)")
    return _rms_norm(x, weight, float(eps))


# ---- flash attention ----------------------------------------------------------------------------
@nki_op("neuron_nki::flash_attention_fwd")
def _flash_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
               causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return K.flash_attention_fwd_kernel(q.contiguous(), k.contiguous(), v.contiguous(), scale, causal)


@nki_op("neuron_nki::flash_attention_bwd")
def _flash_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, do: torch.Tensor,
               lse: torch.Tensor, scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return K.flash_attention_bwd_kernel(q.contiguous(), k.contiguous(), v.contiguous(), o.contiguous(),
                                        do.contiguous(), lse.contiguous(), scale, causal)


def _flash_setup(ctx, inputs, output):
    q, k, v, scale, causal = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.scale, ctx.causal = scale, causal


def _flash_backward(ctx, do, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _flash_bwd(q, k, v, o, do, lse, ctx.scale, ctx.causal)
    return dq, dk, dv, None, None


_flash_fwd.register_autograd(_flash_backward, setup_context=_flash_setup)


@torch.compiler.assume_constant_result  # a fact of the process's platform: no graph break
def head_dim_max() -> int:
    """The widest head the flash-attention kernels take: the head dimension is their matmuls'
    contraction, on the TensorE rows of the simulated chip (the platform model's pe_rows)."""
    return int(torch.neuron.get_platform()["pe_rows"])


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """Attention ``softmax(q @ k.T * scale) @ v`` on [B, H, S, D] tensors (SDPA's layout; D <=
    128, ``head_dim_max()``), by the NKI flash-attention kernels: forward and backward never
    materialize the [S, S] scores in HBM. Grouped-query k/v (fewer heads) are repeated to q's
    heads."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("flash_attention: q, k, v are [batch, heads, seq, head_dim]")
    B, H, S, D = q.shape
    if D > head_dim_max():
        raise ValueError(f"flash_attention: head_dim {D} > {head_dim_max()} (the NeuronCore's contraction limit)")
    if k.shape[1] != H:
        if H % k.shape[1]:
            raise ValueError(f"flash_attention: {H} query heads are not a multiple of {k.shape[1]} key heads")
        rep = H // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    if causal and k.shape[2] != S:
        raise ValueError("flash_attention: causal attention takes equal query and key lengths")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    Sk = k.shape[2]
    o, _ = _flash_fwd(q.reshape(B * H, S, D), k.reshape(B * H, Sk, D), v.reshape(B * H, Sk, D), scale, bool(causal))
    return o.reshape(B, H, S, D)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = matmul(x.reshape(-1, x.shape[-1]), weight.t())
    y = y.reshape(*x.shape[:-1], weight.shape[0])
    return y + bias if bias is not None else y


def vit_attention(x: torch.Tensor, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor | None,
                  proj_weight: torch.Tensor, proj_bias: torch.Tensor | None, num_heads: int) -> torch.Tensor:
    """A ViT self-attention block, ``proj(attention(qkv(x)))`` on x [B, N, C] (no mask), with the
    projections on the NKI matmul kernel and attention on the NKI flash-attention kernels; the
    weights are laid out as ``torch.nn.Linear``'s (timm's ``Attention.qkv`` / ``.proj``)."""
    B, N, C = x.shape
    if C % num_heads:
        raise ValueError(f"vit_attention: {C} channels are not divisible by {num_heads} heads")
    if qkv_weight.shape != (3 * C, C) or proj_weight.shape != (C, C):
        raise ValueError(f"vit_attention: expected qkv_weight [{3 * C}, {C}] and proj_weight [{C}, {C}], got "
                         f"{tuple(qkv_weight.shape)} and {tuple(proj_weight.shape)}")
    qkv = _linear(x, qkv_weight, qkv_bias).reshape(B, N, 3, num_heads, C // num_heads).permute(2, 0, 3, 1, 4)
    attn = flash_attention(qkv[0], qkv[1], qkv[2], causal=False)
    return _linear(attn.transpose(1, 2).reshape(B, N, C), proj_weight, proj_bias)
