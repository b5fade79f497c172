"""Tiny configurations and inputs of Diffusers model classes, for the Hugging Face sweep's
``diffusers`` population (``hf_sweep.py --population diffusers``).

Each ``Spec`` names a model class, the keyword arguments that build it tiny (a few
channels, one or two layers) and a function that makes its keyword inputs from a seeded
CPU generator. A class may appear more than once under different names when a config
switch selects a different code path (``UNet2DConditionModel[sdxl]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Spec:
    cls: str  # a class that ``diffusers`` exports, or "module.path.Class"
    config: dict | Callable[[], dict]  # a callable for arguments that are models themselves (Multi* wrappers)
    inputs: Callable[[torch.Generator], dict]
    method: str = "forward"
    grad_inputs: tuple[str, ...] | None = None  # inputs whose gradients are compared; None: the first float input
    tolerance: tuple[float, float] | None = None  # (rtol, atol) instead of model_tolerance's
    prepare: Callable[[torch.nn.Module], None] | None = None  # run on the built model (attention processor, ...)
    notes: str = ""


def rn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=g)


def ri(g: torch.Generator, high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=g)


def steps(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


SPECS: dict[str, Spec] = {}


def spec(name: str, cls: str | None = None, **kw) -> None:
    assert name not in SPECS, name
    SPECS[name] = Spec(cls or name.split("[")[0], **kw)


def _image(c=3, s=32, b=2):
    return lambda g: {"sample": rn(g, b, c, s, s)}


def _video(c=3, f=9, s=16, b=1):
    return lambda g: {"sample": rn(g, b, c, f, s, s)}


# ---- UNets ------------------------------------------------------------------------------------

_SD_UNET = dict(block_out_channels=(8, 16), norm_num_groups=4, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16, attention_head_dim=4,
                in_channels=4, out_channels=4, layers_per_block=1, sample_size=16)

spec("UNet2DConditionModel", config=_SD_UNET,
     inputs=lambda g: {"sample": rn(g, 2, 4, 16, 16), "timestep": steps(10.0, 500.0),
                       "encoder_hidden_states": rn(g, 2, 7, 16)})
spec("UNet2DConditionModel[sdxl]",
     config=dict(_SD_UNET, addition_embed_type="text_time", addition_time_embed_dim=8,
                 projection_class_embeddings_input_dim=8 * 6 + 12, transformer_layers_per_block=(1, 2),
                 use_linear_projection=True, attention_head_dim=(2, 4)),
     inputs=lambda g: {"sample": rn(g, 2, 4, 16, 16), "timestep": steps(10.0, 500.0),
                       "encoder_hidden_states": rn(g, 2, 7, 16),
                       "added_cond_kwargs": {"text_embeds": rn(g, 2, 12), "time_ids": rn(g, 2, 6)}})
spec("UNet2DModel", config=dict(block_out_channels=(8, 16), norm_num_groups=4,
                                down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                                up_block_types=("AttnUpBlock2D", "UpBlock2D"), attention_head_dim=4,
                                in_channels=3, out_channels=3, layers_per_block=1, sample_size=16),
     inputs=lambda g: {"sample": rn(g, 2, 3, 16, 16), "timestep": steps(10.0, 500.0)})
spec("UNet1DModel", config=dict(block_out_channels=(8, 8, 16, 16), in_channels=14, out_channels=14,
                                time_embedding_type="positional", use_timestep_embedding=True, flip_sin_to_cos=False,
                                freq_shift=1.0, out_block_type="OutConv1DBlock", mid_block_type="MidResTemporalBlock1D",
                                down_block_types=("DownResnetBlock1D",) * 4, up_block_types=("UpResnetBlock1D",) * 3,
                                act_fn="swish"),
     inputs=lambda g: {"sample": rn(g, 2, 14, 16), "timestep": steps(10.0, 10.0)})
spec("UNet2DModel[score-sde]", cls="UNet2DModel",
     config=dict(block_out_channels=[32, 32, 32, 32], in_channels=3, layers_per_block=1, out_channels=3,
                 time_embedding_type="fourier", norm_eps=1e-6, mid_block_scale_factor=2 ** 0.5, norm_num_groups=None,
                 attention_head_dim=8,
                 down_block_types=["SkipDownBlock2D", "AttnSkipDownBlock2D", "SkipDownBlock2D", "SkipDownBlock2D"],
                 up_block_types=["SkipUpBlock2D", "SkipUpBlock2D", "AttnSkipUpBlock2D", "SkipUpBlock2D"]),
     inputs=lambda g: {"sample": rn(g, 2, 3, 16, 16), "timestep": torch.tensor([10, 10], dtype=torch.int32)})
spec("UNet3DConditionModel",
     config=dict(block_out_channels=(8, 16), norm_num_groups=4, cross_attention_dim=16, attention_head_dim=4,
                 in_channels=4, out_channels=4, layers_per_block=1, sample_size=16,
                 down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
                 up_block_types=("UpBlock3D", "CrossAttnUpBlock3D")),
     inputs=lambda g: {"sample": rn(g, 1, 4, 2, 16, 16), "timestep": steps(10.0),
                       "encoder_hidden_states": rn(g, 1, 5, 16)})

# ---- DiT / MMDiT transformers (image) ---------------------------------------------------------

spec("FluxTransformer2DModel",
     config=dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                 num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8]),
     inputs=lambda g: {"hidden_states": rn(g, 1, 16, 4), "encoder_hidden_states": rn(g, 1, 8, 32),
                       "pooled_projections": rn(g, 1, 32), "timestep": steps(0.7),
                       "img_ids": _flux_img_ids(4, 4), "txt_ids": torch.zeros(8, 3)})
spec("FluxTransformer2DModel[guidance]", cls="FluxTransformer2DModel",
     config=dict(patch_size=1, in_channels=4, num_layers=2, num_single_layers=2, attention_head_dim=16,
                 num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8],
                 guidance_embeds=True),
     inputs=lambda g: {"hidden_states": rn(g, 2, 16, 4), "encoder_hidden_states": rn(g, 2, 8, 32),
                       "pooled_projections": rn(g, 2, 32), "timestep": steps(0.7, 0.2), "guidance": steps(3.5, 3.5),
                       "img_ids": _flux_img_ids(4, 4), "txt_ids": torch.zeros(8, 3)})


def _flux_img_ids(h: int, w: int) -> torch.Tensor:
    ids = torch.zeros(h, w, 3)
    ids[..., 1] = torch.arange(h)[:, None]
    ids[..., 2] = torch.arange(w)[None, :]
    return ids.reshape(h * w, 3)


def _flux2_ids(batch: int, h: int, w: int, text: int) -> tuple[torch.Tensor, torch.Tensor]:
    img = torch.cartesian_prod(torch.arange(1), torch.arange(h), torch.arange(w), torch.arange(1))
    txt = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(text))
    return img.unsqueeze(0).expand(batch, -1, -1), txt.unsqueeze(0).expand(batch, -1, -1)


def _flux2_inputs(g):
    img_ids, txt_ids = _flux2_ids(1, 4, 4, 12)
    return {"hidden_states": rn(g, 1, 16, 4), "encoder_hidden_states": rn(g, 1, 12, 32), "img_ids": img_ids,
            "txt_ids": txt_ids, "timestep": steps(0.6), "guidance": steps(4.0)}


spec("Flux2Transformer2DModel",
     config=dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                 num_attention_heads=2, joint_attention_dim=32, timestep_guidance_channels=256,
                 axes_dims_rope=[4, 4, 4, 4]),
     inputs=_flux2_inputs)


def _qwen_inputs(g, batch=1, mask_tail=False):
    mask = torch.ones(batch, 8, dtype=torch.long)
    if mask_tail:
        mask[-1, 5:] = 0
    return {"hidden_states": rn(g, batch, 16, 16), "encoder_hidden_states": rn(g, batch, 8, 16),
            "encoder_hidden_states_mask": mask, "timestep": steps(*[0.5] * batch),
            "img_shapes": [(1, 4, 4)] * batch}


_QWEN = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=4,
             joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4))
spec("QwenImageTransformer2DModel", config=_QWEN, inputs=_qwen_inputs)
spec("QwenImageTransformer2DModel[masked]", config=_QWEN, inputs=lambda g: _qwen_inputs(g, batch=2, mask_tail=True))

spec("SD3Transformer2DModel",
     config=dict(sample_size=16, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=4,
                 caption_projection_dim=32, joint_attention_dim=32, pooled_projection_dim=64, out_channels=4,
                 pos_embed_max_size=32, dual_attention_layers=(), qk_norm=None),
     inputs=lambda g: {"hidden_states": rn(g, 2, 4, 16, 16), "encoder_hidden_states": rn(g, 2, 10, 32),
                       "pooled_projections": rn(g, 2, 64), "timestep": steps(100.0, 900.0)})
spec("SD3Transformer2DModel[sd3.5]", cls="SD3Transformer2DModel",
     config=dict(sample_size=16, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=4,
                 caption_projection_dim=32, joint_attention_dim=32, pooled_projection_dim=64, out_channels=4,
                 pos_embed_max_size=32, dual_attention_layers=(0,), qk_norm="rms_norm"),
     inputs=lambda g: {"hidden_states": rn(g, 2, 4, 16, 16), "encoder_hidden_states": rn(g, 2, 10, 32),
                       "pooled_projections": rn(g, 2, 64), "timestep": steps(100.0, 900.0)})

# ---- video transformers ----------------------------------------------------------------------

_WAN = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
            text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
            rope_max_seq_len=32)
spec("WanTransformer3DModel", config=_WAN,
     inputs=lambda g: {"hidden_states": rn(g, 1, 4, 2, 16, 16), "encoder_hidden_states": rn(g, 1, 12, 16),
                       "timestep": steps(700.0)})

# ---- autoencoders -----------------------------------------------------------------------------

spec("AutoencoderKL", config=dict(block_out_channels=[8, 16], in_channels=3, out_channels=3,
                                  down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
                                  latent_channels=4, norm_num_groups=4, layers_per_block=1),
     inputs=_image())
spec("AutoencoderKLQwenImage", config=dict(base_dim=8, z_dim=4, dim_mult=[1, 2, 2], num_res_blocks=1,
                                           temperal_downsample=[False, True], latents_mean=[0.0] * 4,
                                           latents_std=[1.0] * 4),
     inputs=lambda g: {"sample": rn(g, 1, 3, 5, 16, 16)})
spec("AutoencoderKLWan", config=dict(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                     temperal_downsample=[False, True, True]),
     inputs=_video(f=9, s=16))

# ---- more image transformers ------------------------------------------------------------------

spec("AuraFlowTransformer2DModel",
     config=dict(sample_size=16, patch_size=2, in_channels=4, num_mmdit_layers=1, num_single_dit_layers=1,
                 attention_head_dim=8, num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32,
                 out_channels=4, pos_embed_max_size=64),
     inputs=lambda g: {"hidden_states": rn(g, 2, 4, 16, 16), "encoder_hidden_states": rn(g, 2, 12, 32),
                       "timestep": steps(100.0, 700.0)})
spec("BriaTransformer2DModel",
     config=dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=8,
                 num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=None, axes_dims_rope=[0, 4, 4]),
     inputs=lambda g: {"hidden_states": rn(g, 1, 16, 4), "encoder_hidden_states": rn(g, 1, 12, 32),
                       "img_ids": _flux_img_ids(4, 4), "txt_ids": torch.zeros(12, 3), "timestep": steps(0.4)})


def _fibo_inputs(g):
    ehs = rn(g, 1, 12, 64)
    return {"hidden_states": rn(g, 1, 64, 16), "encoder_hidden_states": ehs, "img_ids": _flux_img_ids(8, 8),
            "txt_ids": torch.zeros(12, 3), "timestep": steps(0.4),
            "text_encoder_layers": [ehs[:, :, :32] * 0.5, ehs[:, :, 32:]]}


spec("BriaFiboTransformer2DModel",
     config=dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8,
                 num_attention_heads=2, joint_attention_dim=64, text_encoder_dim=32, pooled_projection_dim=None,
                 axes_dims_rope=[0, 4, 4]),
     inputs=_fibo_inputs)
spec("ChromaTransformer2DModel",
     config=dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                 num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=[4, 4, 8], approximator_num_channels=8,
                 approximator_hidden_dim=16, approximator_layers=1),
     inputs=lambda g: {"hidden_states": rn(g, 1, 16, 4), "encoder_hidden_states": rn(g, 1, 12, 32),
                       "img_ids": _flux_img_ids(4, 4), "txt_ids": torch.zeros(12, 3), "timestep": steps(0.4)})


def _cogview_inputs(g, b=2, s=8):
    size = torch.tensor([[s * 8, s * 8]] * b)
    return {"hidden_states": rn(g, b, 4, s, s), "encoder_hidden_states": rn(g, b, 8, 8), "timestep": steps(10.0, 800.0),
            "original_size": size, "target_size": size, "crop_coords": torch.zeros(b, 2, dtype=torch.long)}


spec("CogView3PlusTransformer2DModel",
     config=dict(patch_size=2, in_channels=4, num_layers=2, attention_head_dim=4, num_attention_heads=2, out_channels=4,
                 text_embed_dim=8, time_embed_dim=8, condition_dim=2, pos_embed_max_size=8, sample_size=8),
     inputs=_cogview_inputs)
spec("CogView4Transformer2DModel",
     config=dict(patch_size=2, in_channels=4, num_layers=2, attention_head_dim=4, num_attention_heads=4, out_channels=4,
                 text_embed_dim=8, time_embed_dim=8, condition_dim=4),
     inputs=_cogview_inputs)
spec("GlmImageTransformer2DModel",
     config=dict(patch_size=2, in_channels=4, out_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2,
                 text_embed_dim=32, time_embed_dim=16, condition_dim=8, prior_vq_quantizer_codebook_size=64),
     inputs=lambda g: {"hidden_states": rn(g, 1, 4, 8, 8), "encoder_hidden_states": rn(g, 1, 12, 32),
                       "prior_token_id": ri(g, 64, 1, 16), "prior_token_drop": torch.zeros(1, dtype=torch.bool),
                       "timestep": steps(300.0), "target_size": torch.tensor([[8.0, 8.0]]),
                       "crop_coords": torch.zeros(1, 2)})
spec("ErnieImageTransformer2DModel",
     config=dict(hidden_size=16, num_attention_heads=1, num_layers=1, ffn_hidden_size=16, in_channels=16,
                 out_channels=16, patch_size=1, text_in_dim=16, rope_theta=256, rope_axes_dim=(8, 4, 4), eps=1e-6,
                 qk_layernorm=True),
     inputs=lambda g: {"hidden_states": rn(g, 1, 16, 8, 8), "timestep": steps(0.5), "text_bth": rn(g, 1, 10, 16),
                       "text_lens": torch.tensor([10])})
spec("HiDreamImageTransformer2DModel",
     config=dict(patch_size=2, in_channels=4, out_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=8,
                 num_attention_heads=4, caption_channels=[8, 4], text_emb_dim=8, num_routed_experts=2,
                 num_activated_experts=2, axes_dims_rope=(4, 2, 2), max_resolution=(16, 16), llama_layers=(0, 1),
                 force_inference_output=True),
     inputs=lambda g: {"hidden_states": rn(g, 2, 4, 16, 16), "encoder_hidden_states_t5": rn(g, 2, 8, 8),
                       "encoder_hidden_states_llama3": rn(g, 2, 2, 8, 4), "pooled_embeds": rn(g, 2, 8),
                       "timesteps": steps(10.0, 600.0)})

# ---- more video transformers ------------------------------------------------------------------

_ANYFLOW = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
                text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, rope_max_seq_len=32,
                gate_value=0.25, deltatime_type="r")
spec("AnyFlowTransformer3DModel", config=_ANYFLOW,
     inputs=lambda g: {"hidden_states": rn(g, 1, 2, 4, 16, 16), "timestep": torch.full((1, 2), 500.0),
                       "r_timestep": torch.full((1, 2), 250.0), "encoder_hidden_states": rn(g, 1, 12, 16)})
spec("AnyFlowFARTransformer3DModel",
     config=dict(_ANYFLOW, compressed_patch_size=(1, 4, 4), full_chunk_limit=3),
     inputs=lambda g: {"hidden_states": rn(g, 1, 4, 4, 16, 16), "timestep": torch.full((1, 4), 500.0),
                       "r_timestep": torch.full((1, 4), 250.0), "encoder_hidden_states": rn(g, 1, 12, 16),
                       "chunk_partition": [2, 2]})
spec("ChronoEditTransformer3DModel",
     config=dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=16, out_channels=16,
                 text_dim=32, freq_dim=16, ffn_dim=32, num_layers=2, cross_attn_norm=True,
                 qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None,
                 rope_max_seq_len=64, pos_embed_seq_len=None, rope_temporal_skip_len=8),
     inputs=lambda g: {"hidden_states": rn(g, 1, 16, 2, 8, 8), "timestep": steps(400.0),
                       "encoder_hidden_states": rn(g, 1, 12, 32)})
_COGVIDEOX = dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, time_embed_dim=2,
                  text_embed_dim=8, num_layers=2, sample_width=8, sample_height=8, sample_frames=8, patch_size=2,
                  patch_size_t=None, temporal_compression_ratio=4, max_text_seq_length=8)
spec("CogVideoXTransformer3DModel", config=_COGVIDEOX,
     inputs=lambda g: {"hidden_states": rn(g, 2, 1, 4, 8, 8), "encoder_hidden_states": rn(g, 2, 8, 8),
                       "timestep": steps(10.0, 900.0)})
spec("CogVideoXTransformer3DModel[1.5]", cls="CogVideoXTransformer3DModel",
     config=dict(_COGVIDEOX, attention_head_dim=16, patch_size_t=2, use_rotary_positional_embeddings=True),
     inputs=lambda g: {"hidden_states": rn(g, 2, 2, 4, 8, 8), "encoder_hidden_states": rn(g, 2, 8, 8),
                       "timestep": steps(10.0, 900.0), "image_rotary_emb": _cogvideox_rope(1, 4, 4, 16)})


def _cogvideox_rope(frames: int, h: int, w: int, head_dim: int):
    """The (cos, sin) rotary tables the CogVideoX pipeline passes for a grid of ``frames x h x w`` tokens."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    return get_3d_rotary_pos_embed(embed_dim=head_dim, crops_coords=((0, 0), (h, w)), grid_size=(h, w),
                                   temporal_size=frames, device=torch.device("cpu"))


spec("ConsisIDTransformer3DModel",
     config=dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, time_embed_dim=2,
                 text_embed_dim=8, num_layers=1, sample_width=8, sample_height=8, sample_frames=8, patch_size=2,
                 temporal_compression_ratio=4, max_text_seq_length=8, cross_attn_interval=1, is_kps=False,
                 is_train_face=True, cross_attn_dim_head=1, cross_attn_num_heads=1, LFE_id_dim=2, LFE_vit_dim=2,
                 LFE_depth=5, LFE_dim_head=8, LFE_num_heads=2, LFE_num_id_token=1, LFE_num_querie=1,
                 LFE_output_dim=10, LFE_ff_mult=1, LFE_num_scale=1),
     inputs=lambda g: {"hidden_states": rn(g, 2, 1, 4, 8, 8), "encoder_hidden_states": rn(g, 2, 8, 8),
                       "timestep": steps(10.0, 900.0), "id_vit_hidden": [rn(g, 2, 2, 2)], "id_cond": rn(g, 2, 2)})
spec("CosmosTransformer3DModel",
     config=dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=12, num_layers=2, mlp_ratio=2,
                 text_embed_dim=16, adaln_lora_dim=4, max_size=(4, 32, 32), patch_size=(1, 2, 2),
                 rope_scale=(2.0, 1.0, 1.0), concat_padding_mask=False, extra_pos_embed_type="learnable"),
     inputs=lambda g: {"hidden_states": rn(g, 1, 4, 1, 16, 16), "timestep": steps(500.0),
                       "encoder_hidden_states": rn(g, 1, 12, 16), "attention_mask": torch.ones(1, 12), "fps": 30},
     notes="concat_padding_mask=False: resizing the padding mask needs torchvision, not installed")
spec("EasyAnimateTransformer3DModel",
     config=dict(attention_head_dim=16, num_attention_heads=2, in_channels=4, mmdit_layers=2, num_layers=2,
                 out_channels=4, patch_size=2, sample_height=60, sample_width=90, text_embed_dim=16, time_embed_dim=8,
                 time_position_encoding_type="3d_rope", timestep_activation_fn="silu"),
     inputs=lambda g: {"hidden_states": rn(g, 2, 4, 2, 16, 16), "timestep": steps(10.0, 900.0),
                       "encoder_hidden_states": rn(g, 2, 16, 16)})


def _helios_inputs(g):
    return {"hidden_states": rn(g, 1, 4, 2, 16, 16), "timestep": steps(300.0),
            "encoder_hidden_states": rn(g, 1, 12, 16),
            "indices_hidden_states": torch.ones(1, 2), "indices_latents_history_short": torch.ones(1, 1),
            "indices_latents_history_mid": torch.ones(1, 1), "indices_latents_history_long": torch.ones(1, 4),
            "latents_history_short": rn(g, 1, 4, 1, 16, 16), "latents_history_mid": rn(g, 1, 4, 1, 16, 16),
            "latents_history_long": rn(g, 1, 4, 4, 16, 16)}


spec("HeliosTransformer3DModel",
     config=dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
                 text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
                 qk_norm="rms_norm_across_heads", rope_dim=(4, 4, 4), has_multi_term_memory_patch=True,
                 guidance_cross_attn=True, zero_history_timestep=True, is_amplify_history=False),
     inputs=_helios_inputs)


def _hunyuan_dit_inputs(g):
    b = 2
    return {"hidden_states": rn(g, b, 4, 8, 8), "encoder_hidden_states": rn(g, b, 4, 8),
            "text_embedding_mask": torch.ones(b, 4), "encoder_hidden_states_t5": rn(g, b, 4, 8),
            "text_embedding_mask_t5": torch.ones(b, 4), "timestep": steps(10.0, 700.0),
            "image_meta_size": torch.tensor([[1024.0, 1024, 16, 16, 0, 0]] * b),
            "style": torch.zeros(b, dtype=torch.long), "image_rotary_emb": _hunyuan_dit_rope(4, 4, 8)}


def _hunyuan_dit_rope(h: int, w: int, head_dim: int):
    from diffusers.models.embeddings import get_2d_rotary_pos_embed

    return get_2d_rotary_pos_embed(head_dim, ((0, 0), (h, w)), (h, w))


spec("HunyuanDiT2DModel",
     config=dict(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
                 cross_attention_dim=8, cross_attention_dim_t5=8, pooled_projection_dim=4, hidden_size=16, text_len=4,
                 text_len_t5=4, activation_fn="gelu-approximate"),
     inputs=_hunyuan_dit_inputs)
_HUNYUAN_VIDEO = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
                      num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=True,
                      text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4), image_condition_type=None)


def _hunyuan_video_inputs(g, frames=2, size=8):
    mask = torch.ones(1, 12)
    mask[:, 9:] = 0
    return {"hidden_states": rn(g, 1, 4, frames, size, size), "timestep": steps(600.0),
            "encoder_hidden_states": rn(g, 1, 12, 16), "pooled_projections": rn(g, 1, 8),
            "encoder_attention_mask": mask, "guidance": steps(6000.0)}


spec("HunyuanVideoTransformer3DModel", config=_HUNYUAN_VIDEO, inputs=_hunyuan_video_inputs)


def _framepack_inputs(g):
    f, s = 3, 4
    d = _hunyuan_video_inputs(g, frames=f, size=s)
    d.update(image_embeds=rn(g, 1, 6, 16), indices_latents=torch.arange(f).float(),
             latents_clean=rn(g, 1, 4, f - 1, s, s), indices_latents_clean=torch.arange(f - 1).float(),
             latents_history_2x=rn(g, 1, 4, f - 1, s, s), indices_latents_history_2x=torch.arange(f - 1).float(),
             latents_history_4x=rn(g, 1, 4, (f - 1) * 4, s, s),
             indices_latents_history_4x=torch.arange((f - 1) * 4).float())
    return d


spec("HunyuanVideoFramepackTransformer3DModel",
     config=dict(_HUNYUAN_VIDEO, patch_size=2, has_image_proj=True, image_proj_dim=16, has_clean_x_embedder=True),
     inputs=_framepack_inputs)
spec("HunyuanVideo15Transformer3DModel",
     config=dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
                 num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=16,
                 text_embed_2_dim=8, image_embed_dim=12, rope_axes_dim=(2, 2, 4), target_size=16, task_type="t2v"),
     inputs=lambda g: {"hidden_states": rn(g, 1, 4, 1, 8, 8), "timestep": steps(0.5),
                       "encoder_hidden_states": rn(g, 1, 6, 16), "encoder_hidden_states_2": rn(g, 1, 4, 8),
                       "encoder_attention_mask": torch.ones(1, 6), "encoder_attention_mask_2": torch.ones(1, 4),
                       "image_embeds": torch.zeros(1, 3, 12)})


def _ideogram4_inputs(g, text=6, grid=2, c=8, llm=16):
    n = grid * grid
    seq = text + n
    hs = torch.zeros(1, seq, c)
    hs[:, text:] = rn(g, 1, n, c)
    ehs = torch.zeros(1, seq, llm)
    ehs[:, :text] = rn(g, 1, text, llm)
    pos = torch.zeros(1, seq, 3, dtype=torch.long)
    pos[:, :text] = torch.arange(text)[:, None]
    off = 65536  # IMAGE_POSITION_OFFSET of transformer_ideogram4
    pos[:, text:, 0] = off
    pos[:, text:, 1] = torch.arange(grid).repeat_interleave(grid) + off
    pos[:, text:, 2] = torch.arange(grid).repeat(grid) + off
    indicator = torch.full((1, seq), 2, dtype=torch.long)  # OUTPUT_IMAGE_INDICATOR
    indicator[:, :text] = 3  # LLM_TOKEN_INDICATOR
    return {"hidden_states": hs, "encoder_hidden_states": ehs, "timestep": steps(0.5), "position_ids": pos,
            "segment_ids": torch.ones(1, seq, dtype=torch.long), "indicator": indicator}


spec("Ideogram4Transformer2DModel",
     config=dict(in_channels=8, num_layers=2, attention_head_dim=8, num_attention_heads=2, intermediate_size=32,
                 adaln_dim=16, llm_features_dim=16, rope_theta=10_000, mrope_section=(2, 1, 1), norm_eps=1e-5),
     inputs=_ideogram4_inputs)
_JOY = dict(patch_size=[1, 2, 2], in_channels=16, hidden_size=32, num_attention_heads=2, text_dim=16, num_layers=2,
            rope_dim_list=[4, 6, 6], theta=256)
spec("JoyImageEditTransformer3DModel", config=_JOY,
     inputs=lambda g: {"hidden_states": rn(g, 1, 16, 1, 4, 4), "encoder_hidden_states": rn(g, 1, 12, 16),
                       "timestep": steps(0.5)})
spec("JoyImageEditPlusTransformer3DModel", config=_JOY,
     inputs=lambda g: {"hidden_states": rn(g, 1, 2, 16, 1, 2, 2), "encoder_hidden_states": rn(g, 1, 12, 16),
                       "timestep": steps(0.5), "shape_list": [[(1, 1, 1), (1, 1, 1)]]})


def _krea2_inputs(g, grid=4, text=6):
    pos = torch.zeros(text + grid * grid, 3)
    pos[text:, 1] = torch.arange(grid).repeat_interleave(grid)
    pos[text:, 2] = torch.arange(grid).repeat(grid)
    mask = torch.ones(1, text, dtype=torch.bool)
    mask[:, -1] = False
    return {"hidden_states": rn(g, 1, grid * grid, 8), "encoder_hidden_states": rn(g, 1, text, 2, 16),
            "timestep": steps(0.5), "position_ids": pos, "encoder_attention_mask": mask}


spec("Krea2Transformer2DModel",
     config=dict(in_channels=8, num_layers=2, attention_head_dim=8, num_attention_heads=2, num_key_value_heads=1,
                 intermediate_size=32, timestep_embed_dim=8, text_hidden_dim=16, num_text_layers=2,
                 text_num_attention_heads=2, text_num_key_value_heads=1, text_intermediate_size=16,
                 num_layerwise_text_blocks=1, num_refiner_text_blocks=1, axes_dims_rope=(4, 2, 2), rope_theta=1000.0,
                 norm_eps=1e-5),
     inputs=_krea2_inputs)
spec("LatteTransformer3DModel",
     config=dict(sample_size=8, num_layers=1, patch_size=2, attention_head_dim=4, num_attention_heads=2,
                 caption_channels=8, in_channels=4, cross_attention_dim=8, out_channels=8, attention_bias=True,
                 activation_fn="gelu-approximate", num_embeds_ada_norm=1000, norm_type="ada_norm_single",
                 norm_elementwise_affine=False, norm_eps=1e-6, video_length=2),
     inputs=lambda g: {"hidden_states": rn(g, 2, 4, 2, 8, 8), "encoder_hidden_states": rn(g, 2, 8, 8),
                       "timestep": torch.tensor([10, 700]), "enable_temporal_attentions": True})
spec("LongCatAudioDiTTransformer",
     config=dict(dit_dim=64, dit_depth=2, dit_heads=4, dit_text_dim=32, latent_dim=8, text_conv=False),
     inputs=lambda g: {"hidden_states": rn(g, 1, 16, 8), "encoder_hidden_states": rn(g, 1, 10, 32),
                       "encoder_attention_mask": torch.ones(1, 10, dtype=torch.bool),
                       "attention_mask": torch.ones(1, 16, dtype=torch.bool), "timestep": steps(0.3)})
spec("LongCatImageTransformer2DModel",
     config=dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                 num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8]),
     inputs=lambda g: {"hidden_states": rn(g, 1, 16, 4), "encoder_hidden_states": rn(g, 1, 12, 32),
                       "img_ids": _flux_img_ids(4, 4), "txt_ids": torch.zeros(12, 3), "timestep": steps(0.4)})
spec("LTXVideoTransformer3DModel",
     config=dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
                 num_layers=1, qk_norm="rms_norm_across_heads", caption_channels=16),
     inputs=lambda g: {"hidden_states": rn(g, 2, 2 * 8 * 8, 4), "encoder_hidden_states": rn(g, 2, 12, 16),
                       "timestep": steps(10.0, 900.0), "encoder_attention_mask": torch.ones(2, 12, dtype=torch.bool),
                       "num_frames": 2, "height": 8, "width": 8})
spec("LTX2VideoTransformer3DModel",
     config=dict(in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2,
                 attention_head_dim=8, cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4,
                 audio_num_attention_heads=2, audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2,
                 qk_norm="rms_norm_across_heads", caption_channels=16, rope_double_precision=False),
     inputs=lambda g: {"hidden_states": rn(g, 2, 2 * 8 * 8, 4), "audio_hidden_states": rn(g, 2, 9, 4),
                       "encoder_hidden_states": rn(g, 2, 12, 16), "audio_encoder_hidden_states": rn(g, 2, 12, 16),
                       "timestep": steps(300.0, 800.0), "encoder_attention_mask": torch.ones(2, 12, dtype=torch.bool),
                       "num_frames": 2, "height": 8, "width": 8, "audio_num_frames": 9, "fps": 25.0})


def _lumina_next_inputs(g):
    from diffusers.models.embeddings import get_2d_rotary_pos_embed_lumina

    mask = torch.ones(2, 12)
    mask[1, 8:] = 0
    return {"hidden_states": rn(g, 2, 4, 16, 16), "encoder_hidden_states": rn(g, 2, 12, 32),
            "timestep": steps(0.2, 0.9), "encoder_mask": mask,
            "image_rotary_emb": get_2d_rotary_pos_embed_lumina(8, 384, 384), "cross_attention_kwargs": {}}


spec("LuminaNextDiT2DModel",
     config=dict(sample_size=16, patch_size=2, in_channels=4, hidden_size=24, num_layers=2, num_attention_heads=3,
                 num_kv_heads=1, multiple_of=16, ffn_dim_multiplier=None, norm_eps=1e-5, learn_sigma=False,
                 qk_norm=True, cross_attention_dim=32, scaling_factor=1.0),
     inputs=_lumina_next_inputs)
spec("Lumina2Transformer2DModel",
     config=dict(sample_size=16, patch_size=2, in_channels=4, hidden_size=24, num_layers=2, num_refiner_layers=1,
                 num_attention_heads=3, num_kv_heads=1, multiple_of=2, ffn_dim_multiplier=None, norm_eps=1e-5,
                 scaling_factor=1.0, axes_dim_rope=(4, 2, 2), axes_lens=(128, 128, 128), cap_feat_dim=32),
     inputs=lambda g: {"hidden_states": rn(g, 2, 4, 16, 16), "encoder_hidden_states": rn(g, 2, 12, 32),
                       "timestep": steps(0.2, 0.9),
                       "encoder_attention_mask": torch.tensor([[True] * 12, [True] * 8 + [False] * 4])})


def _minimax_h3_inputs(g, text=4, audio=6, video=8, b=2):
    seq = text + audio + video
    ti, ai, vi = torch.arange(text), torch.arange(text, text + audio), torch.arange(text + audio, seq)
    tags = torch.empty(seq, dtype=torch.long)
    tags[ti], tags[ai], tags[vi] = 1, 2, 0  # 0 video, 1 text, 2 audio
    t_idx = torch.zeros(seq, dtype=torch.long)
    t_idx[ai] = 1
    pos = torch.zeros(seq, 3)
    pos[:, 0] = torch.arange(seq).float()
    pos[vi, 1] = (torch.arange(video) % 4).float()
    pos[vi, 2] = (torch.arange(video) % 2).float()
    return {"hidden_states": rn(g, b, video, 16), "audio_hidden_states": rn(g, b, audio, 6),
            "encoder_hidden_states": rn(g, b, text, 8), "timestep": steps(0.7, 0.3), "timestep_indices": t_idx,
            "token_tags": tags, "position_ids": pos, "video_indices": vi, "audio_indices": ai, "text_indices": ti}


spec("MiniMaxH3Transformer3DModel",
     config=dict(num_attention_heads=2, attention_head_dim=16, hidden_size=24, num_layers=2, num_refiner_layers=2,
                 ffn_dim=32, in_channels=4, audio_in_channels=6, patch_size=(1, 2, 2), text_dim=8, freq_dim=8,
                 time_embed_hidden_dim=24, time_embed_dim=16, rope_freq_dim=2),
     inputs=_minimax_h3_inputs)
spec("MiniMaxMusic3Transformer1DModel",
     config=dict(in_channels=8, condition_dim=16, num_layers=2, num_attention_heads=2, attention_head_dim=8,
                 ff_inner_dim=32, rotary_dim=4, fourier_embedding_dim=8),
     inputs=lambda g: {"hidden_states": rn(g, 1, 8, 24), "encoder_hidden_states": rn(g, 1, 24, 16),
                       "timestep": steps(0.5)})
spec("MochiTransformer3DModel",
     config=dict(patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=2, pooled_projection_dim=16,
                 in_channels=4, out_channels=None, qk_norm="rms_norm", text_embed_dim=16, time_embed_dim=4,
                 activation_fn="swiglu", max_sequence_length=16),
     inputs=lambda g: {"hidden_states": rn(g, 2, 4, 2, 8, 8), "encoder_hidden_states": rn(g, 2, 16, 16),
                       "timestep": steps(10.0, 900.0),
                       "encoder_attention_mask": torch.tensor([[True] * 16, [True] * 10 + [False] * 6])})
spec("MotifVideoTransformer3DModel",
     config=dict(in_channels=33, out_channels=16, num_attention_heads=2, attention_head_dim=12, num_layers=1,
                 num_single_layers=1, num_decoder_layers=0, mlp_ratio=4.0, patch_size=1, patch_size_t=1,
                 qk_norm="rms_norm", norm_type="layer_norm", text_embed_dim=32, image_embed_dim=4, rope_theta=256.0,
                 rope_axes_dim=(4, 4, 4), enable_text_cross_attention_dual=False,
                 enable_text_cross_attention_single=False),
     inputs=lambda g: {"hidden_states": rn(g, 1, 33, 3, 4, 4), "encoder_hidden_states": rn(g, 1, 12, 32),
                       "timestep": steps(500.0)})
spec("NucleusMoEImageTransformer2DModel",
     config=dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
                 num_attention_heads=4, joint_attention_dim=16, axes_dims_rope=(8, 4, 4), moe_enabled=False,
                 capacity_factors=[8.0, 8.0]),
     inputs=lambda g: {"hidden_states": rn(g, 1, 16, 16), "encoder_hidden_states": rn(g, 1, 8, 16),
                       "encoder_hidden_states_mask": torch.ones(1, 8, dtype=torch.long), "timestep": steps(0.5),
                       "img_shapes": [(1, 4, 4)]})
_NUCLEUS_MOE = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
                    num_attention_heads=4, joint_attention_dim=16, axes_dims_rope=(8, 4, 4), moe_enabled=True,
                    dense_moe_strategy="leave_first_block_dense", num_experts=4, moe_intermediate_dim=16,
                    capacity_factors=[1.0, 1.0])


def _nucleus_inputs(g):
    return {"hidden_states": rn(g, 1, 16, 16), "encoder_hidden_states": rn(g, 1, 8, 16),
            "encoder_hidden_states_mask": torch.ones(1, 8, dtype=torch.long), "timestep": steps(0.5),
            "img_shapes": [(1, 4, 4)]}




def _init_experts(model) -> None:
    """The packed expert weights are made with ``torch.empty`` and left for a checkpoint to fill: give
    them seeded values, or the run would read whatever the allocator returned (NaNs at times)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith(("gate_up_proj", "down_proj")) and p.dim() == 3:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


_MOE_NOTE = "expert weights (torch.empty in the model, left for a checkpoint) given seeded values"
spec("NucleusMoEImageTransformer2DModel[moe]", cls="NucleusMoEImageTransformer2DModel", config=_NUCLEUS_MOE,
     inputs=_nucleus_inputs, prepare=_init_experts, notes=_MOE_NOTE)
spec("NucleusMoEImageTransformer2DModel[moe,grouped_mm]", cls="NucleusMoEImageTransformer2DModel",
     config=dict(_NUCLEUS_MOE, use_grouped_mm=True), inputs=_nucleus_inputs, prepare=_init_experts, notes=_MOE_NOTE)


def _omnigen_inputs(g, b=2, c=4, s=8, text=24):
    n = text + 1 + s * s // 4
    return {"hidden_states": rn(g, b, c, s, s), "timestep": steps(0.3, 0.8), "input_ids": ri(g, 10, b, text),
            "input_img_latents": [rn(g, 1, c, s, s)], "input_image_sizes": {0: [[0, s * s // 4]]},
            "attention_mask": torch.ones(b, n, n), "position_ids": torch.arange(n).repeat(b, 1)}


spec("OmniGenTransformer2DModel",
     config=dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=4, intermediate_size=32, num_layers=2,
                 pad_token_id=0, vocab_size=1000, in_channels=4, time_step_dim=4,
                 rope_scaling={"long_factor": [1, 2], "short_factor": [1, 2]}),
     inputs=_omnigen_inputs)
spec("OvisImageTransformer2DModel",
     config=dict(patch_size=1, in_channels=4, out_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                 num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 4, 8)),
     inputs=lambda g: {"hidden_states": rn(g, 1, 16, 4), "encoder_hidden_states": rn(g, 1, 12, 32),
                       "img_ids": _flux_img_ids(4, 4), "txt_ids": torch.zeros(12, 3), "timestep": steps(0.4)})
spec("PRXTransformer2DModel",
     config=dict(in_channels=16, patch_size=2, context_in_dim=32, hidden_size=32, mlp_ratio=3.5, num_heads=2, depth=2,
                 axes_dim=[8, 8], theta=10_000),
     inputs=lambda g: {"hidden_states": rn(g, 1, 16, 8, 8), "encoder_hidden_states": rn(g, 1, 12, 32),
                       "timestep": steps(0.5)})
spec("SanaTransformer2DModel",
     config=dict(patch_size=1, in_channels=4, out_channels=4, num_layers=1, attention_head_dim=4, num_attention_heads=2,
                 num_cross_attention_heads=2, cross_attention_head_dim=4, cross_attention_dim=8, caption_channels=8,
                 sample_size=16),
     inputs=lambda g: {"hidden_states": rn(g, 2, 4, 16, 16), "encoder_hidden_states": rn(g, 2, 8, 8),
                       "timestep": steps(10.0, 900.0)})
spec("SanaVideoTransformer3DModel",
     config=dict(in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=12, num_layers=2,
                 num_cross_attention_heads=2, cross_attention_head_dim=12, cross_attention_dim=24, caption_channels=16,
                 mlp_ratio=2.5, dropout=0.0, attention_bias=False, sample_size=8, patch_size=(1, 2, 2),
                 norm_elementwise_affine=False, norm_eps=1e-6, qk_norm="rms_norm_across_heads", rope_max_seq_len=32),
     inputs=lambda g: {"hidden_states": rn(g, 1, 16, 2, 8, 8), "encoder_hidden_states": rn(g, 1, 12, 16),
                       "timestep": steps(400.0)})
spec("SkyReelsV2Transformer3DModel", config=_WAN,
     inputs=lambda g: {"hidden_states": rn(g, 1, 4, 2, 16, 16), "encoder_hidden_states": rn(g, 1, 12, 16),
                       "timestep": steps(700.0)})
spec("WanVACETransformer3DModel",
     config=dict(_WAN, in_channels=16, out_channels=16, text_dim=32, num_layers=4, vace_layers=[0, 2],
                 vace_in_channels=48),
     inputs=lambda g: {"hidden_states": rn(g, 1, 16, 2, 8, 8), "encoder_hidden_states": rn(g, 1, 12, 32),
                       "control_hidden_states": rn(g, 1, 48, 2, 8, 8), "timestep": steps(700.0)})
spec("WanTransformer3DModel[i2v]", cls="WanTransformer3DModel",
     config=dict(_WAN, in_channels=12, image_dim=16, added_kv_proj_dim=24),
     inputs=lambda g: {"hidden_states": rn(g, 1, 12, 2, 16, 16), "encoder_hidden_states": rn(g, 1, 12, 16),
                       "encoder_hidden_states_image": rn(g, 1, 10, 16), "timestep": steps(700.0)})
spec("WanAnimateTransformer3DModel",
     config=dict(_WAN, in_channels=12, latent_channels=4, image_dim=16,
                 motion_encoder_channel_sizes={"4": 16, "8": 16, "16": 16}, motion_encoder_size=16,
                 motion_style_dim=8, motion_dim=4, motion_encoder_dim=16, face_encoder_hidden_dim=16,
                 face_encoder_num_heads=2, inject_face_latents_blocks=2),
     inputs=lambda g: {"hidden_states": rn(g, 1, 12, 5, 8, 8), "timestep": steps(600.0),
                       "encoder_hidden_states": rn(g, 1, 12, 16), "encoder_hidden_states_image": rn(g, 1, 12, 16),
                       "pose_hidden_states": rn(g, 1, 4, 4, 8, 8), "face_pixel_values": rn(g, 1, 3, 13, 16, 16)})
spec("TransformerTemporalModel",
     config=dict(num_attention_heads=2, attention_head_dim=4, in_channels=4, num_layers=1, norm_num_groups=1),
     inputs=lambda g: {"hidden_states": rn(g, 4, 4, 8, 8), "num_frames": 2})
spec("ZImageTransformer2DModel",
     config=dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=16, n_layers=1, n_refiner_layers=1,
                 n_heads=1, n_kv_heads=2, qk_norm=True, cap_feat_dim=16, rope_theta=256.0, t_scale=1000.0,
                 axes_dims=[8, 4, 4], axes_lens=[256, 32, 32]),
     inputs=lambda g: {"x": [rn(g, 16, 1, 8, 8), rn(g, 16, 1, 8, 8)], "cap_feats": [rn(g, 12, 16), rn(g, 7, 16)],
                       "t": steps(0.3, 0.6)},
     grad_inputs=())
spec("PixArtTransformer2DModel",
     config=dict(sample_size=8, num_layers=1, patch_size=2, attention_head_dim=2, num_attention_heads=2, in_channels=4,
                 cross_attention_dim=8, out_channels=8, attention_bias=True, activation_fn="gelu-approximate",
                 num_embeds_ada_norm=8, norm_type="ada_norm_single", norm_elementwise_affine=False, norm_eps=1e-6,
                 use_additional_conditions=False, caption_channels=None),
     inputs=lambda g: {"hidden_states": rn(g, 2, 4, 8, 8), "timestep": torch.tensor([10, 700]),
                       "encoder_hidden_states": rn(g, 2, 8, 8),
                       "added_cond_kwargs": {"aspect_ratio": None, "resolution": None}})
spec("DiTTransformer2DModel",
     config=dict(in_channels=4, out_channels=8, activation_fn="gelu-approximate", num_attention_heads=2,
                 attention_head_dim=4, attention_bias=True, num_layers=1, norm_type="ada_norm_zero",
                 num_embeds_ada_norm=8, patch_size=2, sample_size=8),
     inputs=lambda g: {"hidden_states": rn(g, 2, 4, 8, 8), "timestep": torch.tensor([10, 700]),
                       "class_labels": torch.tensor([1, 3])})
spec("Transformer2DModel",
     config=dict(num_attention_heads=2, attention_head_dim=4, in_channels=8, num_layers=1, norm_num_groups=2,
                 cross_attention_dim=8),
     inputs=lambda g: {"hidden_states": rn(g, 2, 8, 8, 8), "encoder_hidden_states": rn(g, 2, 5, 8)})
spec("PriorTransformer",
     config=dict(num_attention_heads=2, attention_head_dim=4, num_layers=2, embedding_dim=8, num_embeddings=7,
                 additional_embeddings=4),
     inputs=lambda g: {"hidden_states": rn(g, 2, 8), "timestep": 2, "proj_embedding": rn(g, 2, 8),
                       "encoder_hidden_states": rn(g, 2, 7, 8)})
spec("AceStepTransformer1DModel",
     config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, in_channels=24, audio_acoustic_hidden_dim=8, patch_size=2,
                 rope_theta=10000.0, rms_norm_eps=1e-6, sliding_window=16),
     inputs=lambda g: {"hidden_states": rn(g, 2, 8, 8), "timestep": steps(0.3, 0.9), "timestep_r": steps(0.1, 0.5),
                       "encoder_hidden_states": rn(g, 2, 10, 32), "context_latents": rn(g, 2, 8, 16)})
spec("AllegroTransformer3DModel",
     config=dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, num_layers=1,
                 cross_attention_dim=16, sample_width=8, sample_height=8, sample_frames=8, caption_channels=8),
     inputs=lambda g: {"hidden_states": rn(g, 2, 4, 2, 8, 8), "encoder_hidden_states": rn(g, 2, 16, 8),
                       "timestep": torch.tensor([10, 700])})

# ---- more autoencoders ------------------------------------------------------------------------

spec("AsymmetricAutoencoderKL",
     config=dict(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 2,
                 down_block_out_channels=[4, 8], layers_per_down_block=1, up_block_types=["UpDecoderBlock2D"] * 2,
                 up_block_out_channels=[4, 8], layers_per_up_block=1, act_fn="silu", latent_channels=4,
                 norm_num_groups=2, sample_size=16, scaling_factor=0.18215),
     inputs=lambda g: {"sample": rn(g, 2, 3, 16, 16), "mask": (rn(g, 2, 1, 16, 16) > 0).float()})
spec("AutoencoderKLCosmos",
     config=dict(in_channels=3, out_channels=3, latent_channels=4, encoder_block_out_channels=(8, 8, 8, 8),
                 decode_block_out_channels=(8, 8, 8, 8), attention_resolutions=(8,), resolution=64, num_layers=2,
                 patch_size=4, patch_type="haar", scaling_factor=1.0, spatial_compression_ratio=4,
                 temporal_compression_ratio=4),
     inputs=_video(f=9, s=32))
spec("AutoencoderDC",
     config=dict(in_channels=3, latent_channels=4, attention_head_dim=2,
                 encoder_block_types=("ResBlock", "EfficientViTBlock"),
                 decoder_block_types=("ResBlock", "EfficientViTBlock"), encoder_block_out_channels=(8, 8),
                 decoder_block_out_channels=(8, 8), encoder_qkv_multiscales=((), (5,)),
                 decoder_qkv_multiscales=((), (5,)), encoder_layers_per_block=(1, 1), decoder_layers_per_block=[1, 1],
                 downsample_block_type="conv", upsample_block_type="interpolate", decoder_norm_types="rms_norm",
                 decoder_act_fns="silu", scaling_factor=0.41407),
     inputs=_image(s=16))
spec("AutoencoderKLHunyuanVideo",
     config=dict(in_channels=3, out_channels=3, latent_channels=4, down_block_types=("HunyuanVideoDownBlock3D",) * 4,
                 up_block_types=("HunyuanVideoUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), layers_per_block=1,
                 act_fn="silu", norm_num_groups=4, scaling_factor=0.476986, spatial_compression_ratio=8,
                 temporal_compression_ratio=4, mid_block_add_attention=True),
     inputs=_video(f=5, s=16))
spec("AutoencoderKLCogVideoX",
     config=dict(in_channels=3, out_channels=3, down_block_types=("CogVideoXDownBlock3D",) * 4,
                 up_block_types=("CogVideoXUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), latent_channels=4,
                 layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=4),
     inputs=_video(f=8, s=16))
spec("AutoencoderKLKVAE",
     config=dict(in_channels=3, channels=32, num_enc_blocks=1, num_dec_blocks=1, z_channels=4, double_z=True,
                 ch_mult=(1, 2), sample_size=16),
     inputs=_image(s=16))
spec("AutoencoderKLKVAEVideo",
     config=dict(ch=32, ch_mult=(1, 2), num_res_blocks=1, in_channels=3, out_ch=3, z_channels=4,
                 temporal_compress_times=2),
     inputs=_video(f=3, s=16))
spec("AutoencoderKLLTX2Audio",
     config=dict(in_channels=2, output_channels=2, latent_channels=4, base_channels=16, ch_mult=(1, 2, 4),
                 resolution=16, attn_resolutions=None, num_res_blocks=2, norm_type="pixel", causality_axis="height",
                 mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160, mel_bins=16, is_causal=True,
                 double_z=True),
     inputs=lambda g: {"sample": rn(g, 2, 2, 8, 16)})
spec("AutoencoderKLLTXVideo",
     config=dict(in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 8, 8, 8),
                 decoder_block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
                 decoder_layers_per_block=(1, 1, 1, 1, 1), spatio_temporal_scaling=(True, True, False, False),
                 decoder_spatio_temporal_scaling=(True, True, False, False),
                 decoder_inject_noise=(False,) * 5, upsample_residual=(False,) * 4,
                 upsample_factor=(1, 1, 1, 1), timestep_conditioning=False, patch_size=1, patch_size_t=1,
                 encoder_causal=True, decoder_causal=False),
     inputs=_video(f=9, s=16))
spec("AutoencoderKLLTXVideo[0.9.1]", cls="AutoencoderKLLTXVideo",
     config=dict(in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 8, 8, 8),
                 decoder_block_out_channels=(16, 32, 64), layers_per_block=(1, 1, 1, 1),
                 decoder_layers_per_block=(1, 1, 1, 1), spatio_temporal_scaling=(True, True, True, False),
                 decoder_spatio_temporal_scaling=(True, True, True), decoder_inject_noise=(False, False, False, False),
                 upsample_residual=(True, True, True), upsample_factor=(2, 2, 2), timestep_conditioning=True,
                 patch_size=1, patch_size_t=1, encoder_causal=True, decoder_causal=False),
     inputs=lambda g: {"sample": rn(g, 1, 3, 9, 16, 16), "temb": steps(0.05)},
     notes="decoder_inject_noise off: the injected noise comes from the device generator")
spec("AutoencoderKLLTX2Video",
     config=dict(in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 8, 8, 8),
                 decoder_block_out_channels=(16, 32, 64), layers_per_block=(1, 1, 1, 1, 1),
                 decoder_layers_per_block=(1, 1, 1, 1), spatio_temporal_scaling=(True, True, True, True),
                 decoder_spatio_temporal_scaling=(True, True, True), decoder_inject_noise=(False, False, False, False),
                 downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
                 upsample_residual=(True, True, True), upsample_factor=(2, 2, 2), timestep_conditioning=False,
                 patch_size=1, patch_size_t=1, encoder_causal=True, decoder_causal=False,
                 encoder_spatial_padding_mode="zeros", decoder_spatial_padding_mode="zeros"),
     inputs=_video(f=9, s=16))
spec("AutoencoderKLMagvit",
     config=dict(in_channels=3, latent_channels=4, out_channels=3, block_out_channels=[8, 8, 8, 8],
                 down_block_types=["SpatialDownBlock3D"] + ["SpatialTemporalDownBlock3D"] * 3,
                 up_block_types=["SpatialUpBlock3D"] + ["SpatialTemporalUpBlock3D"] * 3, layers_per_block=1,
                 norm_num_groups=8, spatial_group_norm=True),
     inputs=_video(f=9, s=16))
spec("AutoencoderKLMochi",
     config=dict(in_channels=15, out_channels=3, latent_channels=4, encoder_block_out_channels=(32, 32, 32, 32),
                 decoder_block_out_channels=(32, 32, 32, 32), layers_per_block=(1, 1, 1, 1, 1), act_fn="silu",
                 scaling_factor=1),
     inputs=_video(f=7, s=16))
spec("AutoencoderOobleck",
     config=dict(encoder_hidden_size=12, decoder_channels=12, decoder_input_channels=6, audio_channels=2,
                 downsampling_ratios=[2, 4], channel_multiples=[1, 2]),
     inputs=lambda g: {"sample": rn(g, 2, 2, 24), "sample_posterior": False})
spec("AutoencoderTiny",
     config=dict(in_channels=3, out_channels=3, encoder_block_out_channels=[8, 8], decoder_block_out_channels=[8, 8],
                 num_encoder_blocks=[1, 1], num_decoder_blocks=[1, 1]),
     inputs=_image(s=32))
spec("AutoencoderKLTemporalDecoder",
     config=dict(block_out_channels=[32, 64], in_channels=3, out_channels=3,
                 down_block_types=["DownEncoderBlock2D"] * 2, latent_channels=4, layers_per_block=1),
     inputs=lambda g: {"sample": rn(g, 3, 3, 16, 16), "num_frames": 3})
spec("VQModel",
     config=dict(block_out_channels=[8, 16], norm_num_groups=8, in_channels=3, out_channels=3,
                 down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
                 latent_channels=3),
     inputs=_image(s=16))
spec("ConsistencyDecoderVAE",
     config=dict(encoder_block_out_channels=[2, 4], encoder_in_channels=3, encoder_out_channels=4,
                 encoder_down_block_types=["DownEncoderBlock2D"] * 2, decoder_add_attention=False,
                 decoder_block_out_channels=[2, 4], decoder_down_block_types=["ResnetDownsampleBlock2D"] * 2,
                 decoder_downsample_padding=1, decoder_in_channels=7, decoder_layers_per_block=1,
                 decoder_norm_eps=1e-05, decoder_norm_num_groups=2, encoder_norm_num_groups=2,
                 decoder_num_train_timesteps=1024, decoder_out_channels=6,
                 decoder_resnet_time_scale_shift="scale_shift",
                 decoder_time_embedding_type="learned", decoder_up_block_types=["ResnetUpsampleBlock2D"] * 2,
                 scaling_factor=1, latent_channels=4),
     inputs=lambda g: {"sample": rn(g, 2, 3, 16, 16), "generator": torch.Generator().manual_seed(0)},
     notes="the decoder draws its noise from a CPU generator, the same on both sides")
spec("AutoencoderKLFlux2",
     config=dict(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
                 up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4, norm_num_groups=4,
                 sample_size=16),
     inputs=_image(s=16))
spec("AutoencoderKLHunyuanImage",
     config=dict(in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(32, 32, 32), layers_per_block=1,
                 spatial_compression_ratio=4, sample_size=16),
     inputs=_image(s=16))
spec("AutoencoderKLHunyuanImageRefiner",
     config=dict(in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 16, 16), layers_per_block=1,
                 spatial_compression_ratio=4, temporal_compression_ratio=2),
     inputs=_video(f=3, s=16))
spec("AutoencoderKLHunyuanVideo15",
     config=dict(in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 16, 16), layers_per_block=1,
                 spatial_compression_ratio=4, temporal_compression_ratio=2),
     inputs=_video(f=3, s=16))


def _allegro_tiles(model) -> None:
    """Allegro's VAE encodes and decodes only in tiles (its untiled encode raises): tiles of the whole
    tiny video, so one tile, no overlap."""
    model.enable_tiling()
    model.tile_overlap_t = model.tile_overlap_h = model.tile_overlap_w = 0
    model.kernel = model.stride = (8, 16, 16)


spec("AutoencoderKLAllegro",
     config=dict(block_out_channels=(8, 8, 8, 8), latent_channels=4, layers_per_block=1, norm_num_groups=4,
                 sample_size=16),
     inputs=_video(f=8, s=16), prepare=_allegro_tiles)
spec("AutoencoderKLQwenImage21",
     config=dict(base_dim=8, decoder_base_dim=8, z_dim=4, dim_mult=[1, 2, 2], num_res_blocks=1,
                 temperal_downsample=[False, True], latents_mean=[0.0] * 4, latents_std=[1.0] * 4, in_channels=3,
                 out_channels=3, scale_factor_temporal=2, scale_factor_spatial=4),
     inputs=lambda g: {"sample": rn(g, 2, 3, 1, 16, 16)})

# ---- control nets and adapters ----------------------------------------------------------------

_SD_CONTROLNET = dict(block_out_channels=(8, 16), norm_num_groups=4,
                      down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                      cross_attention_dim=16, attention_head_dim=4, in_channels=4, layers_per_block=1,
                      conditioning_embedding_out_channels=(8, 16))


def _sd_control_inputs(g, **extra):
    return {"sample": rn(g, 2, 4, 16, 16), "timestep": steps(10.0, 500.0), "encoder_hidden_states": rn(g, 2, 7, 16),
            "controlnet_cond": rn(g, 2, 3, 32, 32), **extra}


spec("ControlNetModel", config=_SD_CONTROLNET, inputs=_sd_control_inputs)
spec("ControlNetUnionModel",
     config=dict(_SD_CONTROLNET, num_control_type=3, num_trans_channel=8, num_trans_head=2, num_trans_layer=1,
                 num_proj_channel=8, addition_embed_type="text_time", addition_time_embed_dim=8,
                 projection_class_embeddings_input_dim=8 * 6 + 12),
     inputs=lambda g: _sd_control_inputs(g, controlnet_cond=[rn(g, 2, 3, 32, 32), rn(g, 2, 3, 32, 32)],
                                         control_type=torch.tensor([[1.0, 0, 1], [1, 0, 1]]), control_type_idx=[0, 2],
                                         added_cond_kwargs={"text_embeds": rn(g, 2, 12), "time_ids": rn(g, 2, 6)}),
     grad_inputs=("sample",))
spec("SparseControlNetModel",
     config=dict(block_out_channels=(8, 16), norm_num_groups=4,
                 down_block_types=("CrossAttnDownBlockMotion", "DownBlockMotion"), cross_attention_dim=16,
                 attention_head_dim=4, in_channels=4, conditioning_channels=4, layers_per_block=1,
                 conditioning_embedding_out_channels=(8, 16), motion_num_attention_heads=2, motion_max_seq_length=8),
     inputs=lambda g: {"sample": rn(g, 1, 4, 2, 16, 16), "timestep": steps(10.0),
                       "encoder_hidden_states": rn(g, 2, 7, 16),
                       "controlnet_cond": rn(g, 1, 4, 2, 16, 16),
                       "conditioning_mask": torch.tensor([1.0, 0.0]).view(1, 1, 2, 1, 1).expand(1, 1, 2, 16, 16)})
spec("UNetControlNetXSModel",
     config=dict(sample_size=16, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                 up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), block_out_channels=(4, 8), cross_attention_dim=8,
                 transformer_layers_per_block=1, num_attention_heads=2, norm_num_groups=4, upcast_attention=False,
                 ctrl_block_out_channels=[2, 4], ctrl_num_attention_heads=4, ctrl_max_norm_num_groups=2,
                 ctrl_conditioning_embedding_out_channels=(2, 2)),
     inputs=lambda g: {"sample": rn(g, 2, 4, 16, 16), "timestep": steps(10.0), "encoder_hidden_states": rn(g, 2, 4, 8),
                       "controlnet_cond": rn(g, 2, 3, 32, 32), "conditioning_scale": 1.0})
spec("FluxControlNetModel",
     config=dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                 num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8]),
     inputs=lambda g: {"hidden_states": rn(g, 1, 16, 4), "controlnet_cond": rn(g, 1, 16, 4),
                       "encoder_hidden_states": rn(g, 1, 8, 32), "pooled_projections": rn(g, 1, 32),
                       "timestep": steps(0.7), "img_ids": _flux_img_ids(4, 4), "txt_ids": torch.zeros(8, 3)})
spec("SD3ControlNetModel",
     config=dict(sample_size=16, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=4,
                 joint_attention_dim=32, caption_projection_dim=32, pooled_projection_dim=64, out_channels=4,
                 pos_embed_max_size=32),
     inputs=lambda g: {"hidden_states": rn(g, 2, 4, 16, 16), "controlnet_cond": rn(g, 2, 4, 16, 16),
                       "encoder_hidden_states": rn(g, 2, 10, 32), "pooled_projections": rn(g, 2, 64),
                       "timestep": steps(100.0, 900.0)})
spec("SanaControlNetModel",
     config=dict(patch_size=1, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=4, num_attention_heads=2,
                 num_cross_attention_heads=2, cross_attention_head_dim=4, cross_attention_dim=8, caption_channels=8,
                 sample_size=16),
     inputs=lambda g: {"hidden_states": rn(g, 2, 4, 16, 16), "encoder_hidden_states": rn(g, 2, 8, 8),
                       "timestep": steps(10.0, 900.0), "controlnet_cond": rn(g, 2, 4, 16, 16)})
spec("QwenImageControlNetModel",
     config=dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
                 num_attention_heads=4, joint_attention_dim=16, axes_dims_rope=(8, 4, 4)),
     inputs=lambda g: {"hidden_states": rn(g, 1, 16, 16), "controlnet_cond": rn(g, 1, 16, 16),
                       "encoder_hidden_states": rn(g, 1, 8, 16),
                       "encoder_hidden_states_mask": torch.ones(1, 8, dtype=torch.long), "timestep": steps(0.5),
                       "img_shapes": [(1, 4, 4)]})
spec("HunyuanDiT2DControlNetModel",
     config=dict(conditioning_channels=3, num_attention_heads=2, attention_head_dim=8, in_channels=4, patch_size=2,
                 sample_size=8, hidden_size=16, transformer_num_layers=6, cross_attention_dim=8,
                 cross_attention_dim_t5=8, pooled_projection_dim=4, text_len=4, text_len_t5=4),
     inputs=lambda g: {**_hunyuan_dit_inputs(g), "controlnet_cond": rn(g, 2, 4, 8, 8)})
spec("T2IAdapter", config=dict(in_channels=3, channels=[8, 16], num_res_blocks=1, downscale_factor=8),
     inputs=lambda g: {"x": rn(g, 2, 3, 32, 32)})
spec("T2IAdapter[light]", cls="T2IAdapter",
     config=dict(in_channels=3, channels=[8, 16], num_res_blocks=1, downscale_factor=8, adapter_type="light_adapter"),
     inputs=lambda g: {"x": rn(g, 2, 3, 32, 32)})

# ---- more UNets -------------------------------------------------------------------------------

spec("UNetMotionModel",
     config=dict(block_out_channels=(16, 32), norm_num_groups=16,
                 down_block_types=("CrossAttnDownBlockMotion", "DownBlockMotion"),
                 up_block_types=("UpBlockMotion", "CrossAttnUpBlockMotion"), cross_attention_dim=16,
                 num_attention_heads=2, out_channels=4, in_channels=4, layers_per_block=1, sample_size=16),
     inputs=lambda g: {"sample": rn(g, 1, 4, 3, 16, 16), "timestep": steps(10.0),
                       "encoder_hidden_states": rn(g, 3, 4, 16)})
spec("UNetSpatioTemporalConditionModel",
     config=dict(block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlockSpatioTemporal",
                                                                "DownBlockSpatioTemporal"),
                 up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"), cross_attention_dim=32,
                 num_attention_heads=8, out_channels=4, in_channels=4, layers_per_block=1, sample_size=16,
                 projection_class_embeddings_input_dim=8 * 3, addition_time_embed_dim=8),
     inputs=lambda g: {"sample": rn(g, 1, 2, 4, 16, 16), "timestep": steps(10.0),
                       "encoder_hidden_states": rn(g, 1, 1, 32),
                       "added_time_ids": torch.tensor([[6.0, 127.0, 0.02]])})
spec("I2VGenXLUNet",
     config=dict(sample_size=16, in_channels=4, out_channels=4, block_out_channels=(8, 16), layers_per_block=1,
                 norm_num_groups=4, cross_attention_dim=16, attention_head_dim=4, num_attention_heads=None,
                 down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
                 up_block_types=("UpBlock3D", "CrossAttnUpBlock3D")),
     inputs=lambda g: {"sample": rn(g, 1, 4, 2, 16, 16), "timestep": steps(10.0), "fps": torch.tensor([8]),
                       "image_latents": rn(g, 1, 4, 2, 16, 16), "image_embeddings": rn(g, 1, 16),
                       "encoder_hidden_states": rn(g, 1, 5, 16)})
spec("StableCascadeUNet",
     config=dict(in_channels=4, out_channels=4, timestep_ratio_embedding_dim=8, patch_size=1, conditioning_dim=16,
                 block_out_channels=(16, 32), num_attention_heads=(2, 2), down_num_layers_per_block=(1, 1),
                 up_num_layers_per_block=(1, 1), clip_text_pooled_in_channels=12, clip_seq=2, dropout=(0.0, 0.0)),
     inputs=lambda g: {"sample": rn(g, 2, 4, 8, 8), "timestep_ratio": steps(0.2, 0.8),
                       "clip_text_pooled": rn(g, 2, 1, 12)})
spec("UVit2DModel",
     config=dict(hidden_size=16, cond_embed_dim=8, micro_cond_encode_dim=2, micro_cond_embed_dim=10,
                 encoder_hidden_size=8, vocab_size=40, codebook_size=32, in_channels=8, block_out_channels=16,
                 num_res_blocks=1, block_num_heads=2, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                 sample_size=4),
     inputs=lambda g: {"input_ids": ri(g, 32, 2, 4, 4), "encoder_hidden_states": rn(g, 2, 6, 8),
                       "pooled_text_emb": rn(g, 2, 8), "micro_conds": rn(g, 2, 5)},
     grad_inputs=("encoder_hidden_states",))

# ---- more transformers and autoencoders -------------------------------------------------------


def _qwen21_inputs(g, text=4, h=2, w=2):
    n = h * w
    img_mask = torch.zeros(1, text + n // 4, dtype=torch.bool)
    img_mask[:, text:] = True  # one vision slot per 2x2 group of target latents, after the text
    return {"hidden_states": rn(g, 1, n, 4), "encoder_hidden_states": rn(g, 1, text, 8),
            "encoder_hidden_states_mask": torch.ones(1, text, dtype=torch.long), "timestep": steps(0.6),
            "img_shapes": [[(1, h, w)]], "img_mask": img_mask}


_QWEN21 = dict(patch_size=1, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=2,
               context_in_dim=8, mlp_ratio=2, axes_dims_rope=(4, 6, 6))


def _qwen21_sdpa(model) -> None:
    from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21AttnProcessor

    model.set_attn_processor(QwenImage21AttnProcessor())


spec("QwenImage21Transformer2DModel", config=_QWEN21, inputs=_qwen21_inputs)
spec("QwenImage21Transformer2DModel[sdpa]", cls="QwenImage21Transformer2DModel", config=_QWEN21,
     inputs=_qwen21_inputs, prepare=_qwen21_sdpa)


def _flux3_inputs(g):
    img_ids, txt_ids = _flux2_ids(1, 4, 4, 8)
    return {"hidden_states": rn(g, 1, 16, 8), "encoder_hidden_states": rn(g, 1, 8, 32), "timestep": steps(0.6),
            "img_ids": img_ids[0], "txt_ids": txt_ids[0]}


spec("Flux3Transformer2DModel",
     config=dict(in_channels=8, cond_in_channels=8, num_layers=1, num_single_layers=1, attention_head_dim=16,
                 num_attention_heads=2, joint_attention_dim=32, timestep_channels=32, axes_dims_rope=(4, 4, 4, 4)),
     inputs=_flux3_inputs)
spec("HunyuanImageTransformer2DModel",
     config=dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1,
                 num_single_layers=1, num_refiner_layers=1, patch_size=(1, 1), text_embed_dim=16, rope_axes_dim=(4, 4)),
     inputs=lambda g: {"hidden_states": rn(g, 1, 4, 8, 8), "timestep": steps(500.0),
                       "encoder_hidden_states": rn(g, 1, 10, 16),
                       "encoder_attention_mask": torch.tensor([[1] * 8 + [0] * 2])})
spec("StableAudioDiTModel",
     config=dict(sample_size=16, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
                 num_key_value_attention_heads=1, out_channels=4, cross_attention_dim=16, time_proj_dim=8,
                 global_states_input_dim=12, cross_attention_input_dim=16),
     inputs=lambda g: {"hidden_states": rn(g, 2, 4, 16), "timestep": steps(0.2, 0.7),
                       "encoder_hidden_states": rn(g, 2, 6, 16), "global_hidden_states": rn(g, 2, 1, 12),
                       "rotary_embedding": _stable_audio_rope(16 + 1, 8)})


def _stable_audio_rope(seq: int, head_dim: int):
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    return get_1d_rotary_pos_embed(head_dim // 2, seq, use_real=True, repeat_interleave_real=False)


spec("DreamLiteTransformer2DModel",
     config=dict(num_attention_heads=2, attention_head_dim=4, in_channels=8, num_layers=1, norm_num_groups=2,
                 cross_attention_dim=8),
     inputs=lambda g: {"hidden_states": rn(g, 2, 8, 8, 8), "encoder_hidden_states": rn(g, 2, 5, 8)})
spec("CLIPImageProjection", config=dict(hidden_size=16), inputs=lambda g: {"x": rn(g, 3, 16)})
spec("LongCatAudioDiTVae",
     config=dict(in_channels=1, channels=8, c_mults=[1, 2], strides=[2, 2], latent_dim=4, encoder_latent_dim=8,
                 downsampling_ratio=4),
     inputs=lambda g: {"sample": rn(g, 2, 1, 32)})
def _cosmos_control_inputs(g):
    return {"controls_latents": rn(g, 1, 16, 1, 16, 16), "latents": rn(g, 1, 16, 1, 16, 16), "timestep": steps(0.5),
            "encoder_hidden_states": (rn(g, 1, 12, 32), rn(g, 1, 4, 32)),
            "condition_mask": torch.ones(1, 1, 1, 16, 16), "conditioning_scale": 1.0}


spec("CosmosControlNetModel",
     config=dict(n_controlnet_blocks=2, in_channels=18, latent_channels=18, model_channels=32, num_attention_heads=2,
                 attention_head_dim=16, mlp_ratio=2, text_embed_dim=32, adaln_lora_dim=4, patch_size=(1, 2, 2),
                 max_size=(4, 32, 32), rope_scale=(2.0, 1.0, 1.0), extra_pos_embed_type=None, img_context_dim_in=32,
                 img_context_dim_out=32, use_crossattn_projection=False),
     inputs=_cosmos_control_inputs)

# ---- wrappers, heads, projections and vocoders ------------------------------------------------


def _two_controlnets() -> dict:
    from diffusers import ControlNetModel

    return {"controlnets": [ControlNetModel(**_SD_CONTROLNET), ControlNetModel(**_SD_CONTROLNET)]}


def _two_adapters() -> dict:
    from diffusers import T2IAdapter

    return {"adapters": [T2IAdapter(in_channels=3, channels=[8, 16], num_res_blocks=1, downscale_factor=8),
                         T2IAdapter(in_channels=3, channels=[8, 16], num_res_blocks=1, downscale_factor=8)]}


spec("MultiControlNetModel", config=_two_controlnets,
     inputs=lambda g: _sd_control_inputs(g, controlnet_cond=[rn(g, 2, 3, 32, 32), rn(g, 2, 3, 32, 32)],
                                         conditioning_scale=[1.0, 0.5]),
     grad_inputs=("sample",))
spec("MultiAdapter", config=_two_adapters,
     inputs=lambda g: {"xs": rn(g, 2, 3, 32, 32), "adapter_weights": [0.7, 0.3]})
spec("Ideogram4PromptEnhancerHead", config=dict(hidden_size=16, vocab_size=40),
     inputs=lambda g: {"hidden_states": rn(g, 2, 5, 16)})
_ACE_POOL = dict(hidden_size=32, intermediate_size=64, audio_acoustic_hidden_dim=8, pool_window_size=5,
                 num_attention_pooler_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                 sliding_window=16)
spec("AceStepAudioTokenDetokenizer", config=_ACE_POOL, inputs=lambda g: {"hidden_states": rn(g, 2, 3, 32)})
spec("AceStepAudioTokenizer", config=dict(_ACE_POOL, fsq_dim=32, fsq_input_levels=[8, 8, 8, 5, 5, 5]),
     inputs=lambda g: {"hidden_states": rn(g, 2, 3, 5, 8)})
spec("T5FilmDecoder",
     config=dict(input_dims=8, targets_length=16, d_model=32, num_layers=2, num_heads=4, d_kv=8, d_ff=64,
                 dropout_rate=0.0),
     inputs=lambda g: {"encodings_and_masks": [(rn(g, 2, 6, 32), torch.ones(2, 6, dtype=torch.bool)),
                                               (rn(g, 2, 4, 32), torch.tensor([[True] * 4, [True] * 2 + [False] * 2]))],
                       "decoder_input_tokens": rn(g, 2, 16, 8), "decoder_noise_time": steps(0.2, 0.7)},
     grad_inputs=("decoder_input_tokens",))
spec("ReduxImageEncoder", config=dict(redux_dim=16, txt_in_features=32), inputs=lambda g: {"x": rn(g, 2, 9, 16)})
spec("StableAudioProjectionModel", config=dict(text_encoder_dim=16, conditioning_dim=24, min_value=0, max_value=60),
     inputs=lambda g: {"text_hidden_states": rn(g, 2, 7, 16), "start_seconds": steps(0.0, 3.0),
                       "end_seconds": steps(10.0, 47.0)})
spec("AudioLDM2ProjectionModel",
     config=dict(text_encoder_dim=16, text_encoder_1_dim=12, langauge_model_dim=24),
     inputs=lambda g: {"hidden_states": rn(g, 2, 5, 16), "hidden_states_1": rn(g, 2, 7, 12),
                       "attention_mask": torch.ones(2, 5, dtype=torch.long),
                       "attention_mask_1": torch.tensor([[1] * 7, [1] * 4 + [0] * 3])})
spec("StableAudio3DurationEmbedder", config=dict(output_dim=16, fourier_dim=8),
     inputs=lambda g: {"seconds": steps(3.0, 120.0)})
spec("MiniMaxMusic3Vocoder",
     config=dict(latent_channels=8, decoder_input_dim=16, decoder_hidden_dim=16, upsampling_ratios=(2, 2)),
     inputs=lambda g: {"latents": rn(g, 2, 8, 12)})
spec("MMAudioVocoder",
     config=dict(num_mels=8, upsample_initial_channel=16, upsample_rates=(2, 2), upsample_kernel_sizes=(4, 4),
                 resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1, 3),)),
     inputs=lambda g: {"mel": rn(g, 2, 8, 10)})
spec("Kandinsky6SRLatentUpscalerBank",
     config=dict(in_channels=4, stage_channels=(16, 16, 8), num_pre_blocks=1, num_mid_blocks=1, num_post_blocks=1,
                 num_x2_adapter_blocks=1, scales=(2, 4)),
     inputs=lambda g: {"latents": rn(g, 1, 4, 2, 8, 8), "scale": 2})
