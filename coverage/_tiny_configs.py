"""Tiny Hugging Face configs: any architecture's default config shrunk to a model of
a few hundred thousand parameters, so forward, backward and generate run in seconds.

``tiny_config(model_type)`` starts from ``AutoConfig.for_model(model_type)`` and shrinks
it generically by field name (hidden sizes, layers, heads, FFN sizes, vocabulary,
positions, experts), keeps per-layer lists and layer-index lists consistent with the
new layer count, recurses into nested sub-configs and sets every dropout to 0. Only
the fields it changes are passed back to the config class, so fields the class derives
in ``__post_init__`` are derived again from the small values. The architectures the
generic rules cannot express get an entry in ``OVERRIDES``, each with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

HIDDEN = 64
HEADS = 4
HEAD_DIM = 16  # HIDDEN // HEADS
INTERMEDIATE = 128
MOE_INTERMEDIATE = 32
VOCAB = 256
LAYERS = 2
MAX_LAYERS = 4  # more than LAYERS only to keep one layer of each kind of a hybrid model
POSITIONS = 128
WINDOW = 8  # shorter than the test sequences, so sliding-window and chunked masks matter
EXPERTS = 4
EXPERTS_PER_TOKEN = 2

# Field names by role; a field is only changed when the default config has it.
_LAYER_COUNTS = {
    "num_hidden_layers", "num_layers", "n_layer", "n_layers", "decoder_layers", "encoder_layers",
    "num_decoder_layers", "num_encoder_layers", "depth", "conf_num_hidden_layers", "num_global_layers",
    "num_blocks",
}
_HIDDEN = {
    "hidden_size", "d_model", "n_embd", "emb_dim", "embedding_dim", "word_embed_proj_dim", "embedding_size",
    "input_embedding_size", "lru_width", "hidden_size_global",
}
_HEADS = {
    "num_attention_heads", "n_head", "n_heads", "num_heads", "attention_heads", "decoder_attention_heads",
    "encoder_attention_heads", "conf_num_attention_heads", "num_decoder_attention_heads",
    "num_encoder_attention_heads", "swa_num_attention_heads", "linear_num_heads", "index_n_heads",
    "linear_num_value_heads",
}
_KV_HEADS = {"num_key_value_heads", "num_kv_heads", "swa_num_key_value_heads", "kv_n_heads", "num_query_groups",
             "linear_num_key_heads"}
_HEAD_DIMS = {
    "head_dim", "swa_head_dim", "index_head_dim", "d_head", "d_kv", "kv_channels", "attention_head_size",
    "dim_head", "attention_head_dim", "linear_head_dim", "linear_key_head_dim", "linear_value_head_dim",
    "mamba_head_dim", "mamba_d_head", "mamba_headdim",
}
_INTERMEDIATE = {
    "intermediate_size", "d_ff", "ffn_dim", "ffn_hidden_size", "decoder_ffn_dim", "encoder_ffn_dim", "d_inner",
    "dff", "dim_ff", "mlp_dim", "intermediate_size_mlp", "dense_intermediate_size", "expert_ffn_hidden_size",
    "feed_forward_size", "n_inner",
}
_MOE_INTERMEDIATE = {
    "moe_intermediate_size", "shared_expert_intermediate_size", "moe_shared_expert_intermediate_size",
    "shared_experts_intermediate_size", "shared_intermediate_size",
}
_EXPERTS = {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"}
_EXPERTS_PER_TOKEN = {"num_experts_per_tok", "num_experts_per_token", "moe_k", "moe_topk", "moe_top_k", "top_k_experts"}
_VOCABS = {
    "vocab_size", "decoder_vocab_size", "audio_vocab_size", "vocab_size_per_layer_input", "unpadded_vocab_size",
    "shape_vocab_size", "pronunciation_vocab_size", "encoder_hash_byte_group_vocab",
}
_POSITIONS = {
    "max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "max_target_positions", "context_length",
    "model_max_length", "num_position_embeddings", "max_source_positions",
}
_WINDOWS = {
    "sliding_window", "sliding_window_size", "attention_window_size", "local_attention_window_len",
    "attention_chunk_size", "local_attention",
}
_CAPS = {  # field -> largest value kept
    "q_lora_rank": 32, "kv_lora_rank": 32, "o_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
    "v_head_dim": 16, "qk_head_dim": 24, "index_topk": 8, "time_step_rank": 8, "mamba_dt_rank": 8,
    "laurel_rank": 8, "hc_lowrank": 8, "adapter_rank": 8, "gated_norm_rank": 8, "loop_gate_rank": 8,
    "rotary_dim": HEAD_DIM // 2, "mamba_d_state": 16, "state_size": 16, "ssm_state_size": 16, "d_state": 16,
    "mamba_n_heads": HEADS, "mamba_num_heads": HEADS, "n_mamba_heads": HEADS, "mamba_d_ssm": 2 * HIDDEN,
    "zero_expert_num": 2, "n_groups": 2, "mamba_n_groups": 2, "mamba_ngroups": 2, "n_group": 2,
    "num_expert_group": 2, "topk_group": 1,
    "mamba_chunk_size": WINDOW, "chunk_size": WINDOW,
    # "the first k layers are dense" and the like: at most one, so two layers keep one of each kind
    "first_k_dense_replace": 1, "max_window_layers": 1, "num_dense_layers": 1,
}
_ZERO = {"router_jitter_noise", "input_jitter_noise", "mask_time_prob", "mask_feature_prob", "layerdrop",
         "encoder_layerdrop", "decoder_layerdrop", "moe_jitter_eps"}
# Lists of layer indices (rather than one value per layer).
_LAYER_INDEX_LISTS = {
    "cross_attention_layers", "moe_layers", "mlp_only_layers", "full_attn_idxs", "hybrid_layer_ids",
    "ple_layer_ids", "attn_layer_indices", "global_attn_layers",
}


@dataclass
class Override:
    """What one architecture needs on top of the generic shrink. ``changes`` are applied to the
    shrunk keyword arguments (dotted keys reach nested configs: ``"text_config.x"``); ``base``
    to the default config itself, when the default cannot even be constructed; ``build_from``
    names the sub-config the causal-LM class takes; ``batch(config, batch, generator)`` returns
    the model's inputs when they are not plain token ids."""

    reason: str
    changes: dict[str, Any] = field(default_factory=dict)
    base: dict[str, Any] = field(default_factory=dict)
    build_from: str | None = None
    batch: Callable[[Any, dict, Any], dict] | None = None


def _types(pattern: list[str], n: int) -> list[str]:
    return [pattern[i % len(pattern)] for i in range(n)]


def _image_batch(config, batch: dict, generator) -> dict:
    """Adds pixel values for the (tiny) vision tower: GIT's loss skips the image positions."""
    import torch

    vision = config.vision_config
    size = vision.image_size
    return {**batch, "pixel_values": torch.randn(batch["input_ids"].shape[0], vision.num_channels, size, size,
                                                 generator=generator)}


def _codebook_batch(config, batch: dict, generator) -> dict:
    """MusicGen decoders take one token row per codebook: ids (batch * codebooks, seq) and labels
    (batch, seq, codebooks)."""
    import torch

    ids = batch["input_ids"]
    b, s = ids.shape
    k = config.num_codebooks
    codes = torch.randint(0, config.vocab_size, (b, k, s), generator=generator)
    out = {"input_ids": codes.reshape(b * k, s), "labels": codes.transpose(1, 2).contiguous()}
    if "attention_mask" in batch:
        out["attention_mask"] = batch["attention_mask"]
    return out


def _drafter_batch(config, batch: dict, generator) -> dict:
    """Gemma 4 assistants (speculative-decoding drafters) read the target model's state, not token
    ids: ``inputs_embeds`` is [token embedding, last hidden state] of the target (2 x its width) and
    ``shared_kv_states`` holds the target's keys and values per layer type, (batch, kv heads, kv
    length, head dim), over the positions the 2D ``attention_mask`` covers. ``input_ids`` stays for
    the labels and is ignored by the model."""
    import torch

    text = config.get_text_config()
    b, q = batch["input_ids"].shape
    kv = batch["attention_mask"].shape[1] if "attention_mask" in batch else q
    states = {}
    for layer_type in dict.fromkeys(text.layer_types):
        layer = text.per_layer_config[text.layer_types.index(layer_type)]
        shape = (b, layer.num_key_value_heads, kv, layer.head_dim)
        states[layer_type] = (torch.randn(shape, generator=generator), torch.randn(shape, generator=generator))
    return {**batch, "inputs_embeds": torch.randn(b, q, 2 * config.backbone_hidden_size, generator=generator),
            "shared_kv_states": states,
            # the drafter sits at the target's last seen position for every draft token
            "position_ids": torch.full((b, q), kv - 1, dtype=torch.long),
            # the text model's shortcut for more than one query token indexes per-layer inputs, which a
            # drafter does not have (TypeError on None); asking for hidden states turns the shortcut off
            "output_hidden_states": True}


_CODEBOOK_SPECIALS = {"decoder.pad_token_id": VOCAB, "decoder.bos_token_id": VOCAB,
                      "decoder.decoder_start_token_id": VOCAB}

OVERRIDES: dict[str, Override] = {
    "deepseek_v2": Override("default config leaves num_experts_per_tok unset (None)", {"num_experts_per_tok": 2}),
    "dots1": Override("default config leaves the expert counts unset (None)",
                      {"n_routed_experts": EXPERTS, "num_experts_per_tok": 2, "n_shared_experts": 1}),
    "cohere_compass_text": Override(
        "default rope_parameters is empty but the model reads one entry per layer type",
        {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}}),
    "dbrx": Override("the attention reads attn_config.rope_theta, which the default lacks, and clamps with "
                     "clip_qkv, which torch rejects when None (checkpoints use 8)",
                     {"attn_config.rope_theta": 10000.0, "attn_config.clip_qkv": 8.0}),
    "lfm2_moe": Override("default layer_types is None; one conv and one attention layer",
                         {"layer_types": ["conv", "full_attention"]}),
    "nemotron": Override("default config leaves num_key_value_heads unset (None)", {"num_key_value_heads": 2}),
    "xmod": Override("the model needs a default language adapter to run without lang_ids",
                     {"default_language": "en_XX"}),
    "jamba": Override("attention/expert layers are placed by period and offset; period 2, offset 1 keeps one "
                      "attention and one MoE layer",
                      {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2,
                       "expert_layer_offset": 1}),
    "bamba": Override("default has no attention layer (attn_layer_indices None)", {"attn_layer_indices": [1]}),
    "granitemoehybrid": Override("default layer_types has no attention layer",
                                 {"layer_types": ["linear_attention", "attention"]}),
    "recurrent_gemma": Override("block pattern (recurrent, recurrent, attention) repeats every 3 layers",
                                {"num_hidden_layers": 3}),
    "zamba": Override("hybrid layers share one transformer block, so at least two hybrid layers are needed",
                      {"num_hidden_layers": 4, "attn_layer_period": 2, "attn_layer_offset": 1,
                       "layers_block_type": _types(["linear_attention", "hybrid"], 4)}),
    "zamba2": Override("hybrid layers share one transformer block, so at least two hybrid layers are needed",
                       {"num_hidden_layers": 4, "layers_block_type": _types(["linear_attention", "hybrid"], 4),
                        "hybrid_layer_ids": [1, 3]}),
    "dory": Override("input + recurrent + output layer counts must add up to num_hidden_layers",
                     {"num_hidden_layers": 3, "n_input_layers": 1, "n_recurrent_layers": 1, "n_output_layers": 1,
                      "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}),
    "qwen4_exp": Override("default config leaves the sparse-attention indexer sizes unset (None)",
                          {"text_config.indexer_n_heads": 2, "text_config.indexer_kv_heads": 1,
                           "text_config.indexer_head_dim": HEAD_DIM, "text_config.indexer_budget": WINDOW,
                           "text_config.indexer_compress_ratio": 4}),
    "qwen4_exp_text": Override("default config leaves the sparse-attention indexer sizes unset (None)",
                               {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": HEAD_DIM,
                                "indexer_budget": WINDOW, "indexer_compress_ratio": 4}),
    "reformer": Override("axial position embeddings must factor the sequence and sum to hidden_size, chunk "
                         "lengths divide it; training re-seeds from torch.seed(), a fixed hash_seed makes LSH "
                         "reproducible",
                         {"axial_pos_shape": [4, 4], "axial_pos_embds_dim": [16, HIDDEN - 16],
                          "local_attn_chunk_length": 4, "lsh_attn_chunk_length": 4, "num_buckets": 2,
                          "hash_seed": 0}),
    "xlstm": Override("the query/key width hidden_size * qk_dim_factor is rounded up to a multiple of 64; "
                      "hidden 128 keeps it exact", {"hidden_size": 128, "embedding_dim": 128}),
    "git": Override("the loss skips the image positions, so the model needs pixel values; a 32x32 image",
                    {"vision_config.image_size": 32, "vision_config.patch_size": 16}, batch=_image_batch),
    "musicgen": Override("the causal LM is the audio-code decoder (config.decoder), one token row per codebook; "
                         "pad/bos/start is the extra embedding row vocab_size", _CODEBOOK_SPECIALS,
                         build_from="decoder", batch=_codebook_batch),
    "musicgen_melody": Override("the causal LM is the audio-code decoder (config.decoder), one token row per "
                                "codebook; pad/bos/start is the extra embedding row vocab_size", _CODEBOOK_SPECIALS,
                                build_from="decoder", batch=_codebook_batch),
    "gemma4_assistant": Override("the default text config does not pass the assistant's own validation "
                                 "(per-layer inputs must be off); a drafter runs on the target's embeddings and "
                                 "shared key/value states, not on token ids; the target's width is shrunk too",
                                 {"backbone_hidden_size": HIDDEN},
                                 base={"text_config": {"model_type": "gemma4_text", "hidden_size_per_layer_input": 0,
                                                       "vocab_size_per_layer_input": 0}},
                                 batch=_drafter_batch),
    "gemma4_unified_assistant": Override("a drafter runs on the target's embeddings and shared key/value states, "
                                         "not on token ids; the target's width is shrunk too",
                                         {"backbone_hidden_size": HIDDEN},
                                         batch=_drafter_batch),
    "dots3_note": Override("sliding layers need head_dim == qk_nope_head_dim + qk_rope_head_dim (8 + 8)",
                           {"text_config.per_layer_config.2.qk_nope_head_dim": 8}),
    "dots3_note_text": Override("sliding layers need head_dim == qk_nope_head_dim + qk_rope_head_dim (8 + 8)",
                                {"per_layer_config.2.qk_nope_head_dim": 8}),
    "hrm_text": Override("num_hidden_layers counts cache slots: layers per stack x H_cycles x (L_cycles + 1)",
                         {"num_layers_per_stack": 1, "num_hidden_layers": 8}),
}


def _is_dropout(key: str) -> bool:
    k = key.lower()
    return "dropout" in k or "pdrop" in k or k == "drop_rate"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _layer_count(d: dict) -> int | None:
    for k in ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "decoder_layers", "depth"):
        if _is_int(d.get(k)) and d[k] > 0:
            return d[k]
    return None


def _is_per_layer(k: str, v: Any, n: int | None) -> bool:
    return (isinstance(v, list) and n is not None and n > 1 and len(v) == n and k not in _LAYER_INDEX_LISTS
            and all(not isinstance(x, (list, dict)) for x in v))


def _pick_layers(d: dict, n: int) -> list[int]:
    """Indices of the original layers to keep: the first LAYERS, plus the first layer of each
    kind (per-layer lists, layer-index lists, per-layer overrides) those do not cover."""
    per_layer = [v for k, v in d.items() if _is_per_layer(k, v, n)]
    index_sets = [set(v) for k, v in d.items()
                  if k in _LAYER_INDEX_LISTS and isinstance(v, list) and all(_is_int(x) for x in v)]
    if isinstance(d.get("per_layer_config"), dict):
        index_sets.append({int(i) for i in d["per_layer_config"]})
    if _is_int(d.get("num_kv_shared_layers")) and 0 < d["num_kv_shared_layers"] < n:
        index_sets.append(set(range(n - d["num_kv_shared_layers"], n)))  # layers reusing an earlier KV cache

    def kind(i):
        return tuple(str(v[i]) for v in per_layer) + tuple(i in s for s in index_sets)

    keep = list(range(min(LAYERS, n)))
    seen = {kind(i) for i in keep}
    for i in range(n):
        if len(keep) >= MAX_LAYERS:
            break
        if kind(i) not in seen:
            seen.add(kind(i))
            keep.append(i)
    return sorted(keep)


# Fields shrunk to a fixed cap (those needing more than a cap are handled in _shrink_int).
_PLAIN_CAPS = (
    (_HEAD_DIMS, HEAD_DIM), (_INTERMEDIATE, INTERMEDIATE), (_MOE_INTERMEDIATE, MOE_INTERMEDIATE),
    (_EXPERTS, EXPERTS), (_EXPERTS_PER_TOKEN, EXPERTS_PER_TOKEN), (_VOCABS, VOCAB), (_POSITIONS, POSITIONS),
)


def _shrink_int(k: str, v: int, heads_orig: int | None) -> int:
    if _is_dropout(k) or k in _ZERO:
        return 0
    if k in _HIDDEN:
        return min(v, HIDDEN)
    if k in _HEADS:
        return min(v, HEADS)
    if k in _KV_HEADS:  # keep the grouping: MHA stays MHA, MQA stays MQA, GQA becomes 2 groups
        if v == 1 or heads_orig is None:
            return min(v, HEADS)
        return HEADS if v >= heads_orig else HEADS // 2
    for fields, cap in _PLAIN_CAPS:
        if k in fields:
            return min(v, cap)
    if k in _WINDOWS:
        return min(v, WINDOW) if v > 0 else v
    if k in _CAPS:
        return min(v, _CAPS[k]) if v > 0 else v
    return v


def _shrink_rope(rope: Any, head_dim: int | None) -> Any:
    if not isinstance(rope, dict):
        return rope
    out = {}
    for k, v in rope.items():
        if k in ("short_factor", "long_factor") and isinstance(v, list) and head_dim:
            factor = rope.get("partial_rotary_factor") or 1.0
            out[k] = v[: max(1, int(head_dim * factor) // 2)]
        elif k == "mrope_section" and isinstance(v, list) and head_dim:
            half, total = head_dim // 2, sum(v)
            scaled = [max(1, x * half // total) for x in v]
            scaled[0] += half - sum(scaled)
            out[k] = scaled
        elif k == "original_max_position_embeddings" and _is_int(v):
            out[k] = min(v, POSITIONS // 2)
        else:
            out[k] = _shrink_rope(v, head_dim)
    return out


def _remap_token_ids(d: dict, vocab: int) -> None:
    """Special token ids >= vocab move to distinct ids at the top of the new vocabulary."""
    taken: dict[int, int] = {}

    def remap(v):
        if not _is_int(v) or v < vocab:
            return v
        if v not in taken:
            taken[v] = vocab - 1 - len(taken)
        return taken[v]

    for k, v in list(d.items()):
        if k.endswith(("token_id", "token_ids", "token_index")):
            d[k] = [remap(x) for x in v] if isinstance(v, list) else remap(v)


def _first(d: dict, keys) -> str | None:
    return next((k for k in keys if _is_int(d.get(k))), None)


def _keep_relations(orig: dict, out: dict) -> None:
    """Restore equalities between fields that the per-field rules would break."""
    # Multi-head latent attention: head_dim is the rotary part of a query/key head.
    if _is_int(orig.get("qk_rope_head_dim")) and orig.get("head_dim") == orig["qk_rope_head_dim"]:
        out["head_dim"] = out["qk_rope_head_dim"]
    if _is_int(orig.get("qk_nope_head_dim")) and _is_int(orig.get("qk_rope_head_dim")):
        total = orig["qk_nope_head_dim"] + orig["qk_rope_head_dim"]
        for k in ("qk_head_dim", "head_dim"):
            if orig.get(k) == total:
                out[k] = out["qk_nope_head_dim"] + out["qk_rope_head_dim"]
    # Mamba mixers: heads x head dim == the inner size (expand x hidden, or mamba_d_ssm).
    hidden_key = _first(out, ("hidden_size", "d_model"))
    heads_key = _first(out, ("mamba_n_heads", "mamba_num_heads", "n_mamba_heads"))
    dim_key = _first(out, ("mamba_d_head", "mamba_head_dim", "mamba_headdim"))
    expand_key = _first(out, ("mamba_expand", "expand"))
    if heads_key is None and "state_size" in out and expand_key == "expand":  # a plain Mamba-2 config
        heads_key, dim_key = _first(out, ("num_heads",)), _first(out, ("head_dim",))
    if heads_key and dim_key:
        inner_orig = orig[heads_key] * orig[dim_key]
        if _is_int(orig.get("mamba_d_ssm")) and inner_orig == orig["mamba_d_ssm"]:
            out[dim_key] = max(1, out["mamba_d_ssm"] // out[heads_key])
        elif expand_key and hidden_key and inner_orig == orig[expand_key] * orig[hidden_key]:
            out[dim_key] = max(1, out[expand_key] * out[hidden_key] // out[heads_key])


def _is_width_alias(k: str, v: int, widths: frozenset) -> bool:
    """An otherwise unknown ``*_dim`` / ``*_size`` field equal to a hidden size of this config or
    an enclosing one (adapters and projections between sub-models)."""
    if v not in widths or not ("dim" in k or "size" in k):
        return False
    return not any(w in k for w in ("image", "patch", "vocab", "position", "window", "chunk", "sampling", "feature"))


def _widths(d: dict) -> frozenset:
    """The hidden sizes (above HIDDEN) of a config and all its nested configs."""
    own = {d[k] for k in _HIDDEN if _is_int(d.get(k)) and d[k] > HIDDEN}
    for v in d.values():
        if isinstance(v, dict) and "model_type" in v:
            own |= _widths(v)
    return frozenset(own)


def shrink_dict(d: dict, widths: frozenset | None = None) -> dict:
    """The shrunk copy of one config's ``to_dict()``, nested sub-configs included. ``widths``:
    the original hidden sizes anywhere in the config tree."""
    widths = _widths(d) if widths is None else widths
    n = _layer_count(d)
    keep = _pick_layers(d, n) if n else None
    heads_orig = next((d[k] for k in sorted(_HEADS) if _is_int(d.get(k)) and d[k] > 0), None)
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and "model_type" in v:  # a nested config
            out[k] = shrink_dict(v, widths)
        elif isinstance(v, float) and (_is_dropout(k) or k in _ZERO):
            out[k] = 0.0
        elif _is_int(v):
            if k in _LAYER_COUNTS:
                out[k] = len(keep) if keep and v == n else min(v, LAYERS)
            elif k == "num_kv_shared_layers" and keep:  # the kept layers among the last v
                out[k] = sum(1 for i in keep if i >= n - v)
            elif _shrink_int(k, v, heads_orig) == v and _is_width_alias(k, v, widths):
                out[k] = HIDDEN
            else:
                out[k] = _shrink_int(k, v, heads_orig)
        elif keep and _is_per_layer(k, v, n):
            out[k] = [_shrink_int(k, v[i], heads_orig) if _is_int(v[i]) else v[i] for i in keep]
        elif keep and k in _LAYER_INDEX_LISTS and isinstance(v, list) and all(_is_int(x) for x in v):
            out[k] = [new for new, old in enumerate(keep) if old in v]
        elif keep and k == "per_layer_config" and isinstance(v, dict):
            # {layer index: field overrides}, re-keyed to the kept layers
            old = {int(i): c for i, c in v.items()}
            out[k] = {str(new): shrink_dict(old[o]) for new, o in enumerate(keep) if o in old}
        else:
            out[k] = v
    _keep_relations(d, out)
    head_dim = out.get("head_dim") if _is_int(out.get("head_dim")) else None
    if head_dim is None:
        hidden = out.get(_first(out, ("hidden_size", "d_model", "n_embd")) or "")
        heads = out.get(_first(out, sorted(_HEADS)) or "")
        head_dim = hidden // heads if hidden and heads else None
        if "head_dim" in out and head_dim:  # None means hidden // heads; some models read it unguarded
            out["head_dim"] = head_dim
    for k in ("rope_parameters", "rope_scaling"):
        if k in out:
            out[k] = _shrink_rope(out[k], head_dim)
    if _is_int(out.get("vocab_size")):
        _remap_token_ids(out, out["vocab_size"])
    return out


# ---- vision and audio fields (opt-in: ``tiny_config(..., modalities=True)``) -------------------

IMAGE = 32  # image side, rounded to a multiple of the patch (at least two patches a side)
STAGE_WIDTH = 256  # the widest stage of a multi-stage backbone or convolutional feature extractor
STAGE_DEPTH = 2  # blocks per stage
QUERIES = 16  # object queries of a detector: no more than the anchors of a tiny image
STAGE_WINDOW = 2  # attention window (in patches) of a windowed hierarchical backbone
_IMAGE_SIZES = {"image_size", "img_size"}
# Lists of per-stage widths (channels) of multi-stage backbones and convolutional feature
# extractors. All the lists of one config are divided by the same power of two, so that the
# channels one stage hands to the next (listed in two lists) still agree; counts of at most
# four are input channels and stay.
_WIDTH_LISTS = {
    "hidden_sizes", "embed_dims", "embed_dim_per_stage", "stage_out_channels", "stage_in_channels",
    "stage_mid_channels", "encoder_in_channels", "decoder_in_channels", "backbone_channel_list", "conv_dim",
    "tdnn_dim", "neck_hidden_sizes", "encoder_hidden_sizes", "base_attn_unit_dims", "channels",
    "hidden_channels", "block_channels", "stem_channels", "layer_list_out_channels",
}
_STAGE_DEPTHS = {"depths", "num_blocks_per_stage", "blocks_per_stage"}
_STAGE_HEADS = {"num_heads", "num_attention_heads", "attention_heads", "num_heads_per_stage"}
# Projection and bridge widths between towers: capped like a hidden size.
_PROJECTIONS = {
    "projection_dim", "out_hidden_size", "projector_hidden_size", "projection_hidden_dim",
    "projection_intermediate_dim", "text_hidden_size", "vision_hidden_size", "encoder_hidden_size",
    "decoder_hidden_size", "decoder_intermediate_size", "classifier_proj_size", "xvector_output_dim",
    "codevector_dim", "proj_codevector_dim", "fpn_hidden_size", "fpn_feature_size", "mask_feature_size",
    "output_channels", "visual_embedding_dim", "visual_feat_dim", "projector_input_dim", "projector_output_dim",
    "upsample_groups",  # a depthwise upsampling: one group per channel of the hidden size
}


def _is_int_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(_is_int(x) for x in v)


def _image_side(patch: Any) -> int:
    p = patch[0] if _is_int_list(patch) else patch
    if not _is_int(p) or p <= 0:
        return IMAGE
    return max(2 * p, IMAGE // p * p)


def _widest(d: dict) -> int:
    """The largest entry of the width lists of ``d`` and of its nested configs."""
    return max([max(v) for k, v in d.items() if k in _WIDTH_LISTS and _is_int_list(v)]
               + [_widest(v) for v in d.values() if isinstance(v, dict)], default=0)


def _width_factor(d: dict) -> int:
    widest = _widest(d)
    f = 1
    while widest // f > STAGE_WIDTH:
        f *= 2
    return f


def _narrow_blocks(v: Any, f: int) -> Any:
    """Per-block ``[kernel, in channels, out channels, stride, ...]`` lists: channels divided by ``f``."""
    if isinstance(v, list) and len(v) >= 3 and _is_int(v[0]) and _is_int(v[1]) and _is_int(v[2]):
        return [v[0], max(1, v[1] // f), max(1, v[2] // f), *v[3:]]
    return [_narrow_blocks(x, f) for x in v] if isinstance(v, list) else v


def _clamped_stages(v: list, layers: int) -> list:
    """Backbone outputs (``"stageN"`` names or indices) with every stage beyond ``layers`` moved
    to the last one, duplicates dropped."""
    out: list = []
    for x in v:
        if isinstance(x, str) and x.startswith("stage") and x[5:].isdigit():
            x = f"stage{min(int(x[5:]), layers)}"
        elif _is_int(x):
            x = min(x, layers)
        if x not in out:
            out.append(x)
    return out


def shrink_modalities(d: dict, factor: int | None = None) -> dict:
    """``d`` (a ``shrink_dict`` result) with the vision and audio fields shrunk as well: image
    sizes to ``IMAGE``, multi-stage backbones to narrow two-block stages (heads per stage divided
    alike, so widths stay divisible; small attention windows), convolutional feature extractors
    narrowed, projections between towers capped at ``HIDDEN``, stochastic depth off. The width
    lists of a config and of its nested configs (a backbone) are divided by one ``factor``, so
    that the channels a backbone hands to its parent still agree."""
    out: dict[str, Any] = {}
    hierarchical = _is_int_list(d.get("depths")) and len(d["depths"]) > 1
    f = factor if factor is not None else _width_factor(d)
    for k, v in d.items():
        if isinstance(v, dict) and "model_type" in v:
            out[k] = shrink_modalities(v, f)
        elif isinstance(v, float) and ("drop_path" in k or "stochastic_depth" in k):
            out[k] = 0.0
        elif k in _IMAGE_SIZES and (_is_int(v) or (_is_int_list(v) and len(v) == 2)):
            side = _image_side(d.get("patch_size"))
            if hierarchical and _is_int(d.get("window_size")) and _is_int(d.get("patch_size")):
                # the last stage (halved at each stage) still spans one attention window
                side = max(side, d["patch_size"] * min(d["window_size"], STAGE_WINDOW) * 2 ** (len(d["depths"]) - 1))
            out[k] = side if _is_int(v) else [side, side]
        elif k == "decoder_in_channels" and _is_int_list(v) and len(set(v)) == 1:
            out[k] = [min(v[0], HIDDEN)] * len(v)  # the detection decoder reads the encoder's hidden size
        elif k in _WIDTH_LISTS and _is_int_list(v):
            out[k] = [x if x <= 4 else max(1, x // f) for x in v]
        elif k == "block_configs" and isinstance(v, list):
            out[k] = _narrow_blocks(v, f)
        elif k in _STAGE_DEPTHS and _is_int_list(v):
            out[k] = [min(x, STAGE_DEPTH) for x in v]
        elif k in _STAGE_HEADS and _is_int_list(v) and hierarchical:
            low = min(v)
            out[k] = [max(1, x // low) for x in v] if all(x % low == 0 for x in v) else [1] * len(v)
        elif k == "embed_dim" and _is_int(v) and hierarchical:
            out[k] = min(v, 32)
        elif k == "window_size" and _is_int(v) and hierarchical:
            out[k] = min(v, STAGE_WINDOW)
        elif k == "image_embedding_size" and _is_int(v) and _is_int(d.get("patch_size")):
            out[k] = _image_side(d["patch_size"]) // d["patch_size"]  # the image encoder's grid (SAM)
        elif k == "num_groups" and _is_int(v) and f > 1 and any(x in d for x in _WIDTH_LISTS):
            out[k] = max(1, v // f)  # group norm over the narrowed stages
        elif k == "num_pos_feats" and _is_int(v):
            out[k] = min(v, HIDDEN // 2)  # random Fourier features: sin and cos make the hidden size
        elif k in ("out_features", "out_indices") and _is_int(d.get("num_hidden_layers")) \
                and isinstance(v, list) and v:
            out[k] = _clamped_stages(v, d["num_hidden_layers"])  # a ViT backbone's outputs among its tiny layers
        elif k == "num_queries" and _is_int(v):
            out[k] = min(v, QUERIES)
        elif k in _PROJECTIONS and _is_int(v) and v > HIDDEN:
            out[k] = HIDDEN
        else:
            out[k] = v
    _remap_composite_ids(out)
    return out


def _token_ids(d: dict) -> set[int]:
    found: set[int] = set()
    for k, v in d.items():
        if isinstance(v, dict):
            found |= _token_ids(v)
        elif isinstance(k, str) and k.endswith(("token_id", "token_ids", "token_index")):
            found |= {x for x in (v if isinstance(v, list) else [v]) if _is_int(x)}
    return found


def _remap_composite_ids(d: dict) -> None:
    """A composite config (a text model with other towers) names its placeholder tokens (image,
    video, audio) at the top level, while the vocabulary is its text config's: ids beyond that
    vocabulary move to distinct free ids at its top."""
    text = next((d[k] for k in ("text_config", "language_config", "llm_config", "decoder_config", "decoder")
                 if isinstance(d.get(k), dict) and _is_int(d[k].get("vocab_size"))), None)
    if text is None or _is_int(d.get("vocab_size")):
        return
    vocab = text["vocab_size"]
    used = {x for x in _token_ids(d) if x < vocab}
    taken: dict[int, int] = {}

    def remap(v):
        if not _is_int(v) or v < vocab:
            return v
        if v not in taken:
            new = vocab - 1
            while new in used:
                new -= 1
            used.add(new)
            taken[v] = new
        return taken[v]

    for k, v in list(d.items()):
        if k.endswith(("token_id", "token_ids", "token_index")):
            d[k] = [remap(x) for x in v] if isinstance(v, list) else remap(v)


def _set_dotted(d: dict, key: str, value: Any) -> None:
    *path, last = key.split(".")
    for p in path:
        d = d.setdefault(p, {})
    d[last] = value


def tiny_config_kwargs(model_type: str, *, decoder: bool = True, modalities: bool = False,
                       extra: Override | None = None) -> dict[str, Any]:
    """The keyword arguments ``tiny_config`` passes to ``AutoConfig.for_model``. ``decoder``: an
    encoder-style model (BERT family) is configured as a decoder, as a causal LM needs;
    ``modalities``: the vision and audio fields are shrunk too (``shrink_modalities``); ``extra``:
    one more override, applied after this module's own (``OVERRIDES``)."""
    from transformers import AutoConfig

    override = OVERRIDES.get(model_type, Override(""))
    extra = extra or Override("")
    base = AutoConfig.for_model(model_type, **{**override.base, **extra.base}).to_dict()
    small = shrink_dict(base)
    if modalities:
        small = shrink_modalities(small)
    # Top level: only what changed. Nested configs are passed whole (their class defaults
    # can differ from the defaults the parent config gives them).
    kwargs = {k: v for k, v in small.items()
              if k not in base or v != base[k] or k in override.base or k in extra.base}
    if decoder and "is_decoder" in base:  # encoder-style models (BERT family) are causal LMs only as decoders
        kwargs["is_decoder"] = True
    for k, v in {**override.changes, **extra.changes}.items():
        _set_dotted(kwargs, k, v)
    return kwargs


def tiny_config(model_type: str, **kwargs):
    """A tiny config for ``model_type``, every dropout 0 (keyword arguments: ``tiny_config_kwargs``)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **tiny_config_kwargs(model_type, **kwargs))


# ---- token batches ----------------------------------------------------------------------------

# rows, tokens, padding of the second row; the tokens generate adds
BATCH, SEQ, PAD, NEW_TOKENS = 2, 16, 3, 4


def special_ids(config, found: set[int] | None = None) -> set[int]:
    """Every token id the config names (pad, bos, image tokens, ...), nested configs included."""
    found = set() if found is None else found
    for k, v in config.to_dict().items() if hasattr(config, "to_dict") else config.items():
        if isinstance(v, dict):
            special_ids(v, found)
        elif isinstance(k, str) and k.endswith(("token_id", "token_ids", "token_index")):
            for x in v if isinstance(v, list) else [v]:
                if isinstance(x, int) and not isinstance(x, bool):
                    found.add(x)
    return found


def vocab_size(model, config) -> int:
    """Ids valid both as inputs and as labels: the smaller of the input embedding's rows
    (which can include extra rows, e.g. prompt tokens) and the configured vocabulary."""
    import torch

    sizes = [getattr(config.get_text_config(decoder=True), "vocab_size", None)]
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if isinstance(emb, torch.nn.Embedding):
        sizes.append(emb.num_embeddings)
    return min(s for s in sizes if isinstance(s, int) and s > 0)


def make_batches(model_type: str, model, config) -> tuple[dict, dict]:
    """``(train_batch, generate_batch)`` of a causal LM: random ordinary token ids (no special
    ids). Training pads the second row on the right (labels -100 there), generation on the left,
    as usual; the generate batch carries the pad id as ``_pad_token_id``."""
    import inspect

    import torch

    params = inspect.signature(model.forward).parameters
    vocab = vocab_size(model, config)
    specials = special_ids(config)
    ordinary = torch.tensor([i for i in range(vocab) if i not in specials])
    g = torch.Generator().manual_seed(1)
    ids = ordinary[torch.randint(0, len(ordinary), (BATCH, SEQ), generator=g)]
    pad_id = getattr(config.get_text_config(decoder=True), "pad_token_id", None)
    pad_id = pad_id if isinstance(pad_id, int) and 0 <= pad_id < vocab else int(ordinary[0])
    train = {"input_ids": ids.clone()}
    gen = {"input_ids": ids[:, : SEQ // 2].clone()}
    if "attention_mask" in params:
        mask = torch.ones_like(ids)
        mask[1, -PAD:] = 0
        train["input_ids"][1, -PAD:] = pad_id
        train["attention_mask"] = mask
        gmask = torch.ones_like(gen["input_ids"])
        gmask[1, :PAD] = 0
        gen["input_ids"][1, :PAD] = pad_id
        gen["attention_mask"] = gmask
    labels = train["input_ids"].clone()
    if "attention_mask" in train:
        labels[train["attention_mask"] == 0] = -100
    train["labels"] = labels
    override = OVERRIDES.get(model_type)
    if override is not None and override.batch is not None:
        train = override.batch(config, train, g)
        gen = {k: v for k, v in override.batch(config, gen, g).items() if k != "labels"}
        if train["input_ids"].shape[0] != BATCH:  # one row per codebook: the mask is per sample
            gen.pop("attention_mask", None)
    gen["_pad_token_id"] = pad_id
    return train, gen
