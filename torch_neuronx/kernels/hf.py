"""The NKI flash-attention kernels as a Hugging Face Transformers attention implementation.

    from torch_neuronx.kernels.hf import register_attention
    register_attention()                      # once; adds attn_implementation="nki_flash"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="nki_flash").to("neuron")

Causal (and unmasked) attention runs on the NKI kernels, forward and backward. Whatever they do
not cover falls back to Transformers' SDPA path with the same arguments: a padding mask, dropout
while training, a query shorter than the keys with causal masking (a prefill after cached tokens),
head dims over 128 (``ops.head_dim_max()``).
"""

from __future__ import annotations

import torch

from torch_neuronx.kernels.ops import flash_attention, head_dim_max

NAME = "nki_flash"


def nki_flash_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                                value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                                scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q_len, kv_len, head_dim = query.shape[2], key.shape[2], query.shape[3]
    causal = (is_causal if is_causal is not None else getattr(module, "is_causal", True)) and q_len > 1
    usable = (attention_mask is None and (dropout == 0.0 or not module.training) and head_dim <= head_dim_max()
              and (not causal or q_len == kv_len) and kwargs.get("softcap") is None
              and query.shape[1] % key.shape[1] == 0)
    if not usable:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = flash_attention(query, key, value, causal=causal, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def register_attention() -> str:
    """Registers ``attn_implementation="nki_flash"`` (attention and its mask: SDPA's, which is
    ``None`` when the mask is only causal, so those calls reach the kernels). Returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, nki_flash_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
