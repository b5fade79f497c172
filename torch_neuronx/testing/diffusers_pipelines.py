"""Tiny Diffusers pipelines built entirely in code: Stable Diffusion (1.x and XL), FLUX, Qwen-Image.

Every component comes from a config with random weights (``torch.manual_seed``), and the
tokenizers are byte-level BPE tokenizers without merges (one token per byte of UTF-8, so any
prompt and any prompt template tokenizes), made with the ``tokenizers`` library and wrapped in
``PreTrainedTokenizerFast``. Nothing is downloaded. The pipelines are small enough to run two
denoising steps in a second or two on CPU; ``run_pipeline`` runs one on a device and returns
its images, so that a run on ``neuron`` can be compared with the same run on CPU.

    pipe = tiny_pipeline("flux")            # on CPU
    images = run_pipeline(pipe, "neuron", output_type="np")
"""

from __future__ import annotations

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from typing import Any

import torch

PROMPTS = ["a red lighthouse on a cliff at dawn", "two cats asleep on a green sofa"]
KINDS = ("stable-diffusion", "stable-diffusion-xl", "flux", "qwen-image")
STEPS = 2
SIZE = 32  # image height and width in pixels
SPECIALS = ("<pad>", "<s>", "</s>")


def byte_tokenizer(model_max_length: int, *, bos_eos: bool = False, padding_side: str = "right"):
    """A byte-level BPE tokenizer with no merges: ids 0-255 stand for the 256 byte values, then <pad>,
    <s>, </s>.
    ``bos_eos`` wraps every sequence in <s> ... </s> (as CLIP's tokenizer does)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for tok in SPECIALS:
        vocab[tok] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if bos_eos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> $B </s>",
            special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=model_max_length, pad_token="<pad>",
                                   bos_token="<s>", eos_token="</s>", padding_side=padding_side)


VOCAB = 256 + len(SPECIALS)


def _clip_text_encoder(hidden: int = 32, max_len: int = 48, projection: int | None = None):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=37, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=max_len, bos_token_id=257, eos_token_id=258,
                         pad_token_id=256, projection_dim=projection or hidden)
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(cfg)


def _vae(latent_channels: int = 4):
    from diffusers import AutoencoderKL

    return AutoencoderKL(block_out_channels=[8, 16], in_channels=3, out_channels=3,
                         down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
                         latent_channels=latent_channels, norm_num_groups=4, layers_per_block=1, sample_size=SIZE)


def stable_diffusion():
    from diffusers import DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(block_out_channels=(8, 16), norm_num_groups=4, layers_per_block=1, sample_size=16,
                                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                                attention_head_dim=4, in_channels=4, out_channels=4)
    vae = _vae()
    text_encoder = _clip_text_encoder()
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                              set_alpha_to_one=False, steps_offset=1)
    return StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=byte_tokenizer(48, bos_eos=True),
                                   unet=unet, scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)


def stable_diffusion_xl():
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(block_out_channels=(8, 16), norm_num_groups=4, layers_per_block=1, sample_size=16,
                                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=64,
                                attention_head_dim=(2, 4), use_linear_projection=True,
                                transformer_layers_per_block=(1, 2),
                                addition_embed_type="text_time", addition_time_embed_dim=8,
                                projection_class_embeddings_input_dim=8 * 6 + 32, in_channels=4, out_channels=4)
    vae = _vae()
    text_encoder = _clip_text_encoder()
    text_encoder_2 = _clip_text_encoder(projection=32)
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                       steps_offset=1, timestep_spacing="leading")
    return StableDiffusionXLPipeline(vae=vae, text_encoder=text_encoder, text_encoder_2=text_encoder_2,
                                     tokenizer=byte_tokenizer(48, bos_eos=True),
                                     tokenizer_2=byte_tokenizer(48, bos_eos=True), unet=unet, scheduler=scheduler,
                                     force_zeros_for_empty_prompt=True)


def flux_transformer_config() -> dict:
    """The tiny FLUX transformer of ``flux()``: 2 double-stream and 2 single-stream blocks, 4 heads
    (so that 2-way tensor parallelism splits them evenly)."""
    return dict(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=8,
                num_attention_heads=4, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[2, 2, 4],
                guidance_embeds=False)


def flux():
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(**flux_transformer_config())
    vae = _vae(latent_channels=4)
    vae.register_to_config(shift_factor=0.0609, scaling_factor=1.5035)
    text_encoder = _clip_text_encoder()
    text_encoder_2 = T5EncoderModel(T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=37, num_layers=2,
                                             num_heads=4, pad_token_id=256, eos_token_id=258,
                                             relative_attention_num_buckets=8))
    return FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
                        tokenizer=byte_tokenizer(48, bos_eos=True), text_encoder_2=text_encoder_2,
                        tokenizer_2=byte_tokenizer(48), transformer=transformer)


def qwen_image_transformer_config() -> dict:
    return dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
                num_attention_heads=4, joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4))


def qwen_image():
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline
    from diffusers import QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(0)
    transformer = QwenImageTransformer2DModel(**qwen_image_transformer_config())
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1,
                                 temperal_downsample=[False, True], latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=16, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=257, eos_token_id=258, pad_token_id=256,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [1, 1, 2]}),
        vision_config=dict(depth=2, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=16),
        image_token_id=VOCAB + 1, video_token_id=VOCAB + 2, vision_start_token_id=VOCAB + 3,
        vision_end_token_id=VOCAB + 4)
    text_encoder = Qwen2_5_VLForConditionalGeneration(config)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
                                                base_image_seq_len=16, max_image_seq_len=256)
    return QwenImagePipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder,
                             tokenizer=byte_tokenizer(1024), transformer=transformer)


def tiny_pipeline(kind: str):
    """A tiny pipeline of ``kind`` (one of ``KINDS``) on CPU, float32, weights from seed 0."""
    builders = {"stable-diffusion": stable_diffusion, "stable-diffusion-xl": stable_diffusion_xl, "flux": flux,
                "qwen-image": qwen_image}
    if kind not in builders:
        raise ValueError(f"unknown pipeline {kind!r}; one of {', '.join(KINDS)}")
    pipe = builders[kind]()
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            component.eval()  # as from_pretrained leaves them: no dropout (T5's is 0.1)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def pipeline_kwargs(kind: str, output_type: str = "np", steps: int = STEPS) -> dict:
    """The call arguments: the prompts, two steps, a CPU generator seeded 0, the tiny image size."""
    kw: dict[str, Any] = dict(prompt=PROMPTS, num_inference_steps=steps, height=SIZE, width=SIZE,
                              generator=torch.Generator("cpu").manual_seed(0), output_type=output_type)
    if kind == "flux":
        kw.update(guidance_scale=3.5, max_sequence_length=48)
    elif kind == "qwen-image":
        kw.update(true_cfg_scale=4.0, negative_prompt=[" ", " "])
    return kw


def run_pipeline(pipe, device: str | torch.device, output_type: str = "np", kind: str | None = None,
                 steps: int = STEPS, copy_first: bool = True):
    """Runs ``pipe`` (a copy of it, unless ``copy_first=False``) on ``device`` and returns its images
    (a numpy array for ``np``, a tensor for ``pt``)."""
    kind = kind or _kind_of(pipe)
    if copy_first:
        pipe = copy.deepcopy(pipe)
    pipe.to(device)
    with torch.no_grad():
        out = pipe(**pipeline_kwargs(kind, output_type, steps))
    return out.images


def _kind_of(pipe) -> str:
    name = type(pipe).__name__
    if name.startswith("StableDiffusionXL"):
        return "stable-diffusion-xl"
    if name.startswith("StableDiffusion"):
        return "stable-diffusion"
    if name.startswith("Flux"):
        return "flux"
    if name.startswith("QwenImage"):
        return "qwen-image"
    raise ValueError(f"not a pipeline of this module: {name}")
