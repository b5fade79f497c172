"""Paged attention for vLLM on ``neuron``, in plain torch ops.

The KV cache of a layer is vLLM's paged cache: ``num_blocks`` blocks of ``block_size`` token
slots, each slot holding ``num_kv_heads`` heads of key and value side by side
(``[num_blocks, block_size, num_kv_heads, 2 * head_size]`` in memory, vLLM's ``LBNHC`` layout).
New keys and values are written at their slots (``slot_mapping``); attention then gathers each
request's context through its block table.

One step's batch mixes prefills (many query tokens), chunked-prefill continuations and decodes
(one query token). The metadata builder turns it, once per step, into a padded batch shared by
all layers: query token index ``[R, Q]``, context slot index ``[R, S]`` and the causal mask
``[R, Q, S]`` (``R`` requests, ``Q`` the longest query, ``S`` the longest context). Each layer
gathers its keys and values with the slot index and runs one batched softmax attention
(grouped-query heads share their key head without copies), in float32. Sliding windows,
logit soft-capping and attention sinks (GPT-OSS) are applied on the scores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.kv_cache_layout import KVCacheLayout


class NeuronAttentionBackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16"]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"  # vLLM's enum member for out-of-tree backends (registered by the platform)

    @staticmethod
    def get_impl_cls() -> type[NeuronAttentionImpl]:
        return NeuronAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[NeuronAttentionMetadataBuilder]:
        return NeuronAttentionMetadataBuilder

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        # Slots of a block are contiguous runs of [heads, 2 * head_size]: a (block, offset)
        # pair flattens to one slot index.
        return (KVCacheLayout.LBNHC,)

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER


@dataclass
class NeuronAttentionMetadata:
    num_actual_tokens: int
    query_index: torch.Tensor  # [R, Q] token index of each (request, query row), clamped
    query_valid: torch.Tensor  # [R, Q] bool: the row is a real query token
    slot_index: torch.Tensor  # [R, S] KV-cache slot of each (request, context position)
    query_pos: torch.Tensor  # [R, Q, 1] absolute position of each query row
    key_pos: torch.Tensor  # [1, 1, S] context positions
    causal_mask: torch.Tensor  # [R, Q, S] bool: key visible to query (causal, in context)
    out_rows: torch.Tensor  # [T] flat (request * Q + row) index of each real query token
    out_tokens: torch.Tensor  # [T] its token index in the step's batch
    _window_masks: dict[int, torch.Tensor] = field(default_factory=dict)

    def mask(self, sliding_window: int | None) -> torch.Tensor:
        if sliding_window is None:
            return self.causal_mask
        m = self._window_masks.get(sliding_window)
        if m is None:
            # vLLM's window counts the query itself: keys in (pos - window, pos] stay visible.
            m = self.causal_mask & (self.query_pos - self.key_pos < sliding_window)
            self._window_masks[sliding_window] = m
        return m


class NeuronAttentionMetadataBuilder(AttentionMetadataBuilder[NeuronAttentionMetadata]):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> NeuronAttentionMetadata:
        m = common_attn_metadata
        device = m.block_table_tensor.device
        num_reqs = m.num_reqs
        qsl = m.query_start_loc_cpu[: num_reqs + 1].to(torch.long)
        q_lens = qsl[1:] - qsl[:-1]
        seq_lens = m.seq_lens[:num_reqs].cpu().to(torch.long)
        q_max = max(int(q_lens.max()) if num_reqs else 0, 1)
        s_max = max(int(seq_lens.max()) if num_reqs else 0, 1)

        rows = torch.arange(q_max)
        query_valid = rows[None, :] < q_lens[:, None]
        query_index = torch.where(query_valid, qsl[:-1, None] + rows[None, :], 0)
        query_pos = seq_lens[:, None] - q_lens[:, None] + rows[None, :]
        key_pos = torch.arange(s_max)
        causal = (key_pos[None, None, :] <= query_pos[:, :, None]) & \
                 (key_pos[None, None, :] < seq_lens[:, None, None])

        blocks = m.block_table_tensor[:num_reqs].cpu().to(torch.long)
        n_blocks = (s_max + self.block_size - 1) // self.block_size
        if blocks.shape[1] < n_blocks:  # context never outgrows its table; pad for the gather
            blocks = torch.nn.functional.pad(blocks, (0, n_blocks - blocks.shape[1]))
        block_of = blocks[:, key_pos // self.block_size]
        slot_index = block_of * self.block_size + key_pos % self.block_size
        slot_index = torch.where(key_pos[None, :] < seq_lens[:, None], slot_index, 0)

        flat_valid = query_valid.reshape(-1)
        out_rows = flat_valid.nonzero().squeeze(1)
        out_tokens = query_index.reshape(-1)[out_rows]

        def dev(t):
            return t.to(device)

        return NeuronAttentionMetadata(
            num_actual_tokens=m.num_actual_tokens,
            query_index=dev(query_index),
            query_valid=dev(query_valid),
            slot_index=dev(slot_index),
            query_pos=dev(query_pos[:, :, None]),
            key_pos=dev(key_pos[None, None, :]),
            causal_mask=dev(causal),
            out_rows=dev(out_rows),
            out_tokens=dev(out_tokens),
        )


class NeuronAttentionImpl(AttentionImpl[NeuronAttentionMetadata]):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None,
                 alibi_slopes: list[float] | None = None, sliding_window: int | None = None,
                 kv_cache_dtype: str = "auto", logits_soft_cap: float | None = None,
                 attn_type: str = AttentionType.DECODER, kv_sharing_target_layer_name: str | None = None,
                 sinks: torch.Tensor | None = None) -> None:
        if alibi_slopes is not None:
            raise NotImplementedError("ALiBi attention is not supported on neuron")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"{attn_type} attention is not supported on neuron (decoder only)")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads if num_kv_heads is not None else num_heads
        self.sliding_window = sliding_window
        self.kv_cache_dtype = kv_cache_dtype
        self.logits_soft_cap = logits_soft_cap or None
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.sinks = sinks
        if sinks is not None and sinks.shape[0] != num_heads:
            raise ValueError(f"sinks has {sinks.shape[0]} heads, the layer {num_heads}")

    @staticmethod
    def _slots(kv_cache: torch.Tensor) -> torch.Tensor:
        """The per-layer cache ``[blocks, kv_heads, block_size, 2 * head]`` (an LBNHC view) as
        ``[slots, kv_heads, 2 * head]``."""
        blocks, heads, block_size, width = kv_cache.shape
        return kv_cache.transpose(1, 2).reshape(blocks * block_size, heads, width)

    def do_kv_cache_update(self, layer, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        slots = self._slots(kv_cache)
        if slots.data_ptr() != kv_cache.data_ptr() or not slots.is_contiguous():
            raise RuntimeError("neuron attention expects the KV cache in vLLM's LBNHC layout")
        n = slot_mapping.shape[0]
        slot_mapping = slot_mapping.to(torch.long)
        keep = slot_mapping >= 0  # padded tokens have slot -1
        idx = slot_mapping[keep]
        hs = self.head_size
        slots[:, :, :hs].index_copy_(0, idx, key[:n][keep].to(slots.dtype))
        slots[:, :, hs:].index_copy_(0, idx, value[:n][keep].to(slots.dtype))

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: NeuronAttentionMetadata | None,
                output: torch.Tensor, output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("fused output quantization is not supported on neuron")
        if attn_metadata is None:  # profiling run: no cache yet
            return output.zero_()
        md = attn_metadata
        hs = self.head_size
        slots = self._slots(kv_cache)
        ctx = slots[md.slot_index]  # [R, S, KVH, 2 * hs]
        r, s = md.slot_index.shape
        q_rows = md.query_index.shape[1]
        kvh, group = self.num_kv_heads, self.num_heads // self.num_kv_heads

        k = ctx[..., :hs].float().permute(0, 2, 3, 1)  # [R, KVH, hs, S]
        v = ctx[..., hs:].float().transpose(1, 2)  # [R, KVH, S, hs_v]
        q = query[md.query_index].float()  # [R, Q, H, hs]
        q = q.view(r, q_rows, kvh, group, hs).permute(0, 2, 3, 1, 4).reshape(r, kvh, group * q_rows, hs)

        scores = torch.matmul(q, k).view(r, kvh, group, q_rows, s) * self.scale
        if self.logits_soft_cap is not None:
            scores = torch.tanh(scores / self.logits_soft_cap) * self.logits_soft_cap
        mask = md.mask(self.sliding_window)[:, None, None, :, :]
        scores = scores.masked_fill(~mask, torch.finfo(torch.float32).min)
        if self.sinks is not None:
            sink = self.sinks.float().view(1, kvh, group, 1, 1).expand(r, kvh, group, q_rows, 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :s]
        else:
            probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs.view(r, kvh, group * q_rows, s), v)  # [R, KVH, G*Q, hs_v]
        out = out.view(r, kvh, group, q_rows, -1).permute(0, 3, 1, 2, 4).reshape(r * q_rows, self.num_heads, -1)
        output[md.out_tokens] = out[md.out_rows].to(output.dtype)
        return output


def compute_slot_mapping(num_tokens, max_num_tokens, query_start_loc, positions, block_table,
                         block_table_stride, slot_mapping, KV_CACHE_BLOCK_SIZE, TOTAL_CP_WORLD_SIZE=1,
                         TOTAL_CP_RANK=0, CP_KV_CACHE_INTERLEAVE_SIZE=1, PAD_ID=-1, BLOCK_SIZE=1024) -> None:
    """Torch version of vLLM's Triton slot-mapping kernel (same arguments): the KV-cache slot of
    each scheduled token from its request's block table and its position; padding gets ``PAD_ID``."""
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("context parallelism is not supported on neuron")
    n = int(num_tokens)
    bs = int(KV_CACHE_BLOCK_SIZE)
    if n:
        device = positions.device
        tok = torch.arange(n, device=device)
        req = torch.searchsorted(query_start_loc[1:].to(torch.long), tok, right=True)
        pos = positions[:n].to(torch.long)
        block = block_table.view(-1, block_table_stride)[req, pos // bs].to(torch.long)
        slot_mapping[:n] = block * bs + pos % bs
    slot_mapping[n:int(max_num_tokens)] = PAD_ID
