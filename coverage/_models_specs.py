"""What the Hugging Face sweep's ``models`` population (``hf_sweep.py --population models``)
runs for each entry of Transformers' ``MODEL_MAPPING_NAMES``: the task head the family is used
with, its tiny config, and its inputs.

``task_of(model_type)`` picks the head from the library's task mappings in ``TASKS`` order
(sequence-to-sequence and multimodal generation first, then masked LM before causal LM, so
that an encoder is tested as the encoder it is, then the audio and vision heads); a family
with none of these heads runs as its base model. ``make_inputs`` builds the inputs from the
model's forward signature and its config, per modality: token ids with a padded row, images of
the config's size and channels, raw audio or filter-bank features, video frames, the image or
audio placeholder tokens a multimodal model expects (as many as its encoder produces), and the
labels of the task. ``SPECS`` holds what one family needs beyond that, each with its reason.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from _tiny_configs import BATCH, NEW_TOKENS, PAD, SEQ, Override, make_batches, special_ids, vocab_size
TARGET_LEN = 8  # decoder labels of the sequence-to-sequence tasks
AUDIO_SAMPLES = 4000  # raw audio: a quarter second at 16 kHz
AUDIO_FRAMES = 64  # filter-bank frames when the config does not fix them

# (task, mapping of model type -> head class, or None for the base model). The first mapping
# that has the model type wins.
TASKS: tuple[tuple[str, str | None], ...] = (
    ("seq2seq-lm", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    ("speech-seq2seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
    ("image-text-to-text", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"),
    ("multimodal-lm", "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES"),
    ("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    ("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("ctc", "MODEL_FOR_CTC_MAPPING_NAMES"),
    ("contrastive", None),  # a base model that computes its own contrastive loss (CLIP and kin)
    ("audio-classification", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES"),
    ("image-classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    ("video-classification", "MODEL_FOR_VIDEO_CLASSIFICATION_MAPPING_NAMES"),
    ("object-detection", "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES"),
    ("semantic-segmentation", "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES"),
    ("universal-segmentation", "MODEL_FOR_UNIVERSAL_SEGMENTATION_MAPPING_NAMES"),
    ("depth-estimation", "MODEL_FOR_DEPTH_ESTIMATION_MAPPING_NAMES"),
    ("base", "MODEL_MAPPING_NAMES"),
)
TEXT_GENERATION = ("seq2seq-lm", "speech-seq2seq", "image-text-to-text", "multimodal-lm", "causal-lm")
LM_TASKS = TEXT_GENERATION + ("masked-lm",)


@dataclass
class Spec:
    """What one family needs beyond the generic rules. ``config``: the tiny-config override
    (``changes`` with dotted keys, ``base`` for the default config itself); ``task``: the head
    to use instead of ``task_of``'s choice; ``inputs(ctx)``: returns entries to add to (or, when
    None, remove from) the generic inputs; ``unrunnable``: why the CPU reference cannot run here
    (a missing package or a declared library defect), checked by actually failing: the CPU error
    must contain ``unrunnable_match``, and a CPU forward that runs makes the declaration a failure;
    ``labels(ctx)``: the task's labels when the generic ones do not fit (replaces them);
    ``generate``: False when the head's ``generate`` is not the text generation this sweep
    compares; ``call(model, inputs)``: the family's computation when it is not ``model(**inputs)``
    (a model without a forward, a tracker that runs on a session), returning its outputs."""

    reason: str
    config: Override = field(default_factory=lambda: Override(""))
    task: str | None = None
    inputs: Callable[["Ctx"], dict] | None = None
    unrunnable: str = ""
    unrunnable_match: str = ""
    labels: Callable[["Ctx"], dict] | None = None
    generate: bool = True
    call: Callable[[Any, dict], Any] | None = None


def _mapping(name: str) -> dict:
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, name)


def architectures() -> list[str]:
    """Every model type of ``MODEL_MAPPING_NAMES``, in the mapping's order."""
    return list(_mapping("MODEL_MAPPING_NAMES"))


def _class(name: str):
    import transformers

    return getattr(transformers, name)


def _base_has_return_loss(model_type: str) -> bool:
    try:
        cls = _class(_mapping("MODEL_MAPPING_NAMES")[model_type])
    except Exception:
        return False
    return "return_loss" in inspect.signature(cls.forward).parameters


def task_of(model_type: str) -> tuple[str, str]:
    """``(task, head class name)`` for ``model_type``."""
    spec = SPECS.get(model_type)
    forced = spec.task if spec is not None else None
    for task, mapping in TASKS:
        if forced is not None and task != forced:
            continue
        if mapping is None:
            if task == "contrastive" and (forced == task or _base_has_return_loss(model_type)):
                return task, _mapping("MODEL_MAPPING_NAMES")[model_type]
            continue
        names = _mapping(mapping)
        if model_type in names:
            cls = names[model_type]
            return task, (cls[0] if isinstance(cls, (list, tuple)) else cls)
    raise KeyError(f"{model_type}: no head for task {forced}")


# ---- building -----------------------------------------------------------------------------------

# Families whose multimodal RoPE splits each head's rotary half into (time, height, width)
# sections with a default sized for the checkpoints' head dim: ``_fit_mrope`` resizes them.
MROPE = ("qwen2_vl", "qwen2_5_vl", "glm4v", "glm4v_moe", "glm46v", "glmga", "glm_image", "glm_ocr", "paddleocr_vl",
         "qwen2_5_omni", "qwen2_5_omni_thinker")


def _fit_mrope(model) -> None:
    """Sections in the same proportions (1/4, 3/8, 3/8) that fill the tiny rotary half (the
    length of the rotary embedding's ``inv_freq``), in each rotary module and in its config."""
    for m in model.modules():
        sections, inv_freq = getattr(m, "mrope_section", None), getattr(m, "inv_freq", None)
        if not isinstance(sections, list) or not isinstance(inv_freq, torch.Tensor):
            continue
        half = inv_freq.numel()
        if sum(sections) != half:
            m.mrope_section = [half // 4, 3 * half // 8, half - half // 4 - 3 * half // 8]
            rope = getattr(getattr(m, "config", None), "rope_parameters", None)
            if isinstance(rope, dict):
                rope["mrope_section"] = list(m.mrope_section)


def tiny_config(model_type: str, task: str):
    from _tiny_configs import tiny_config as _tiny

    spec = SPECS.get(model_type)
    config = _tiny(model_type, decoder=(task == "causal-lm"), modalities=True,
                   extra=spec.config if spec is not None else None)
    if getattr(config, "image_grid_pinpoints", None) and getattr(config, "vision_config", None) is not None:
        # "any resolution" (LLaVA-NeXT and kin): one tile of the tiny image size besides the base image
        side = image_side(config.vision_config)[0]
        config.image_grid_pinpoints = [[side, side]]
    return config


def build(model_type: str):
    """``(model, config, task)``: the tiny float32 model with the family's head on CPU, weights
    from ``torch.manual_seed(0)``."""
    from _tiny_configs import OVERRIDES

    task, cls_name = task_of(model_type)
    config = tiny_config(model_type, task)
    override = OVERRIDES.get(model_type)
    if task == "causal-lm" and override is not None and override.build_from:
        config = getattr(config, override.build_from)
    if task in ("seq2seq-lm", "speech-seq2seq") and _get(config, "decoder_start_token_id") is None:
        # The default configs of some families (T5 and kin) leave the decoder's start token to
        # the checkpoints; labels are shifted right behind it, so the training loss needs one.
        start = _get(config, "pad_token_id")
        config.decoder_start_token_id = start if isinstance(start, int) else 0
    if task in ("seq2seq-lm", "speech-seq2seq") and getattr(config, "is_encoder_decoder", False) \
            and _get(config, "pad_token_id") is None:
        config.pad_token_id = 0  # shifting labels right fills with it (Moonshine)
    cls = _class(cls_name)
    torch.manual_seed(0)
    model = cls._from_config(config, dtype=torch.float32)
    if model_type.removesuffix("_text") in MROPE:
        _fit_mrope(model)
    return model.float(), config, task


# ---- inputs -------------------------------------------------------------------------------------

@dataclass
class Ctx:
    """What an input builder sees."""

    model_type: str
    model: Any
    config: Any
    task: str
    params: dict  # the forward signature's parameters
    g: torch.Generator
    batch: dict = field(default_factory=dict)  # the inputs built so far

    def sub(self, *names: str):
        """The first nested config of ``names`` the config has, else the config itself."""
        for n in names:
            c = getattr(self.config, n, None)
            if c is not None and not isinstance(c, (int, float, str, bool, list, dict)):
                return c
        return self.config

    def randn(self, *shape) -> torch.Tensor:
        return torch.randn(*shape, generator=self.g)

    def randint(self, low: int, high: int, shape) -> torch.Tensor:
        return torch.randint(low, high, tuple(shape), generator=self.g)


def _get(config, *names, default=None):
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return default


def _special_ids(config) -> set[int]:
    return special_ids(config)


def text_vocab(model, config) -> int:
    try:
        return vocab_size(model, config)
    except (ValueError, AttributeError, NotImplementedError):  # no single input embedding (dual encoders)
        return int(_get(config, "vocab_size", default=256))


def ordinary_ids(ctx: Ctx, shape, vocab: int | None = None) -> torch.Tensor:
    """Random token ids that are none of the config's special ids."""
    vocab = vocab if vocab is not None else text_vocab(ctx.model, ctx.config)
    specials = _special_ids(ctx.config)
    ordinary = torch.tensor([i for i in range(vocab) if i not in specials] or list(range(vocab)))
    return ordinary[torch.randint(0, len(ordinary), tuple(shape), generator=ctx.g)]


def pad_id(ctx: Ctx, vocab: int) -> int:
    try:
        text = ctx.config.get_text_config(decoder=True)
    except Exception:
        text = ctx.config
    p = _get(text, "pad_token_id")
    if p is None:
        p = _get(ctx.config, "pad_token_id")
    return p if isinstance(p, int) and 0 <= p < vocab else 0


def _text(ctx: Ctx, seq: int = SEQ, pad: bool = True) -> dict:
    vocab = text_vocab(ctx.model, ctx.config)
    ids = ordinary_ids(ctx, (BATCH, seq), vocab)
    out = {"input_ids": ids}
    if "attention_mask" in ctx.params:
        mask = torch.ones_like(ids)
        if pad:
            mask[1, -PAD:] = 0
            ids[1, -PAD:] = pad_id(ctx, vocab)
        out["attention_mask"] = mask
    return out


def image_config(ctx: Ctx):
    return ctx.sub("vision_config", "backbone_config", "vision_encoder_config", "image_config")


def image_side(c) -> tuple[int, int]:
    size = _get(c, "image_size", "img_size", "input_size", default=32)
    if isinstance(size, (list, tuple)):
        return int(size[0]), int(size[-1])
    if isinstance(size, dict):
        return int(size.get("height", 32)), int(size.get("width", 32))
    return int(size), int(size)


def _pixels(ctx: Ctx, c=None, batch: int = BATCH) -> torch.Tensor:
    c = c if c is not None else image_config(ctx)
    channels = _get(c, "num_channels", "in_channels", "input_channels", default=3)
    h, w = image_side(c)
    return ctx.randn(batch, channels, h, w)


GRID_KEYS = ("image_grid_thw", "grid_thw")


def _grid_images(ctx: Ctx, batch: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Images as the Qwen2-VL family's vision towers take them: ``(patches, channels x temporal
    patch x patch x patch)`` flattened patches of every image, and each image's ``(t, h, w)``
    grid in patches; here one frame of ``2 x merge`` patches a side (``merge``: how many patches
    a side are merged into one token)."""
    c = image_config(ctx)
    patch = _get(c, "patch_size", default=14)
    patch = patch[0] if isinstance(patch, (list, tuple)) else patch
    temporal = _get(c, "temporal_patch_size", "patch_temporal", default=1)
    merge = _get(c, "spatial_merge_size", "merge_size", "merge_kernel_size", default=1)
    merge = merge[0] if isinstance(merge, (list, tuple)) else merge
    channels = _get(c, "in_channels", "num_channels", "in_chans", default=3)
    side = 2 * merge
    grid = torch.tensor([[1, side, side]] * batch)
    return ctx.randn(batch * side * side, channels * temporal * patch * patch), grid


def _video(ctx: Ctx) -> torch.Tensor:
    c = image_config(ctx)
    frames = _get(c, "num_frames", "frames_per_clip", default=4)
    channels = _get(c, "num_channels", default=3)
    h, w = image_side(c)
    return ctx.randn(BATCH, frames, channels, h, w)


def audio_config(ctx: Ctx):
    return ctx.sub("audio_config", "speech_config", "encoder_config", "audio_encoder_config", "asr_config")


def _input_values(ctx: Ctx) -> torch.Tensor:
    """Raw audio: (batch, samples), or (batch, channels, samples) for the codecs (a config with
    codebooks) and the encoders that take a channel axis (a padding mask)."""
    c = audio_config(ctx)
    channels = _get(c, "audio_channels", "channels", "num_channels", default=1)
    codec = _get(c, "codebook_size", "n_codebooks") is not None and "input_features" not in ctx.params
    if ctx.model_type in CHANNEL_AXIS_AUDIO or codec or ("padding_mask" in ctx.params and isinstance(channels, int)):
        return ctx.randn(BATCH, channels if isinstance(channels, int) else 1, AUDIO_SAMPLES)
    return ctx.randn(BATCH, AUDIO_SAMPLES)


def _input_features(ctx: Ctx) -> torch.Tensor | None:
    """Filter-bank features: (batch, mel bins, frames) for Whisper-style encoders (those with a
    fixed input length, ``max_source_positions``: twice as many frames), else (batch, frames,
    features). None when the config names no feature size (a tower the family does not have)."""
    c = audio_config(ctx)
    if _get(c, "input_feat_per_channel") is not None:  # Speech2Text
        return ctx.randn(BATCH, AUDIO_FRAMES, c.input_feat_per_channel * _get(c, "input_channels", default=1))
    mel = _get(c, "num_mel_bins", "n_mels", "num_mels")
    src = _get(c, "max_source_positions")
    window = _get(c, "n_window")  # encoders that attend in windows of 2 x n_window frames: a whole number of them
    if mel is not None and (src is not None or ctx.model_type in MEL_FIRST) and ctx.model_type not in FRAMES_FIRST:
        frames = 2 * src if src is not None else AUDIO_FRAMES
        if isinstance(window, int):
            frames = -(-frames // (2 * window)) * 2 * window
        return ctx.randn(BATCH, mel, frames)
    stacked = _get(c, "num_stacked_frames")  # low frame rate encoders: that many frames stacked per step
    size = _get(c, "input_dim", default=mel * stacked if mel is not None and isinstance(stacked, int) else mel)
    size = size if size is not None else _get(c, "feature_projection_input_dim", "feature_size", "input_feature_size")
    return ctx.randn(BATCH, AUDIO_FRAMES, size) if isinstance(size, int) else None


# Families whose raw audio has a channel axis though their forward takes no padding mask.
CHANNEL_AXIS_AUDIO: set[str] = {"vibevoice_acoustic_tokenizer"}
# Exceptions to the rule of ``_input_features``: (batch, mel bins, frames) without a fixed
# input length, and (batch, frames, mel bins) with one.
MEL_FIRST = {"glmasr", "glmasr_encoder", "voxtral_realtime", "voxtral_realtime_encoder", "qwen3_asr", "qwen3_asr_encoder"}
FRAMES_FIRST: set[str] = set()


def _labels(ctx: Ctx, out: dict) -> None:
    task, c = ctx.task, ctx.config
    decoder_only = task in ("seq2seq-lm", "speech-seq2seq") and not getattr(c, "is_encoder_decoder", False)
    if task in ("masked-lm", "causal-lm", "image-text-to-text", "multimodal-lm") or decoder_only:
        # a sequence-to-sequence head that is decoder-only (audio LLMs) is trained as a causal LM
        labels = out["input_ids"].clone()
        if "attention_mask" in out:
            labels[out["attention_mask"] == 0] = -100
        for k in ("image_token_id", "image_token_index", "video_token_id", "audio_token_id", "audio_token_index"):
            v = _get(c, k)
            if isinstance(v, int):
                labels[labels == v] = -100
        out["labels"] = labels
    elif task in ("seq2seq-lm", "speech-seq2seq"):
        vocab = text_vocab(ctx.model, c)
        out["labels"] = ordinary_ids(ctx, (BATCH, TARGET_LEN), vocab)
    elif task == "ctc":
        if "attention_mask" in ctx.params and "attention_mask" not in out:  # the loss reads the input lengths
            audio = out.get("input_values", out.get("input_features"))
            out["attention_mask"] = torch.ones(audio.shape[:2], dtype=torch.long)
        vocab = _get(c, "vocab_size", default=32)
        labels = ctx.randint(1, vocab, (BATCH, 4))
        labels[1, -1] = -100
        out["labels"] = labels
    elif task in ("audio-classification", "image-classification", "video-classification"):
        out["labels"] = ctx.randint(0, c.num_labels, (BATCH,))
    elif task == "object-detection":
        out["labels"] = [{"class_labels": ctx.randint(0, c.num_labels, (2,)),
                          "boxes": torch.cat([0.25 + 0.5 * torch.rand(2, 2, generator=ctx.g),
                                              0.1 + 0.2 * torch.rand(2, 2, generator=ctx.g)], dim=1)}
                         for _ in range(BATCH)]
    elif task == "semantic-segmentation":
        h, w = out["pixel_values"].shape[-2:]
        out["labels"] = ctx.randint(0, c.num_labels, (BATCH, h, w))
    elif task == "universal-segmentation":
        h, w = out["pixel_values"].shape[-2:]
        out["mask_labels"] = [(torch.rand(2, h, w, generator=ctx.g) > 0.5).float() for _ in range(BATCH)]
        out["class_labels"] = [ctx.randint(0, c.num_labels, (2,)) for _ in range(BATCH)]
    elif task == "depth-estimation":
        h, w = out["pixel_values"].shape[-2:]
        out["labels"] = torch.rand(BATCH, h, w, generator=ctx.g) + 0.5
    elif task == "contrastive":
        out["return_loss"] = True


def _token_id(config, *names: str) -> int | None:
    """The first of the placeholder token ids ``names`` the config (or its text config) sets."""
    for src in (config, getattr(config, "text_config", None)):
        v = _get(src, *names) if src is not None else None
        if isinstance(v, int):
            return v
    return None


def _image_token_id(config) -> int | None:
    return _token_id(config, "image_token_id", "image_token_index")


def image_features_count(ctx: Ctx, images: dict) -> list[int]:
    """How many placeholder tokens each image of ``images`` takes: the rows of the features the
    model's own ``get_image_features`` returns for them."""
    fn = getattr(ctx.model, "get_image_features", None) or getattr(getattr(ctx.model, "model", None),
                                                                   "get_image_features")
    sig = inspect.signature(fn).parameters
    if "image_sizes" in sig and "image_sizes" not in images and "image_sizes" in ctx.params:
        images["image_sizes"] = torch.tensor([list(images["pixel_values"].shape[-2:])] * BATCH)
    kwargs = {k: v for k, v in {**ctx.batch, **images}.items() if k in sig}
    with torch.no_grad():
        out = fn(**kwargs)
    feats = getattr(out, "pooler_output", None)
    if feats is None:  # an output without pooled features: its last hidden state is what is spliced in
        feats = getattr(out, "last_hidden_state", None)
    if feats is None and getattr(out, "deepstack_features", None):
        # images only injected into decoder layers (Granite 4 Vision): (layer, per-image features) pairs
        feats = out.deepstack_features[0][1]
    if feats is None:
        feats = out[0] if isinstance(out, (tuple, list)) and not isinstance(out[0], torch.Tensor) else out
    if isinstance(feats, torch.Tensor):
        if feats.dim() == 3:
            return [feats.shape[1]] * feats.shape[0]
        total = feats.shape[0]
        return [total // BATCH] * BATCH
    rows = [t.numel() // t.shape[-1] for t in feats]
    if len(rows) == BATCH:
        return rows
    total = sum(rows)
    return [total // BATCH] * BATCH


def _with_placeholders(ctx: Ctx, token: int, counts: list[int], text_len: int = SEQ // 2) -> dict:
    """Token ids per row: ``counts[row]`` placeholder tokens, then ordinary text; no padding
    (right-padding a prompt would put padding inside what generate continues)."""
    vocab = text_vocab(ctx.model, ctx.config)
    rows = []
    width = max(counts) + text_len
    for n in counts:
        text = ordinary_ids(ctx, (width - n,), vocab)
        rows.append(torch.cat([torch.full((n,), token, dtype=torch.long), text]))
    ids = torch.stack(rows)
    out = {"input_ids": ids}
    if "attention_mask" in ctx.params:
        out["attention_mask"] = torch.ones_like(ids)
    return out


# Families whose pixel values have an images-per-sample axis: (batch, images, channels, h, w).
IMAGES_AXIS = {"idefics", "idefics2", "idefics3", "smolvlm", "granite_docling"}


def _multimodal(ctx: Ctx) -> dict:
    if "vision_config" in type(ctx.config).sub_configs and getattr(ctx.config, "vision_config", None) is None:
        return _text(ctx, pad=False)  # the default config has no vision tower (Gemma 4): a text model
    spec = SPECS.get(ctx.model_type)
    if spec is not None and spec.inputs is not None:  # family inputs the image features depend on
        ctx.batch = spec.inputs(ctx)
        if {"input_ids", "pixel_values"} <= ctx.batch.keys():  # the family builds its images and prompt itself
            return {}
    if "pixel_values" not in ctx.params and _features_fn(ctx.model, "get_image_features") is None:
        return _text(ctx, pad=False)  # a head that takes images only as encoder outputs computed elsewhere
    if "image_grid_thw" in ctx.params:
        pixels, grid = _grid_images(ctx)
        images = {"pixel_values": pixels, "image_grid_thw": grid}
    elif getattr(ctx.config, "image_grid_pinpoints", None):  # the base image and one tile, as (batch, 2, c, h, w)
        pixels = torch.stack([_pixels(ctx), _pixels(ctx)], dim=1)
        images = {"pixel_values": pixels, "image_sizes": torch.tensor([list(pixels.shape[-2:])] * BATCH)}
    elif ctx.model_type in IMAGES_AXIS:
        images = {"pixel_values": _pixels(ctx).unsqueeze(1)}
    elif "spatial_shapes" in ctx.params:  # a NaFlex tower (SigLIP 2): patch sequences with their grid
        images = _patch_sequence(ctx)
    else:
        images = {"pixel_values": _pixels(ctx)}
    token = _image_token_id(ctx.config)
    if token is None and "pixel_values" not in ctx.params:  # images under another name: the family's spec
        return _text(ctx, pad=False)
    if token is None:  # the image is not spliced into the text (GIT and kin): text and pixels
        return {**_text(ctx, pad=False), **images}
    counts = image_features_count(ctx, images)
    text = _with_placeholders(ctx, token, counts)
    if "mm_token_type_ids" in ctx.params:  # which tokens are image tokens (multimodal RoPE)
        text["mm_token_type_ids"] = (text["input_ids"] == token).int()
    return {**text, **images}


AUDIO_MASKS = ("input_features_mask", "feature_attention_mask", "audio_attention_mask", "padding_mask")


def _audio_token_id(config) -> int | None:
    return _token_id(config, "audio_token_id", "audio_token_index")


def _features_fn(model, name: str):
    fn = getattr(model, name, None)
    return fn if fn is not None else getattr(getattr(model, "model", None), name, None)


def _audio_lm(ctx: Ctx) -> dict | None:
    """A language model that splices audio into its text (audio LLMs): the audio, its frame mask,
    and text with as many audio placeholder tokens per row as the model's own
    ``get_audio_features`` returns. None when the model is not one, or when that method requires
    more than the audio and its mask (the family's spec builds its inputs)."""
    token, fn = _audio_token_id(ctx.config), _features_fn(ctx.model, "get_audio_features")
    if token is None or fn is None or "input_ids" not in ctx.params:
        return None
    key = "input_features" if "input_features" in ctx.params else "input_values"
    audio = _input_features(ctx) if key == "input_features" else _input_values(ctx)
    if audio is None:
        return None
    out = {key: audio}
    # raw audio's mask is per sample (its last axis), filter-bank features' per frame
    mel_first = audio.dim() == 3 and audio.shape[1] == _get(audio_config(ctx), "num_mel_bins", "n_mels")
    length = audio.shape[-1] if mel_first or key == "input_values" else audio.shape[1]
    mask = next((m for m in AUDIO_MASKS if m in ctx.params), None)
    if mask is not None:
        out[mask] = torch.ones(BATCH, length, dtype=torch.long)
    sig = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_POSITIONAL for p in sig.values()):  # a head forwarding to its base model's
        inner = _features_fn(getattr(ctx.model, "model", None), "get_audio_features")
        sig = inspect.signature(inner).parameters if inner is not None else sig
    audio_arg = next((a for a in (key, "input_features", "input_values") if a in sig), key)
    mask_arg = next((a for a in AUDIO_MASKS + ("attention_mask",) if a in sig), None)
    kwargs = {audio_arg: audio}
    if mask is not None and mask_arg is not None:
        kwargs[mask_arg] = out[mask]
    elif mask_arg is not None and sig[mask_arg].default is inspect.Parameter.empty:  # a mask it requires
        kwargs[mask_arg] = torch.ones(BATCH, length, dtype=torch.long)
    try:
        with torch.no_grad():
            feats = fn(**kwargs)
    except TypeError as e:
        # it needs more than the audio and its mask (the text, the raw audio): the family's spec builds the inputs
        if "required positional argument" in str(e):
            return None
        raise
    feats = getattr(feats, "pooler_output", None) if not isinstance(feats, torch.Tensor) else feats
    if feats is None:
        return None
    n = feats.shape[1] if feats.dim() == 3 else feats.shape[0] // BATCH
    return {**_with_placeholders(ctx, token, [n] * BATCH), **out}


def _time_series(ctx: Ctx) -> dict:
    """A forecasting model's history (``past_values``): ``context_length`` steps (plus the longest
    lag for the models that read lagged values), per input channel; with its observed mask, its
    padding and frequency (TimesFM), its time features, and the future window of
    ``prediction_length`` (or ``horizon_length``) steps the models with a decoder read."""
    c, p = ctx.config, ctx.params
    context = _get(c, "context_length", default=32)
    lags = _get(c, "lags_sequence")
    length = context + (max(lags) if lags else 0)
    channels = _get(c, "num_input_channels", default=_get(c, "input_size", default=1))
    single = "past_time_features" in p or "past_values_padding" in p or "freq" in p or channels == 1 and \
        _get(c, "num_input_channels") is None
    shape = (BATCH, length) if single and channels == 1 else (BATCH, length, channels)
    out = {"past_values": ctx.randn(*shape)}
    for k in ("past_observed_mask", "observed_mask"):
        if k in p:
            out[k] = torch.ones(shape)
    if "past_values_padding" in p:
        out["past_values_padding"] = torch.zeros(shape, dtype=torch.long)
    if "freq" in p:
        out["freq"] = torch.zeros(BATCH, 1, dtype=torch.long)
    time_features = _get(c, "num_time_features")
    if "past_time_features" in p:
        horizon = _get(c, "prediction_length", default=4)
        out["past_time_features"] = ctx.randn(BATCH, length, time_features or 0)
        if "future_values" in p:
            out["future_values"] = ctx.randn(BATCH, horizon, *shape[2:])
        if "future_time_features" in p:
            out["future_time_features"] = ctx.randn(BATCH, horizon, time_features or 0)
    return out


def make_inputs(model_type: str, model, config, task: str) -> tuple[dict, dict | None]:
    """``(train, generate)``: the forward/backward inputs with the task's labels, and the prompt
    for ``generate`` (None when the head does not generate text)."""
    params = dict(inspect.signature(model.forward).parameters)
    ctx = Ctx(model_type, model, config, task, params, torch.Generator().manual_seed(1))
    spec = SPECS.get(model_type)
    required = {n for n, p in params.items() if p.default is inspect.Parameter.empty
                and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and n != "self"}
    out: dict[str, Any] = {}
    if task == "causal-lm":
        train, gen = make_batches(model_type, model, config)
        ctx.batch = train
        if spec is not None and spec.inputs is not None:
            _merge(train, spec.inputs(ctx))
        if spec is not None and spec.labels is not None:
            _merge(train, spec.labels(ctx))
        return train, (gen if spec is None or spec.generate else None)
    if "past_values" in params:  # forecasting models: a history, not tokens or pixels
        out.update(_time_series(ctx))
        ctx.batch = out
        if spec is not None and spec.inputs is not None:
            _merge(out, spec.inputs(ctx))
        if spec is not None and spec.labels is not None:
            _merge(out, spec.labels(ctx))
        return out, None
    audio_lm = _audio_lm(ctx) if task in LM_TASKS + ("base",) and _image_token_id(config) is None else None
    if audio_lm is not None:
        out.update(audio_lm)
    elif task in ("image-text-to-text", "multimodal-lm") or (
            task == "base" and {"input_ids", "pixel_values"} <= set(params) and _image_token_id(config) is not None
            and getattr(config, "vision_config", None) is not None):
        out.update(_multimodal(ctx))
    else:
        if "input_ids" in params and (task in LM_TASKS or task == "contrastive" or "input_ids" in required
                                      or not ({"pixel_values", "input_values", "input_features"} & set(params))):
            out.update(_text(ctx))
        grid_key = next((k for k in GRID_KEYS if k in params), None)
        if grid_key is not None and {"pixel_values", "hidden_states"} & set(params):
            pixels, grid = _grid_images(ctx)
            out.update({"pixel_values" if "pixel_values" in params else "hidden_states": pixels, grid_key: grid})
        elif "pixel_values" in params and ("pixel_values" in required or task not in LM_TASKS):
            out["pixel_values"] = _video(ctx) if task == "video-classification" else _pixels(ctx)
        if "pixel_values_videos" in params and "pixel_values_videos" in required:
            out["pixel_values_videos"] = _video(ctx)
        if "input_values" in params:
            out["input_values"] = _input_values(ctx)
        if "input_features" in params:
            features = _input_features(ctx)
            if features is not None:
                out["input_features"] = features
        audio = out.get("input_features", out.get("input_values"))
        mask = next((m for m in AUDIO_MASKS[:3] if m in params), None)
        if audio is not None and mask is not None and audio.dim() == 3:  # a frame mask for filter-bank features
            mel_first = audio.shape[1] == _get(audio_config(ctx), "num_mel_bins", "n_mels")
            out[mask] = torch.ones(BATCH, audio.shape[-1] if mel_first else audio.shape[1], dtype=torch.long)
    if "bbox" in params and "input_ids" in out:  # layout models: a box (x0, y0, x1, y1) per token
        corners = ctx.randint(0, 500, (*out["input_ids"].shape, 2))
        out["bbox"] = torch.cat([corners, corners + ctx.randint(1, 500, corners.shape)], dim=-1)
    ctx.batch = out
    if spec is not None and spec.inputs is not None:
        _merge(out, spec.inputs(ctx))
    if spec is not None and spec.labels is not None:
        _merge(out, spec.labels(ctx))
    else:
        _labels(ctx, out)
    gen = None
    if task in TEXT_GENERATION and (spec is None or spec.generate) and model.can_generate():
        gen = {k: v for k, v in out.items() if k not in ("labels", "decoder_input_ids", "return_loss")}
        vocab = text_vocab(model, config)
        gen["_pad_token_id"] = pad_id(ctx, vocab)
    return out, gen


def _merge(out: dict, extra: dict) -> None:
    for k, v in extra.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v


# ---- per-family needs ---------------------------------------------------------------------------

_UNSET_LIST = "the default config leaves lists the model requires unset (None)"


def _changes(reason: str, **changes) -> Spec:
    """A spec that only changes the tiny config (``__`` in a keyword stands for a dot)."""
    return Spec(reason, config=Override(reason, changes={k.replace("__", "."): v for k, v in changes.items()}))


def _stacked_features(ctx: Ctx) -> dict:
    c = audio_config(ctx)
    return {"input_features": ctx.randn(BATCH, AUDIO_FRAMES, 4 * c.num_mel_bins)}


def _spectrogram(ctx: Ctx) -> dict:
    return {"input_values": ctx.randn(BATCH, ctx.config.max_length, ctx.config.num_mel_bins)}


def _shifted_labels(ctx: Ctx) -> dict:
    """Labels, and the decoder inputs they shift to (for the heads that do not shift them)."""
    labels = ordinary_ids(ctx, (BATCH, TARGET_LEN))
    start = torch.full((BATCH, 1), ctx.config.decoder_start_token_id, dtype=torch.long)
    return {"labels": labels, "decoder_input_ids": torch.cat([start, labels[:, :-1]], dim=1)}


def _patch_sequence(ctx: Ctx) -> dict:
    """Images as NaFlex towers (SigLIP 2) take them: a sequence of flattened patches, its mask and
    the patch grid's shape."""
    c = image_config(ctx)
    side, patch = image_side(c)[0], c.patch_size
    n = side // patch
    return {"pixel_values": ctx.randn(BATCH, n * n, c.num_channels * patch * patch),
            "pixel_attention_mask": torch.ones(BATCH, n * n, dtype=torch.long),
            "spatial_shapes": torch.tensor([[n, n]] * BATCH)}


def _qformer_text(ctx: Ctx) -> dict:
    vocab = ctx.config.qformer_config.vocab_size
    return {"qformer_input_ids": ctx.randint(1, vocab, (BATCH, SEQ // 2)),
            "qformer_attention_mask": torch.ones(BATCH, SEQ // 2, dtype=torch.long)}


def _kosmos2_text(ctx: Ctx) -> dict:
    n = ctx.config.latent_query_num
    ids = ordinary_ids(ctx, (BATCH, n + SEQ // 2))
    where = torch.zeros_like(ids)
    where[:, 1:1 + n] = 1  # the image's latent queries go after the first token
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "image_embeds_position_mask": where}


def _seq_embeds(ctx: Ctx, *names: str, seq: int = SEQ, width: int | None = None) -> dict:
    """Hidden states of the config's width, (batch, seq, width), for each input of ``names``."""
    width = width if width is not None else ctx.config.hidden_size
    return {n: ctx.randn(BATCH, seq, width) for n in names}


def _decision_trajectory(ctx: Ctx) -> dict:
    c = ctx.config
    return {"states": ctx.randn(BATCH, SEQ, c.state_dim), "actions": ctx.randn(BATCH, SEQ, c.act_dim),
            "rewards": ctx.randn(BATCH, SEQ, 1), "returns_to_go": ctx.randn(BATCH, SEQ, 1),
            "timesteps": ctx.randint(0, c.max_ep_len, (BATCH, SEQ)),
            "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long)}


def _lxmert_visual(ctx: Ctx) -> dict:
    boxes = 4
    return {**_text(ctx), "visual_feats": ctx.randn(BATCH, boxes, ctx.config.visual_feat_dim),
            "visual_pos": torch.rand(BATCH, boxes, ctx.config.visual_pos_dim, generator=ctx.g)}


def _muse_assistant(ctx: Ctx) -> dict:
    c = ctx.config
    return {"noise_embeds": ctx.randn(BATCH, c.block_size, c.hidden_size),
            "context_hidden_states": ctx.randn(BATCH, SEQ // 2, c.hidden_size * len(c.target_layer_ids)),
            "attention_mask": torch.ones(BATCH, SEQ // 2 + c.block_size, dtype=torch.long)}  # spans both


def _seggpt_prompt(ctx: Ctx) -> dict:
    """The input image and the prompt image are stacked on the height axis into the model's image
    size: each is half its height; the prompt's mask is an image of the same shape."""
    b, ch, h, w = ctx.batch["pixel_values"].shape
    shape = (b, ch, h // 2, w)
    return {"pixel_values": ctx.randn(*shape), "prompt_pixel_values": ctx.randn(*shape),
            "prompt_masks": ctx.randn(*shape)}


def _image_pair(ctx: Ctx) -> dict:
    """Keypoint matchers take the two images to match as one (batch, 2, channels, h, w) input."""
    return {"pixel_values": torch.stack([_pixels(ctx), _pixels(ctx)], dim=1)}


def _gemma4_patches(ctx: Ctx) -> dict:
    """Images as flattened patches (batch, patches, 3 x patch x patch) with each patch's (x, y)
    position; a side of as many patches as the pooling kernel merges, twice."""
    c = ctx.config
    side = 2 * c.pooling_kernel_size
    ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    pos = torch.stack([xs.flatten(), ys.flatten()], dim=-1)
    return {"pixel_values": torch.rand(BATCH, side * side, 3 * c.patch_size ** 2, generator=ctx.g),
            "pixel_position_ids": pos.unsqueeze(0).expand(BATCH, -1, -1).contiguous()}


def _kosmos2_5_inputs(ctx: Ctx) -> dict:
    """Images as the processor flattens them: (row, column) then the patch's pixels, per patch;
    the text marks where the image's latent queries go."""
    c = ctx.config
    patches = 16
    rows = torch.arange(patches, dtype=torch.float32) // 4 + 1
    cols = torch.arange(patches, dtype=torch.float32) % 4 + 1
    pixels = ctx.randn(BATCH, patches, c.vision_config.patch_embed_hidden_size)
    flat = torch.cat([rows.expand(BATCH, -1)[..., None], cols.expand(BATCH, -1)[..., None], pixels], dim=-1)
    return {**_kosmos2_text(ctx), "flattened_patches": flat}


_CHECKPOINT = "the default config leaves to the checkpoints"
def _transducer_step(ctx: Ctx) -> dict:
    """One decoder step of a transducer (RNN-T/TDT): the previous token, as in greedy decoding."""
    vocab = _get(ctx.config, "vocab_size", default=None) or ctx.config.get_text_config().vocab_size
    return {"decoder_input_ids": ctx.randint(0, vocab, (BATCH, 1))}


def _speech_labels(ctx: Ctx) -> dict:
    """The training targets of a text-to-speech model: each token's duration (2 frames), pitch and
    energy, and the spectrogram of the frames they make."""
    c, ids = ctx.config, ctx.batch["input_ids"]
    durations = torch.full(ids.shape, 2, dtype=torch.long)
    frames = int(durations.sum(1).max())
    return {"attention_mask": None, "duration_labels": durations,
            "spectrogram_labels": ctx.randn(ids.shape[0], frames, c.num_mel_bins),
            "pitch_labels": ctx.randn(*ids.shape, 1), "energy_labels": ctx.randn(*ids.shape, 1)}


_HIERA = ("the Hiera backbone's width is its first stage's (embed_dim_per_stage[0]), which the generic shrink sets "
          "apart; a global-attention block inside a stage of the fewer blocks (not at a pooling block)")
def _qwen2_audio(ctx: Ctx) -> dict:
    """Whisper-style features and as many audio placeholders per row as the encoder makes of them:
    its stride-2 conv, then its stride-2 pooling."""
    features = _input_features(ctx)
    frames = features.shape[-1]
    n = ((frames - 1) // 2 + 1 - 2) // 2 + 1
    return {**_with_placeholders(ctx, ctx.config.audio_token_id, [n] * BATCH), "input_features": features,
            "feature_attention_mask": torch.ones(BATCH, frames, dtype=torch.long)}


def _dia_labels(ctx: Ctx) -> dict:
    """Audio codes: decoder inputs (batch, frames, channels) and labels per (row, channel) pair,
    (batch x channels, frames), as the head flattens its logits."""
    d = ctx.config.decoder_config
    vocab = d.vocab_size
    return {"decoder_input_ids": ctx.randint(0, vocab, (BATCH, TARGET_LEN, d.num_channels)),
            "labels": ctx.randint(0, vocab, (BATCH * d.num_channels, TARGET_LEN))}


_REQUIRED = "its forward requires an input the generic rules do not build"
_DECODER_LATENTS = "a codec's decoder: it takes the continuous latents its encoder makes, not audio"


_STACKED = "the feature extractor hands over mel frames delta-expanded and stacked in pairs (4 x mel bins)"
_NAFLEX = "takes images as sequences of flattened patches with their grid (NaFlex)"
_HF_BACKBONE = "the default backbone is timm's; the family's Transformers ResNet backbone needs no package"
_QUERY_TOKENS = "the checkpoints set the image placeholder token (one per Q-Former query), the default config does not"
_NO_LOSS = "the head computes no training loss: no labels; the gradients come from a projection of its outputs"
_CTC_VOCAB = "the CTC head's vocabulary is not in the default config"
_HIDDEN_DIM = "the encoder's width (hidden_dim) is not a field the generic shrink knows"
_FORECAST = "the forecast horizon is left to the checkpoints (no default): a short history, short lags, one time feature"
_INDEXER = "the indexer's top-k must be a multiple of its pooling"
_DETECTOR_BACKBONE = ("the default config builds the text recognizer's backbone (PP-LCNetV4: the last stage only, "
                      "strided in height alone), not the four-level backbone the config class declares for the detector")


def _intraclass_convs() -> dict:
    """The PP-OCR detectors' intra-class block: (kernel, stride, padding) of each convolution, the
    padding keeping the map's size so their outputs add up."""
    def conv(h: int, w: int) -> list:
        return [[h, w], 1, [h // 2, w // 2]]

    ratios = (("long", 7), ("mid", 5), ("short", 3))
    return {"reduce_channel": [1, 1, 0], "return_channel": [1, 1, 0],
            **{f"vertical_long_to_small_conv_{r}ratio": conv(k, 1) for r, k in ratios},
            **{f"horizontal_small_to_long_conv_{r}ratio": conv(1, k) for r, k in ratios},
            **{f"symmetric_conv_long_{r}ratio": conv(k, k) for r, k in ratios}}

# ---- inputs: video trackers, families without a forward ------------------------------------------

TRACKER_FRAMES = 3


def _tracker_clip(ctx: Ctx, box: bool = False) -> dict:
    """A clip of frames at the model's image size and the prompts on its first frame, as the
    processor hands them to the session: a click for one object (points (1, 1, points, 2) in the
    model's pixel coordinates, labels (1, 1, points), 1 for a positive click) and, for another, a
    binary mask (1, 1, side, side) of a box or (``box``) the box itself, as the processor turns it
    into points: its two corners labelled 2 and 3."""
    side = ctx.config.image_size
    top, bottom, left, right = side // 4, side // 2, side // 2, 3 * side // 4
    out = {"video": ctx.randn(TRACKER_FRAMES, 3, side, side),
           "input_points": torch.tensor([[[[0.5 * side, 0.375 * side]]]]),
           "input_labels": torch.ones(1, 1, 1, dtype=torch.int32)}
    if box:
        out["box_points"] = torch.tensor([[[[left, top], [right, bottom]]]], dtype=torch.float32)
        out["box_labels"] = torch.tensor([[[2, 3]]], dtype=torch.int32)
    else:
        mask = torch.zeros(1, 1, side, side)
        mask[..., top:bottom, left:right] = 1.0
        out["input_masks"] = mask
    return out


def _track(model, inputs: dict) -> dict:
    """The library's video tracking: a session over the clip on the inputs' device, the prompts
    added on the first frame (object 1 the click, object 2 the mask or box), then the model on each frame
    in turn. Returns every frame's low-resolution masks and object scores, (frames, objects, ...).
    The frame step returns the object scores the forward reads only in eval mode, so the model runs
    in eval mode; with grad mode on, the forward runs without its ``inference_mode`` decorator so
    that gradients flow, as a fine-tuning loop needs."""
    import functools
    import sys

    video = inputs["video"]
    device = video.device
    module = sys.modules[type(model).__module__]
    session = getattr(module, type(model).__name__.replace("Model", "InferenceSession"))(
        video=video, video_height=video.shape[-2], video_width=video.shape[-1], inference_device=device,
        inference_state_device=device, video_storage_device=device, dtype=video.dtype)
    clicked, masked = session.obj_id_to_idx(1), session.obj_id_to_idx(2)
    session.add_point_inputs(clicked, 0, {"point_coords": inputs["input_points"],
                                          "point_labels": inputs["input_labels"]})
    if "input_masks" in inputs:
        session.add_mask_inputs(masked, 0, inputs["input_masks"])
    else:
        session.add_point_inputs(masked, 0, {"point_coords": inputs["box_points"],
                                             "point_labels": inputs["box_labels"]})
    session.obj_with_new_inputs = [1, 2]
    step = functools.partial(type(model).forward.__wrapped__, model) if torch.is_grad_enabled() else model
    training = model.training
    model.eval()
    try:
        frames = [step(inference_session=session, frame_idx=i) for i in range(video.shape[0])]
    finally:
        model.train(training)
    return {"pred_masks": torch.stack([f.pred_masks for f in frames]),
            "object_score_logits": torch.stack([f.object_score_logits for f in frames])}


def _text_prompt_clip(ctx: Ctx) -> dict:
    """A clip of frames at the model's image size and a text prompt as the processor tokenizes
    it for the session: one row padded to 32 tokens, with its attention mask."""
    side = ctx.config.tracker_config.image_size
    ids = ordinary_ids(ctx, (1, 32), ctx.config.detector_config.text_config.vocab_size)
    mask = torch.zeros(1, 32, dtype=torch.long)
    mask[:, :4] = 1
    return {"video": ctx.randn(TRACKER_FRAMES, 3, side, side), "prompt_ids": ids, "prompt_mask": mask}


def _detect_and_track(model, inputs: dict) -> tuple:
    """The library's text-prompted video segmentation: a session over the clip with the text
    prompt, then the model on each frame in turn (detection, then tracking of what it found).
    Returns per frame the objects' masks (in object id order) and detection and tracker scores.
    Eval mode and grad mode as in ``_track``."""
    import functools
    import sys

    video = inputs["video"]
    device = video.device
    module = sys.modules[type(model).__module__]
    session = module.Sam3VideoInferenceSession(
        video=video, video_height=video.shape[-2], video_width=video.shape[-1], inference_device=device,
        inference_state_device=device, video_storage_device=device, dtype=video.dtype)
    prompt = session.add_prompt("object")
    session.prompt_input_ids[prompt] = inputs["prompt_ids"]
    session.prompt_attention_masks[prompt] = inputs["prompt_mask"]
    step = functools.partial(type(model).forward.__wrapped__, model) if torch.is_grad_enabled() else model
    training = model.training
    model.eval()
    out = []
    try:
        for i in range(video.shape[0]):
            frame = step(inference_session=session, frame_idx=i)
            ids = sorted(frame.obj_id_to_mask)
            out.append((torch.stack([frame.obj_id_to_mask[k] for k in ids]),
                        torch.tensor([frame.obj_id_to_score[k] for k in ids], device=device),
                        torch.tensor([frame.obj_id_to_tracker_score.get(k, -1.0) for k in ids], device=device)))
    finally:
        model.train(training)
    return tuple(out)


def _bark_inputs(ctx: Ctx) -> dict:
    """What each stage of Bark's pipeline reads: text token ids with their padding mask (the
    processor's output) for the semantic model, token ids for the coarse model, and audio codes
    (batch, frames, codebooks) of the codec's codebooks for the fine model and the codec."""
    c = ctx.config
    text = ctx.randint(0, c.semantic_config.input_vocab_size, (BATCH, SEQ))
    mask = torch.ones_like(text)
    mask[1, -PAD:] = 0
    return {"input_ids": text, "attention_mask": mask,
            "coarse_input_ids": ctx.randint(0, c.coarse_acoustics_config.input_vocab_size, (BATCH, SEQ)),
            "codes": ctx.randint(0, c.codec_config.codebook_size,
                                 (BATCH, TARGET_LEN, c.fine_acoustics_config.n_codes_total))}


def _bark(model, inputs: dict) -> dict:
    """Bark's pipeline stage by stage on given tokens (its generate samples): the semantic model's
    logits on the text, the coarse model's on its tokens, the fine model's for the last codebook
    from all the codes before it, and the codec's waveform decoded from the codes."""
    codes = inputs["codes"]
    fine = model.fine_acoustics(codes.shape[-1] - 1, input_ids=codes)
    return {"semantic": model.semantic(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                       use_cache=False).logits,
            "coarse": model.coarse_acoustics(input_ids=inputs["coarse_input_ids"], use_cache=False).logits,
            "fine": fine.logits, "audio": model.codec_decode(codes.transpose(1, 2))}


# The trackers' memory attention takes 64-wide memories (its key/value width is fixed at 64) and
# splits each object pointer of the model's width into 64-wide tokens: a model wider than 64, as
# the checkpoints are (256); the rotary sizes of the memory attention are the top feature map's.
_TRACKER_WIDTH = 128
_TRACKER_WIDE = {"vision_config.fpn_hidden_size": _TRACKER_WIDTH, "memory_attention_hidden_size": _TRACKER_WIDTH,
                 "memory_encoder_hidden_size": _TRACKER_WIDTH, "mask_downsampler_embed_dim": _TRACKER_WIDTH,
                 "memory_fuser_embed_dim": _TRACKER_WIDTH, "mask_decoder_config.hidden_size": _TRACKER_WIDTH,
                 "prompt_encoder_config.hidden_size": _TRACKER_WIDTH, "memory_encoder_output_channels": 64,
                 "memory_attention_rope_feat_sizes": [2, 2],
                 "vision_config.backbone_feature_sizes": [[8, 8], [4, 4], [2, 2]]}
_TRACKER = ("the video forward runs on an inference session: the clip, a click for one object and a mask for "
            "another on the first frame, then every frame in turn; the memory attention's key/value width is fixed "
            "at 64 and object pointers are split into 64-wide tokens, so the model is wider (128) as the "
            "checkpoints are (256); the feature maps' sizes are those of the tiny image")

# ---- inputs: audio language models and codecs ----------------------------------------------------

def _projector_mask(ctx: Ctx) -> dict:
    """Granite Speech: the processor's ``input_features_mask`` marks the projector's outputs that
    are real audio (boolean, one row per audio), as many per row as its audio placeholders."""
    counts = (ctx.batch["input_ids"] == ctx.config.audio_token_id).sum(1)
    return {"input_features_mask": torch.arange(int(counts.max()))[None, :] < counts[:, None]}


def _whisper_pooled_audio(ctx: Ctx, mask: str, audio_kwargs: dict | None = None) -> dict:
    """Whisper-style features (batch, mel bins, frames) with their frame mask (``mask``), and as
    many audio placeholders per row as the encoder makes of them: its stride-2 conv, then a
    stride-2 pooling; with ``audio_kwargs`` (what else its ``get_audio_features`` requires), the
    count that method returns."""
    features = _input_features(ctx)
    frames = features.shape[-1]
    frame_mask = torch.ones(BATCH, frames, dtype=torch.long)
    n = ((frames - 1) // 2 + 1 - 2) // 2 + 1
    if audio_kwargs is not None:
        with torch.no_grad():
            feats = _features_fn(ctx.model, "get_audio_features")(
                input_features=features, **{mask: frame_mask}, **audio_kwargs).pooler_output
        n = feats.shape[0] // BATCH
    return {**_with_placeholders(ctx, ctx.config.audio_token_id, [n] * BATCH), "input_features": features,
            mask: frame_mask}


def _moss_audio(ctx: Ctx) -> dict:
    """One Whisper window per row; the raw audio's padding mask (per sample, one row per audio)
    from which the model maps windows to rows."""
    samples = torch.ones(BATCH, AUDIO_SAMPLES, dtype=torch.long)
    return {**_whisper_pooled_audio(ctx, "input_features_mask", {"padding_mask": samples}), "padding_mask": samples}


def _codec_pair(ctx: Ctx) -> dict:
    """XCodec2: the waveform (batch, 1, samples) and the semantic encoder's filter-bank frames,
    (batch, frames, 2 x 80 mel bins stacked in pairs), one frame per hop of the acoustic encoder."""
    hop, frames = ctx.config.hop_length, 8
    width = ctx.config.semantic_model_config.feature_projection_input_dim
    return {"input_values": ctx.randn(BATCH, 1, frames * hop), "input_features": ctx.randn(BATCH, frames, width),
            "padding_mask": torch.ones(BATCH, frames * hop, dtype=torch.long),
            "input_features_mask": torch.ones(BATCH, frames, dtype=torch.long)}


def _codec_encoding(model, inputs: dict) -> dict:
    """A codec encoder's computation: its continuous embeddings and the codes quantized from them
    (the codes alone carry no gradient)."""
    return {"embeddings": model.encoder(inputs["input_values"]), "audio_codes": model(**inputs).audio_codes}


def _kyutai_frames(ctx: Ctx) -> dict:
    """Per frame, the text token and the codec's codes of that frame (batch, frames, 1 + codebooks),
    as generate assembles them; the first frame's audio is the audio start token."""
    c = ctx.config
    text = ordinary_ids(ctx, (BATCH, SEQ), c.vocab_size)
    codes = ctx.randint(0, c.codec_config.codebook_size, (BATCH, SEQ, c.num_codebooks))
    codes[:, 0] = c.audio_bos_token_id
    return {"input_ids": torch.cat([text[..., None], codes], dim=-1),
            "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long)}


def _realtime_audio(ctx: Ctx) -> dict:
    """A realtime transcriber adds one audio frame group to each token: audio for the prompt and
    the tokens generate adds (audio_length_per_tok mel frames each); an unpadded prompt."""
    c = ctx.config
    frames = (SEQ + NEW_TOKENS) * c.audio_length_per_tok
    return {**_text(ctx, pad=False), "input_features": ctx.randn(BATCH, c.audio_config.num_mel_bins, frames)}


def _realtime_forward(model, inputs: dict) -> Any:
    """The training forward reads the audio of its tokens only (the rest is what generate
    transcribes next)."""
    frames = inputs["input_ids"].shape[1] * model.config.audio_length_per_tok
    return model(**{**inputs, "input_features": inputs["input_features"][..., :frames]})


# ---- inputs: multimodal (Fuyu, Mllama, MiniCPM, Kimi) --------------------------------------------

def _fuyu_inputs(ctx: Ctx) -> dict:
    """Fuyu's processor: the image cut into patches, each flattened (batch, patches, channels x
    patch x patch), and per patch row that many image tokens and a newline token, then the
    begin-of-sequence token and the text."""
    c = ctx.config
    rows, cols = c.image_size // c.patch_size, c.image_size // c.patch_size
    newline = text_vocab(ctx.model, c) - 2  # the checkpoints' |NEWLINE| has no config field
    line = [c.image_token_id] * cols + [newline]
    image = torch.tensor(line * rows + [c.text_config.bos_token_id])
    text = ordinary_ids(ctx, (BATCH, SEQ // 2))
    text[text == newline] = newline - 1
    ids = torch.cat([image.expand(BATCH, -1), text], dim=1)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "pixel_values": ctx.randn(BATCH, rows * cols, c.num_channels * c.patch_size ** 2)}


def _mllama_inputs(ctx: Ctx) -> dict:
    """Mllama's processor: each image split into tiles of the tower's image size, padded to
    max_num_tiles, with its aspect ratio's id (1-based in supported_aspect_ratios) and tile mask;
    the prompt is the image token, the begin-of-text token and the text; every token from the
    image token on attends to the image's real tiles (cross_attention_mask). Here one image of
    1 x 2 tiles in the first row, of one tile in the second."""
    c, v = ctx.config, ctx.config.vision_config
    tiles, side = v.max_num_tiles, v.image_size
    shapes = [[1, 2], [1, 1]]
    pixels = torch.zeros(BATCH, 1, tiles, v.num_channels, side, side)
    tile_mask = torch.zeros(BATCH, 1, tiles, dtype=torch.long)
    for b, (h, w) in enumerate(shapes):
        pixels[b, 0, :h * w] = ctx.randn(h * w, v.num_channels, side, side)
        tile_mask[b, 0, :h * w] = 1
    ratio_ids = torch.tensor([[v.supported_aspect_ratios.index(s) + 1] for s in shapes])
    head = torch.tensor([c.image_token_index, c.text_config.bos_token_id])
    ids = torch.cat([head.expand(BATCH, -1), ordinary_ids(ctx, (BATCH, SEQ // 2))], dim=1)
    cross = tile_mask[:, None].expand(-1, ids.shape[1], -1, -1).clone()
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels,
            "aspect_ratio_ids": ratio_ids, "aspect_ratio_mask": tile_mask, "cross_attention_mask": cross}


# Patch grids (height, width) of the MiniCPM-V images: one per row, of two sizes; multiples of 4,
# as the two 2 x 2 merges of the "16x" mode need.
_MINICPM_GRIDS = [[4, 4], [4, 8]]
# The placeholder and the markers around images and slices (ids the checkpoints' configs hold),
# at the top of the tiny vocabulary; the text takes the ids below them.
_MINICPM_IDS = {"image_token_id": 255, "image_start_id": 254, "image_end_id": 253, "slice_start_id": 252,
                "slice_end_id": 251, "newline_id": 250}


def _minicpm_images(ctx: Ctx) -> dict:
    """MiniCPM-V's processor packs every image of the batch into one NaViT row: (1, channels,
    patch, patches x patch), each image's patches side by side, with each image's patch grid
    (target_sizes)."""
    v = image_config(ctx)
    grids = torch.tensor(_MINICPM_GRIDS, dtype=torch.int32)
    patches = int(grids.prod(-1).sum())
    return {"pixel_values": ctx.randn(1, v.num_channels, v.patch_size, patches * v.patch_size),
            "target_sizes": grids}


def _minicpm_inputs(ctx: Ctx) -> dict:
    """The packed images and, per row, its image's placeholder tokens (a grid's patches over 16,
    or over 4 in the "4x" mode) between the image-start and image-end markers, then text."""
    divisor = 4 if ctx.config.downsample_mode == "4x" else 16
    counts = [h * w // divisor for h, w in _MINICPM_GRIDS]
    ids = _MINICPM_IDS
    width = max(counts) + 2 + SEQ // 2
    rows = [torch.cat([torch.tensor([ids["image_start_id"]] + [ids["image_token_id"]] * n + [ids["image_end_id"]]),
                       ordinary_ids(ctx, (width - n - 2,), vocab=min(ids.values()))]) for n in counts]
    input_ids = torch.stack(rows)
    out = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), **_minicpm_images(ctx)}
    if "mm_token_type_ids" in ctx.params:
        out["mm_token_type_ids"] = (input_ids == ids["image_token_id"]).int()
    return out


def _kimi_patches(ctx: Ctx, pixels: torch.Tensor) -> torch.Tensor:
    """Kimi-K2.5's processor keeps each patch an image: (patches, channels, patch, patch)."""
    patch = image_config(ctx).patch_size
    return pixels.view(pixels.shape[0], -1, patch, patch)


def _kimi_inputs(ctx: Ctx) -> dict:
    """Qwen2-VL-style patches and grid, each patch an image, and as many placeholder tokens per
    image as the model's own image features have rows."""
    pixels, grid = _grid_images(ctx)
    images = {"pixel_values": _kimi_patches(ctx, pixels), "image_grid_thw": grid}
    counts = image_features_count(ctx, images)
    return {**_with_placeholders(ctx, ctx.config.image_token_id, counts), **images}


# ---- inputs: multimodal (Inkling, PaddleOCR-VL, Molmo2, video LLMs) ------------------------------

def _video_llama3_inputs(ctx: Ctx) -> dict:
    """VideoLLaMA 3's image processor: flattened patches with each image's (t, h, w) patch grid and
    its merge size (1 for images), and as many placeholders per image as its grid has patches over
    the merge size squared."""
    pixels, grid = _grid_images(ctx)
    merge = torch.ones(grid.shape[0], dtype=torch.long)
    counts = (grid.prod(-1) // merge ** 2).tolist()
    return {**_with_placeholders(ctx, _image_token_id(ctx.config), counts), "pixel_values": pixels,
            "image_grid_thw": grid, "image_merge_sizes": merge}


def _paddleocr_vl_inputs(ctx: Ctx) -> dict:
    """PaddleOCR-VL's image processor: each image's patches as small images (patches, channels,
    patch, patch) with its (t, h, w) patch grid; the prompt has one placeholder per 2 x 2 merged
    patches, and mm_token_type_ids marks them (for the multimodal RoPE)."""
    v = image_config(ctx)
    flat, grid = _grid_images(ctx)
    pixels = flat.reshape(flat.shape[0], v.num_channels, v.patch_size, v.patch_size)
    token = _image_token_id(ctx.config)
    text = _with_placeholders(ctx, token, (grid.prod(-1) // v.spatial_merge_size ** 2).tolist())
    text["mm_token_type_ids"] = (text["input_ids"] == token).int()
    return {**text, "pixel_values": pixels, "image_grid_thw": grid}


_INKLING2_IMAGES = ("the image processor cuts each image into one block of pixels per language-model token (merge x "
                    "patch pixels a side, channels last), with the grid counted in tokens, not patches")


def _inkling2_images(ctx: Ctx) -> dict:
    """Inkling 2's image processor: one image of 2 x 2 language-model tokens per row, cut into one
    block of (merge x patch) pixels a side per token, channels last: (tokens, side, side,
    channels); the grid (t, h, w) counts tokens."""
    v = image_config(ctx)
    side = v.spatial_merge_size * v.patch_size
    grid = torch.tensor([[1, 2, 2]] * BATCH)
    pixels = ctx.randn(int(grid.prod(-1).sum()), side, side, v.num_channels)
    return {"pixel_values": pixels, "image_grid_thw": grid}


def _inkling2_inputs(ctx: Ctx) -> dict:
    """The images, and one placeholder per image token in each row's prompt."""
    images = _inkling2_images(ctx)
    counts = images["image_grid_thw"].prod(-1).tolist()
    return {**_with_placeholders(ctx, _image_token_id(ctx.config), counts), **images}


def _inkling_inputs(ctx: Ctx) -> dict:
    """Inkling's image processor: each image cut into patches of the tower's patch size, each patch
    repeated over the temporal patch and laid out (patches, time, h, w, channels); here two patches
    per image; the prompt has one placeholder per patch."""
    v = image_config(ctx)
    per_image = 2
    patches = ctx.randn(BATCH * per_image, v.patch_size, v.patch_size, v.num_channels)
    pixels = patches[:, None].expand(-1, v.temporal_patch_size, -1, -1, -1).contiguous()
    return {**_with_placeholders(ctx, _image_token_id(ctx.config), [per_image] * BATCH), "pixel_values": pixels}


def _instructblip_video_inputs(ctx: Ctx) -> dict:
    """InstructBLIP-Video's processor: a clip of frames (batch, frames, channels, h, w), the prompt
    opening with num_query_tokens video tokens per frame, and the instruction for the Q-Former."""
    c = ctx.config
    video = _video(ctx)
    text = _with_placeholders(ctx, c.video_token_index, [c.num_query_tokens * video.shape[1]] * BATCH)
    return {**text, "pixel_values": video, **_qformer_text(ctx)}


def _molmo2_inputs(ctx: Ctx) -> dict:
    """Molmo2's image processor: per image, the resized image and its high-resolution crops (one
    crop here: the image fits in one), each as (patches, 3 x patch x patch) flattened patches, all
    crops of the batch stacked; per image token, the indices of the patches (2 x 2) it pools
    (image_token_pooling); per image its pooled grids (low-res rows, cols, high-res rows, cols);
    the prompt has one image token per pooled token, and mm_token_type_ids marks them."""
    c, v = ctx.config, ctx.config.vision_config
    crops = 2  # the resized image and one high-resolution crop
    per_crop = (v.image_size[0] // v.patch_size) * (v.image_size[1] // v.patch_size)
    pool = 4  # the processor's 2 x 2 pooling: one token per crop of 2 x 2 patches
    tokens = crops * per_crop // pool
    pooling = torch.arange(BATCH * crops * per_crop).reshape(BATCH * tokens, pool)
    grids = torch.tensor([[1, 1, 1, 1]] * BATCH)
    text = _with_placeholders(ctx, c.image_token_id, [tokens] * BATCH)
    text["mm_token_type_ids"] = (text["input_ids"] == c.image_token_id).long()
    return {**text, "pixel_values": ctx.randn(BATCH * crops, per_crop, v.num_channels * v.patch_size ** 2),
            "image_token_pooling": pooling, "image_grids": grids}


# ---- inputs: multimodal (image-token models, OCR, Granite) ---------------------------------------

VQ_CODES, VQ_CODE_FIRST = 64, 128  # image codes of the VQ tokenizers and the token id of the first
def _glm_image_inputs(ctx: Ctx) -> dict:
    """GLM-Image's processor for image-to-image generation: per sample one source image, as
    flattened patches with its (t, h, w) patch grid, spliced into the prompt as one placeholder per
    patch between the image start and end tokens, then the text and the image start token of the
    image to generate; ``image_grid_thw`` lists each sample's source grid then its target grid
    (``images_per_sample`` of them)."""
    c, v = ctx.config, ctx.config.vision_config
    side, target = 4, [1, 2, 2]
    n = side * side // v.spatial_merge_size ** 2
    prompt = torch.cat([torch.full((BATCH, 1), c.image_start_token_id), torch.full((BATCH, n), c.image_token_id),
                        torch.full((BATCH, 1), c.image_end_token_id), ordinary_ids(ctx, (BATCH, SEQ // 2)),
                        torch.full((BATCH, 1), c.image_start_token_id)], dim=1)
    return {"input_ids": prompt, "attention_mask": torch.ones_like(prompt),
            "pixel_values": ctx.randn(BATCH * side * side, v.in_channels * v.patch_size ** 2),
            "image_grid_thw": torch.tensor([[1, side, side], target] * BATCH),
            "images_per_sample": torch.tensor([2] * BATCH)}


_DOCLING_TILE = ("the connector pixel-shuffles a tile's patch grid by scale_factor (4), and by half of it on the "
                 "fine path: a tile of 8 x 8 patches (128 pixels); the DeepStack taps name vision layers the "
                 "two-layer tower has")


def _chameleon_vocabulary() -> dict:
    """Chameleon's tokenizer vocabulary as the checkpoints' config carries it: the image
    placeholder, and one ``IMGIMG<code>Z`` token per VQ code (the code's digits spelled A-J)."""
    spell = {str(d): chr(ord("A") + d) for d in range(10)}
    codes = {"IMGIMG" + "".join(spell[c] for c in str(i)) + "Z": VQ_CODE_FIRST + i for i in range(VQ_CODES)}
    return {"<image>": VQ_CODE_FIRST + VQ_CODES, **codes}


def _emu3_vocabulary() -> dict:
    """Emu3's tokenizer vocabulary as the checkpoints' config carries it: the image placeholder,
    the end-of-row token (``<|extra_200|>``) and one ``<|visual token NNNNNN|>`` per VQ code."""
    codes = {f"<|visual token{i:06d}|>": VQ_CODE_FIRST + i for i in range(VQ_CODES)}
    return {"<image>": VQ_CODE_FIRST + VQ_CODES, "<|extra_200|>": VQ_CODE_FIRST + VQ_CODES + 1, **codes}


def _text_without_image_codes(ctx: Ctx) -> dict:
    """The prompt's text tokens redrawn where they fell on an image code: a tokenizer never makes
    those tokens from text (and Chameleon's head rules them out of its predictions)."""
    ids = ctx.batch.get("input_ids")
    if ids is None:
        return {}
    codes = torch.tensor(ctx.model.model.vocabulary_mapping.image_tokens)
    specials = _special_ids(ctx.config) | set(codes.tolist())
    allowed = torch.tensor([i for i in range(text_vocab(ctx.model, ctx.config)) if i not in specials])
    ids = ids.clone()
    hit = torch.isin(ids, codes)
    ids[hit] = allowed[torch.randint(0, len(allowed), (int(hit.sum()),), generator=ctx.g)]
    return {"input_ids": ids}


SPECS: dict[str, Spec] = {
    "apertus1p5": _changes("the image and audio code ranges must fit the tiny vocabulary, back to back",
                           image_token_offset=64, vision_config__codebook_size=64, audio_token_offset=128,
                           audio_config__codebook_size=64),
    **{m: _changes(_FORECAST, prediction_length=4, context_length=8, lags_sequence=[1, 2, 3], num_time_features=1)
       for m in ("informer", "time_series_transformer")},
    "autoformer": _changes(_FORECAST + "; the decoder's label window fits in that history", prediction_length=4,
                           context_length=8, lags_sequence=[1, 2, 3], num_time_features=1, label_length=4),
    "gemma3n_audio": Spec(_REQUIRED + ": mel frames (batch, frames, mel bins) and their padding mask (True: padding)",
                          inputs=lambda ctx: {"audio_mel": ctx.randn(BATCH, AUDIO_FRAMES, ctx.config.input_feat_size),
                                              "audio_mel_mask": torch.zeros(BATCH, AUDIO_FRAMES, dtype=torch.bool)}),
    "gemma4_audio": Spec(_REQUIRED + ": mel frames, as many mel bins as the first subsampling conv's channels",
                         inputs=lambda ctx: {"input_features": ctx.randn(
                             BATCH, AUDIO_FRAMES, ctx.config.subsampling_conv_channels[0]),
                             "attention_mask": torch.ones(BATCH, AUDIO_FRAMES, dtype=torch.bool)}),
    "mimi_decoder": Spec(_DECODER_LATENTS + " (batch, hidden size, frames)",
                         inputs=lambda ctx: {"latents": ctx.randn(BATCH, ctx.config.hidden_size, 8)}),
    "pocket_tts_audio_tokenizer_decoder": Spec(_DECODER_LATENTS + " (batch, hidden size, frames)",
                                               inputs=lambda ctx: {"latents": ctx.randn(BATCH, ctx.config.hidden_size,
                                                                                        8)}),
    "nemotron3_5_transcribe_word_timestamp": Spec(_REQUIRED + ": the transcriber's hidden states (inputs_embeds)",
                                                  inputs=lambda ctx: _seq_embeds(ctx, "inputs_embeds")),
    "blip_2_qformer": Spec(_REQUIRED + ": the learnt queries (query_embeds) and the image features they attend to",
                           inputs=lambda ctx: {"input_ids": None, "attention_mask": None,
                                               **_seq_embeds(ctx, "query_embeds", seq=4),
                                               **_seq_embeds(ctx, "encoder_hidden_states", seq=8,
                                                             width=ctx.config.encoder_hidden_size)}),
    "decision_transformer": Spec(_REQUIRED + ": a trajectory of states, actions, rewards, returns-to-go and "
                                 "timesteps", inputs=_decision_trajectory),
    "lxmert": Spec(_REQUIRED + ": the detector's region features and boxes besides the text", inputs=_lxmert_visual),
    "muse_glimmer_assistant": Spec(_REQUIRED + ": a block of noised embeddings and the target model's hidden states",
                                   inputs=_muse_assistant),
    "seggpt": Spec(_REQUIRED + ": the in-context prompt image and its mask", inputs=_seggpt_prompt),
    **{m: Spec(_REQUIRED + ": the text prompt (input_ids) the image's detections are conditioned on",
               inputs=lambda ctx: _text(ctx)) for m in ("sam3", "sam3_lite_text")},
    "clvp": Spec(_REQUIRED + ": the conditioning mel spectrogram (batch, mel bins, frames); the encoders' rotary "
                 "embedding is at least 32 wide, so their heads are too (two heads of 32)",
                 config=Override("", changes={"text_config.num_attention_heads": 2,
                                              "speech_config.num_attention_heads": 2}),
                 inputs=lambda ctx: {"input_features": ctx.randn(BATCH, ctx.config.decoder_config.feature_size,
                                                                 AUDIO_FRAMES)}),
    "omniasr_ctc": Spec(_REQUIRED + ": the padding mask of the raw audio (the input lengths the loss reads)",
                        inputs=lambda ctx: {"padding_mask": torch.ones(BATCH, AUDIO_SAMPLES, dtype=torch.long)}),
    "muse_spark_audio": Spec("the audio must be a whole number of 1920-sample frames (the feature extractor pads it)",
                             inputs=lambda ctx: {"input_values": ctx.randn(BATCH, 2 * 1920)}),
    **{m: Spec(_REQUIRED + ": the text its image-text forward pairs with the image", inputs=lambda ctx: _text(ctx))
       for m in ("aimv2", "bridgetower", "vilt")},
    "lightglue": Spec(_REQUIRED.replace("an input", "an image pair"), inputs=_image_pair),
    "gemma4_vision": Spec(_REQUIRED + ": images as flattened patches with their positions", inputs=_gemma4_patches),
    "pi0": Spec(_REQUIRED + ": the robot's state, the actions the flow-matching loss is trained on, and its camera "
                "images as (batch, cameras, channels, h, w) with their mask; the flow's noise and time given, not sampled "
                "(the device's random stream is its own)",
                inputs=lambda ctx: {**_text(ctx, pad=False), "pixel_values": _pixels(ctx).unsqueeze(1),
                                    "pixel_attention_mask": torch.ones(BATCH, 1, dtype=torch.bool),
                                    "state": ctx.randn(BATCH, ctx.config.max_state_dim),
                                    "actions": ctx.randn(BATCH, ctx.config.chunk_size, ctx.config.max_action_dim),
                                    "noise": ctx.randn(BATCH, ctx.config.chunk_size, ctx.config.max_action_dim),
                                    "timestep": 0.1 + 0.8 * torch.rand(BATCH, generator=ctx.g)}),
    "evolla": Spec(_REQUIRED + ": the protein sequence (tokens of the protein encoder's vocabulary) with its mask",
                   inputs=lambda ctx: {"protein_input_ids": ctx.randint(
                       4, ctx.config.protein_encoder_config.vocab_size, (BATCH, SEQ)),
                       "protein_attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long)}),
    "kosmos-2.5": Spec(_REQUIRED + ": images as the processor's flattened patches, and where their latent queries go",
                       config=Override("", changes={"latent_query_num": 4, "vision_config.patch_embed_hidden_size": 48}),
                       inputs=_kosmos2_5_inputs),
    "cohere_compass": _changes(_CHECKPOINT + ": the RoPE parameters of its attention layers",
                               text_config__rope_parameters={"full_attention": {"rope_type": "default",
                                                                                "rope_theta": 10000.0}}),
    "step3p7": _changes(_CHECKPOINT + ": the sliding window of its local layers", text_config__sliding_window=8),
    "esm": _changes(_CHECKPOINT + ": the vocabulary size (33 amino-acid tokens) and the padding token", vocab_size=33,
                    pad_token_id=1),
    **{m: _changes(_CHECKPOINT + ": the token that opens an image (multimodal RoPE positions start there)",
                   vision_start_token_id=250) for m in ("qwen2_5_omni_thinker", "qwen3_omni_moe_thinker")},
    "udop": _changes(_CHECKPOINT + ": the decoder's start token", decoder_start_token_id=0),
    "t5gemma2_encoder": _changes("the encoder's config lacks the dropout rate its layers read; image tokens per image: "
                                 "no more than the tiny image's patches",
                                 text_config__dropout_rate=0.0, mm_tokens_per_image=4),
    "moonshine_streaming": _changes("the decoder's key/value heads are not in the default config",
                                    num_key_value_heads=4),
    "hunyuan_vl_text": _changes(_CHECKPOINT + ": the multimodal RoPE sections (time, height, width)",
                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                 "mrope_section": [2, 3, 3]}),
    "hunyuan_vl": _changes(_CHECKPOINT + ": the multimodal RoPE sections (time, height, width)",
                           text_config__rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                         "mrope_section": [2, 3, 3]}),
    **{m: Spec("a transducer's joint network needs the decoder's previous token besides the audio",
               inputs=_transducer_step)
       for m in ("nemotron3_5_asr", "nemotron_asr_streaming", "parakeet_rnnt", "parakeet_tdt")},
    "fastspeech2_conformer": Spec("training requires every target: durations, pitch, energy and the spectrogram",
                                  labels=_speech_labels),
    "idefics": Spec("which images each token attends to (image_attention_mask): every token, its one image",
                    inputs=lambda ctx: {"image_attention_mask": torch.ones(*ctx.batch["input_ids"].shape, 1,
                                                                           dtype=torch.long)}
                    if "input_ids" in ctx.batch else {}),
    "oneformer": Spec(_REQUIRED + ": the task prompt's token ids (task_inputs)",
                      inputs=lambda ctx: {"task_inputs": ctx.randint(1, 256, (BATCH, ctx.config.task_seq_len))}),
    "neucodec": Spec(_REQUIRED + ": the semantic encoder's filter-bank features beside the raw audio; the fused "
                     "width (semantic and acoustic) is not a field the generic shrink knows",
                     config=Override("", changes={"quantization_dim": 128}),
                     inputs=lambda ctx: {"input_values": ctx.randn(BATCH, 1, AUDIO_SAMPLES),
                                         "input_features": ctx.randn(
                                             BATCH, AUDIO_FRAMES,
                                             ctx.config.semantic_model_config.feature_projection_input_dim)}),
    "dpt": _changes("the neck reads one hidden state per backbone layer it names: four layers, each read",
                    num_hidden_layers=4, backbone_out_indices=[0, 1, 2, 3]),
    "hiera": _changes("the masked units must tile the patch grid after every query pooling: a 64-pixel image",
                      image_size=[64, 64]),
    "align": _changes("the text projection must have the image tower's pooled width (640 here), which the "
                      "generic shrink does not derive; no drop-connect in training (the device's random stream is "
                      "its own, as CUDA's is)", projection_dim=640, vision_config__drop_connect_rate=0.0),
    "clap": Spec("the audio tower takes mel spectrograms with a channel axis: (batch, 1, frames, mel bins); its last "
                 "stage's width (patch embedding width doubled per stage) must be its hidden size",
                 config=Override("", changes={"audio_config.patch_embeds_hidden_size": 8}),
                 inputs=lambda ctx: {"input_features": ctx.randn(BATCH, 1, 64, ctx.config.audio_config.num_mel_bins)}),
    "qwen3_asr": _changes("the audio tower's output width (output_dim) must be the text model's; the generic shrink "
                          "does not know the field", audio_config__output_dim=64),
    "csm": Spec("a text prompt (its audio context is optional; the codec's audio would need the processor's cutoffs)",
                inputs=lambda ctx: {**_text(ctx), "input_values": None}),
    **{m: _changes(_HIERA, **{f"{prefix}hidden_size": 24, f"{prefix}global_attention_blocks": [4]})
       for m, prefix in (("sam2_hiera_det_model", ""), ("sam2_vision_model", "backbone_config__"))},
    "sam2": _changes(_HIERA + "; the feature maps' sizes are those of the tiny image (strides 4, 8, 16)",
                     vision_config__backbone_config__hidden_size=24,
                     vision_config__backbone_config__global_attention_blocks=[4],
                     vision_config__backbone_feature_sizes=[[8, 8], [4, 4], [2, 2]]),
    "sam3_tracker": _changes("the feature maps' sizes are those of the tiny image",
                             vision_config__backbone_feature_sizes=[[8, 8], [4, 4], [2, 2]]),
    "vibevoice": Spec("its generate reads the prompt's attention mask", inputs=lambda ctx: {
        "attention_mask": torch.ones_like(ctx.batch["input_ids"])} if "input_ids" in ctx.batch else {}),
    "lilt": _changes("the layout embeddings split the width in six (x0, y0, x1, y1, w, h): a width divisible by six "
                     "and, shrunk by channel_shrink_ratio, by the heads", hidden_size=96),
    "fastspeech2_conformer_with_hifigan": Spec("the token ids come from the acoustic model's vocabulary (model_config); "
                                               "training requires every target",
                                               inputs=lambda ctx: {"input_ids": ordinary_ids(
                                                   ctx, (BATCH, SEQ), ctx.config.model_config.vocab_size)},
                                               labels=lambda ctx: _speech_labels(
                                                   Ctx(ctx.model_type, ctx.model, ctx.config.model_config, ctx.task,
                                                       ctx.params, ctx.g, ctx.batch))),
    "qwen2_audio": Spec("the model has no get_audio_features to count its audio placeholders with: counted from "
                        "its encoder's strides", inputs=_qwen2_audio),
    "dia": Spec("the decoder reads and predicts one audio code per channel: labels per (row, channel)",
                labels=_dia_labels),
    "mistral4": _changes("the rotary part of each head is head_dim x partial_rotary_factor (half): its width, and the "
                         "rest of the head's, made to match", qk_rope_head_dim=12,
                         qk_nope_head_dim=12),
    "textnet": _changes("the first stage's width is the stem's (hidden_sizes[0] = stem_out_channels)",
                        stem_out_channels=32),
    "xclip": Spec("a video model: the text and a clip of frames (batch, frames, channels, h, w)",
                  inputs=lambda ctx: {**_text(ctx), "pixel_values": _video(ctx)}),
    "voxtral_realtime_text": Spec("the mapping names a class the library does not define", unrunnable=(
        "library defect: MODEL_MAPPING_NAMES maps voxtral_realtime_text to VoxtralRealtimeTextModel, which transformers "
        "does not define"), unrunnable_match="has no attribute VoxtralRealtimeTextModel"),
    "audio-spectrogram-transformer": Spec("takes a filter-bank spectrogram (frames x mel bins) as input_values",
                                          inputs=_spectrogram),
    "blt": Spec("generate raises in the library, on CPU as anywhere: its cache reads num_hidden_layers, which "
                "BltConfig does not have (the causal-LM sweep records the same); the other stages are compared",
                generate=False),
    "blip-2": _changes(_QUERY_TOKENS, image_token_index=255, num_query_tokens=4),
    **{m: _changes(_HF_BACKBONE, use_timm_backbone=False)
       for m in ("conditional_detr", "dab-detr", "deformable_detr", "detr", "table-transformer")},
    "pp_doclayout_v4": Spec(_NO_LOSS, labels=lambda ctx: {}),
    "depth_pro": Spec(_NO_LOSS + "; the image is split into patches of the config's patch size at its smallest "
                      "scale (a quarter): 56-pixel patches (4 x 4 of the encoders' 14) of a 224-pixel image; the "
                      "encoders' hooked layers are the two the tiny encoder has; the neck and fusion widths are "
                      "shrunk too (they are not derived from the encoders')",
                      config=Override("", changes={"patch_size": 56, "intermediate_hook_ids": [1, 0],
                                                   "fusion_hidden_size": 32, "intermediate_feature_dims": [32, 32],
                                                   "scaled_images_feature_dims": [64, 64, 32],
                                                   **{f"{e}_model_config.image_size": 56
                                                      for e in ("image", "patch", "fov")}}),
                      inputs=lambda ctx: {"pixel_values": ctx.randn(BATCH, 3, 224, 224)}, labels=lambda ctx: {}),
    "efficientloftr": Spec(_REQUIRED.replace("an input", "an image pair") + "; the last stage's width must be the "
                           "hidden size; the 2-D rotary embedding fills a quarter of the hidden size with "
                           "4 x head-dim frequencies: eight heads, as the default config has",
                           config=Override("", changes={"out_features": [16, 16, 32, 64], "num_attention_heads": 8,
                                                        "num_key_value_heads": 8}),
                           inputs=_image_pair),
    "embedding_gemma2": Spec("a text embedding model: its default config has no vision or audio tower",
                             inputs=lambda ctx: {"pixel_values": None, "input_features": None, **_text(ctx)}),
    "fsmt": Spec("the head does not shift its labels into decoder inputs", labels=_shifted_labels),
    "fun_asr_nano": _changes("the adaptor's width must be a quarter of the text model's",
                             adaptor_config__intermediate_size=16),
    "gemma3": _changes("image tokens per image: no more than the tiny image's patches", mm_tokens_per_image=4),
    "glm5_next": _changes(_INDEXER, text_config__index_kpool=4),
    "glm5_next_text": _changes(_INDEXER, index_kpool=4),
    "granite_speech5_ctc": Spec(_STACKED, inputs=_stacked_features),
    "granite_speech5_encoder": Spec(_STACKED, inputs=_stacked_features),
    "instructblip": Spec(_QUERY_TOKENS + "; the Q-Former reads the instruction too",
                         config=Override("", changes={"image_token_index": 255, "num_query_tokens": 4}),
                         inputs=_qformer_text),
    "kosmos-2": Spec("the text marks where the image's latent queries go (image_embeds_position_mask); the text "
                     "model's width is embed_dim, a field the generic shrink leaves",
                     config=Override("", changes={"text_config.embed_dim": 64, "text_config.ffn_dim": 128,
                                                  "latent_query_num": 4}), inputs=_kosmos2_text),
    "luke": _changes("the entity vocabulary is not a field the generic shrink knows", entity_vocab_size=64),
    "mobilevitv2": _changes("five stride-2 stages and a 2 x 2 unfolding patch: a 64-pixel image", image_size=64),
    "perceiver": Spec("the byte-level masked LM decodes max_position_embeddings positions: inputs that long; "
                      "its latents are not fields the generic shrink knows",
                      config=Override("", changes={"max_position_embeddings": 32, "d_latents": 64, "num_latents": 16}),
                      inputs=lambda ctx: _text(ctx, seq=ctx.config.max_position_embeddings)),
    "siglip2": Spec(_NAFLEX, inputs=_patch_sequence),
    "siglip2_vision_model": Spec(_NAFLEX, inputs=_patch_sequence),
    "tvp": Spec("the visual prompt is sized for the image (64 pixels: the ResNet backbone pools it 32-fold); the input "
                "is a clip of the config's frame count with the text query it grounds",
                config=Override("", changes={"max_img_size": 64, "visual_prompt_size": 4}),
                inputs=lambda ctx: {**_text(ctx), "pixel_values": ctx.randn(BATCH, ctx.config.num_frames, 3, 64, 64)},
                unrunnable="library defect: TvpVisionInputEmbedding.add_2d_positional_embeddings views the column "
                           "embeddings (width x hidden elements) as (batch, 1, width, hidden), which fails for any "
                           "batch of more than one",
                unrunnable_match="invalid for input of size 64 [modeling_tvp.py:244 in add_2d_positional_embeddings]"),
    "deepseek_ocr2": _changes(_UNSET_LIST + ": the text model's MLP kind per layer (and its experts per token); "
                              "the SAM neck's last width is the encoder's",
                              text_config__mlp_layer_types=["dense", "sparse"], text_config__num_experts_per_tok=2,
                              vision_config__sam_config__downsample_channels=[32, 64]),
    "sapiens2": _changes(_UNSET_LIST + ": the segmentation head's upsampling and convolution stages; key-value heads "
                         "per layer that divide the tiny head count",
                         head_config__upsample_out_channels=[32], head_config__upsample_kernel_sizes=[4],
                         head_config__conv_out_channels=[32], head_config__conv_kernel_sizes=[1],
                         num_key_value_heads_per_layer=[4, 4, 2]),
    **{m: Spec("a text-line recognizer: the backbone pools the height 32-fold and the neck pools it again, so the "
               "line image is 48 pixels high (as the processor resizes it), 160 wide",
               inputs=lambda ctx: {"pixel_values": ctx.randn(BATCH, 3, 48, 160)})
       for m in ("pp_ocrv5_server_rec", "pp_ocrv6_small_rec", "pp_ocrv6_tiny_rec")},
    "pp_ocrv6_small_det": Spec(_DETECTOR_BACKBONE + "; the neck reads the widths of its four stages",
                               config=Override("", base={"backbone_config": {
                                   "model_type": "pp_lcnet_v3", "scale": 0.75, "divisor": 16,
                                   "out_features": ["stage2", "stage3", "stage4", "stage5"], "out_indices": [2, 3, 4, 5]}},
                                   changes={"layer_list_out_channels": [32, 48, 96, 192]})),
    "pp_ocrv6_medium_det": Spec(_DETECTOR_BACKBONE + "; " + _UNSET_LIST + ": the neck's intra-class blocks (a k x 1, "
                                "1 x k and k x k convolution for k = 7, 5, 3, each padded to keep the map's size), the "
                                "upsampling of its four levels and the head's kernels",
                                config=Override("", base={"backbone_config": {
                                    "model_type": "hgnet_v2", "arch": "L", "return_idx": [0, 1, 2, 3],
                                    "out_features": ["stage1", "stage2", "stage3", "stage4"]}},
                                    changes={"intraclass_block_config": _intraclass_convs(),
                                             "scale_factor_list": [1, 2, 4, 8], "kernel_list": [3, 2, 2]})),
    "pp_ocrv5_mobile_rec": Spec("a text-line recognizer: the default backbone strides the height 32-fold and the head "
                                "average-pools three rows of it, so the line image is 96 pixels high, 160 wide",
                                inputs=lambda ctx: {"pixel_values": ctx.randn(BATCH, 3, 96, 160)}),
    "aria": _changes("the projector's queries per image are keyed by the vision tower's patch count: the tiny "
                     "image's 4 patches", projector_patch_to_query_dict={4: 4}),
    "lw_detr": _changes("the backbone's windows (a square count) must tile the tiny image's 2 x 2 patches: 4, not 16; "
                        "the two-stage encoder picks its queries among those patches: 4 of them, in one group; the "
                        "default config has no projector scale (no feature level): one, at scale 1",
                        backbone_config__num_windows=4, backbone_config__num_windows_side=2, num_queries=4,
                        group_detr=1, projector_scale_factors=[1.0]),
    "rf_detr": _changes("the backbone's windows per side must divide the tiny image's 2 x 2 patches: 2, not 4; the "
                        "two-stage encoder picks its queries among those patches: 4 of them, in one group",
                        backbone_config__num_windows=2, num_queries=4, group_detr=1),
    "ernie4_5_vl_moe": _changes("the multimodal RoPE sections (height, width, time) must fill the tiny head's rotary "
                                "half (8 frequencies)",
                                text_config__rope_parameters__mrope_section=[2, 2, 4]),
    "uvdoc": Spec("the head concatenates the feature maps of all six bridge stages: the backbone outputs them all; "
                  "its reflect-padded 5 x 5 convolutions need feature maps wider than 2: a 64-pixel image (16-fold "
                  "smaller)",
                  config=Override("", changes={"backbone_config.out_features": [f"stage{i}" for i in range(1, 7)],
                                               "backbone_config.out_indices": list(range(1, 7))}),
                  inputs=lambda ctx: {"pixel_values": ctx.randn(BATCH, 3, 64, 64)}),
    "vipllava": _changes("the projector reads five vision layers: five that the two-layer tower has (its three "
                         "hidden states, two of them twice)", vision_feature_layers=[-1, -2, -3, 0, 1]),
    "pp_doclayout_v3": Spec(_NO_LOSS + "; the mask branch reads the backbone's first stage: its width (x4_feat_dim) "
                            "is the tiny backbone's (16), a field the generic shrink leaves",
                            config=Override("", changes={"x4_feat_dim": 16}), labels=lambda ctx: {}),
    "vits": _changes("no sampling noise: the device's random stream is its own, as CUDA's is; the HiFi-GAN "
                     "vocoder's width is shrunk too (it is not derived from the hidden size)",
                     noise_scale=0.0, noise_scale_duration=0.0, upsample_initial_channel=32),
    "wav2vec2-bert": _changes(_CTC_VOCAB, vocab_size=32),
    "wav2vec2-conformer": _changes(_CTC_VOCAB, vocab_size=32),
    # video trackers, families without a forward
    "sam2_video": Spec(_TRACKER + "; " + _HIERA, config=Override("", changes={
        **_TRACKER_WIDE, "vision_config.backbone_config.hidden_size": 24,
        "vision_config.backbone_config.global_attention_blocks": [4]}), inputs=_tracker_clip, call=_track),
    "edgetam_video": Spec(_TRACKER + "; " + _HIERA + "; the memory's perceiver resampler pools the top feature map "
                          "(2 x 2) in a square of windows: 4 2-D latents (one per 1-pixel window, the keys' rotary "
                          "grid 2 x 2) and 4 1-D latents; the second object is prompted with a box, not a mask: "
                          "EdgeTAM's mask-prompt path returns its object score one axis short of a clicked object's "
                          "(SAM 2's unsqueezes it), so the forward cannot concatenate the two objects' scores",
                          config=Override("", changes={
                              **_TRACKER_WIDE, "vision_config.backbone_config.hidden_size": 24,
                              "vision_config.backbone_config.global_attention_blocks": [4],
                              "perceiver_resampler_num_latents": 4, "perceiver_resampler_num_latents_2d": 4,
                              "memory_attention_rope_k_sizes": [2, 2]}),
                          inputs=lambda ctx: _tracker_clip(ctx, box=True), call=_track),
    "sam3_tracker_video": Spec(_TRACKER + "; the feature maps' sizes follow from the image size in whole patches "
                               "(14 pixels): a 28-pixel image", config=Override("", changes={**_TRACKER_WIDE,
                                                                                             "image_size": 28}),
                               inputs=_tracker_clip, call=_track),
    "sam3_video": Spec("the video forward runs on an inference session: the clip and a text prompt (tokenized as the "
                       "processor does, padded to 32), then every frame in turn; with random weights every detection "
                       "scores about 0.25 (class and presence sigmoids near 1/2), so the detection thresholds are "
                       "0.2, not 0.5 and 0.7, for detections to be tracked; the tracker's widths as in "
                       "sam3_tracker_video, and the detector's as wide (its features feed the tracker); the tracker's "
                       "low-resolution masks are 4 times the top feature map (8)",
                       config=Override("", changes={
                           **{f"tracker_config.{k}": v for k, v in _TRACKER_WIDE.items()},
                           "tracker_config.image_size": 28, "low_res_mask_size": 8,
                           **{f"detector_config.{k}": _TRACKER_WIDTH
                              for k in ("vision_config.fpn_hidden_size", "geometry_encoder_config.hidden_size",
                                        "detr_encoder_config.hidden_size", "detr_decoder_config.hidden_size",
                                        "mask_decoder_config.hidden_size")},
                           "score_threshold_detection": 0.2, "new_det_thresh": 0.2}),
                       inputs=_text_prompt_clip, call=_detect_and_track),
    "bark": Spec("no forward: its generate samples, so the computation is each stage of the pipeline on given tokens "
                 "(semantic, coarse and fine models' logits) and the codec's decoding of audio codes",
                 inputs=_bark_inputs, call=_bark),
    "glm_image_vqmodel": Spec("no forward: the computation is encode, the VQ tokenizer of the vision tower's feature "
                              "map (batch, latent channels, h, w); its widths and codebook are fields the generic "
                              "shrink does not know",
                              config=Override("", changes={"embed_dim": 32, "num_embeddings": 64,
                                                           "latent_channels": 48}),
                              inputs=lambda ctx: {"hidden_states": ctx.randn(BATCH, ctx.config.latent_channels, 4, 4)},
                              call=lambda model, inputs: model.encode(inputs["hidden_states"])),
    # audio language models and codecs
    **{m: Spec(_HIDDEN_DIM + "; the processor's input_features_mask marks the projector's real outputs (a boolean "
               "mask, one per audio placeholder), not the mel frames",
               config=Override("", changes={"encoder_config.hidden_dim": 64}), inputs=_projector_mask)
       for m in ("granite_speech", "granite_speech_plus")},
    "voxtral": _changes(_CHECKPOINT + ": the audio placeholder token (24, as the processor sets it)", audio_token_id=24),
    "voxtral_realtime": Spec("the audio is not spliced in at placeholders but added to the tokens, one group of "
                             "audio_length_per_tok mel frames per token: the training forward reads its tokens' "
                             "audio, generate goes on over the rest", inputs=_realtime_audio, call=_realtime_forward),
    "musicflamingo": Spec("get_audio_features reads the text's placeholders (audio timestamps), so the placeholders "
                          "are counted from the encoder's strides, as the processor does",
                          inputs=lambda ctx: _whisper_pooled_audio(ctx, "input_features_mask")),
    "moss_transcribe_diarize": Spec("get_audio_features requires the raw audio's padding mask (per sample) beside "
                                    "the mel frames' mask", inputs=_moss_audio),
    "kyutai_speech_to_text": Spec("each position takes its text token and the codec's codes of that frame, "
                                  "(batch, frames, 1 + codebooks), labels the text tokens; generate takes the raw "
                                  "audio instead (and encodes it as it goes), not these inputs",
                                  inputs=_kyutai_frames,
                                  labels=lambda ctx: {"labels": ctx.batch["input_ids"][..., 0].clone()},
                                  generate=False),
    "xcodec2": Spec(_REQUIRED + ": the semantic encoder's filter-bank frames beside the waveform, one per hop of "
                    "the acoustic encoder (as the feature extractor makes them); the quantizer's width is the fused "
                    "one (acoustic and semantic: 64 + 64), a field the generic shrink does not know",
                    config=Override("", changes={"quantization_dim": 128}), inputs=_codec_pair),
    "vibevoice_acoustic_tokenizer_encoder": Spec(
        _REQUIRED + ": the waveform (batch, channels, samples) as hidden_states",
        inputs=lambda ctx: {"hidden_states": ctx.randn(BATCH, ctx.config.channels, AUDIO_SAMPLES)}),
    "vibevoice_acoustic_tokenizer_decoder": Spec(
        _DECODER_LATENTS + " (batch, hidden size, frames), as hidden_states",
        inputs=lambda ctx: {"hidden_states": ctx.randn(BATCH, ctx.config.hidden_size, 8)}),
    "wavtokenizer_encoder": Spec("an encoder whose output is discrete codes, which carry no gradient: compared are "
                                 "the encoder's continuous embeddings and the codes its forward quantizes from them",
                                 call=_codec_encoding),
    # multimodal: Fuyu, Mllama, MiniCPM, Kimi
    "fuyu": Spec("the image goes in as flattened patches (batch, patches, channels x patch x patch), one image token "
                 "per patch and a newline token per patch row, as Fuyu's processor lays them out", inputs=_fuyu_inputs),
    "mllama": Spec("the image is tiled (batch, images, tiles, channels, h, w) with its aspect ratio id and tile mask, "
                   "and the text attends to it through a cross-attention mask, as Mllama's processor makes them; the "
                   "projector reads the last hidden state and the intermediate layers the tiny tower has: "
                   "vision_output_dim is their total width",
                   config=Override("", changes={"vision_config.intermediate_layers_indices": [0, 1],
                                                "vision_config.vision_output_dim": 192}),
                   inputs=_mllama_inputs),
    "llama4": Spec("the vision adapter's pixel shuffle (ratio 0.5) gives 4 x the tower's width, which its MLP reads as "
                   "intermediate_size; the projector reads the adapter's output (projector_output_dim) as "
                   "vision_output_dim, as the checkpoints set it",
                   config=Override("", changes={"vision_config.intermediate_size": 256,
                                                "vision_config.vision_output_dim": 64}),
                   unrunnable="library defect: Llama4ForConditionalGeneration.forward builds its output from "
                              "outputs.image_outputs, which its language model's output (MoeCausalLMOutputWithPast) "
                              "does not have, so every forward raises, with or without an image",
                   unrunnable_match="'MoeCausalLMOutputWithPast' object has no attribute 'image_outputs'"),
    **{m: Spec("the images are NaViT-packed (1, channels, patch, patches x patch) with each image's patch grid "
               "(target_sizes), and the prompt wraps each image's placeholders in image markers, as the MiniCPM-V "
               "processor makes them; the default config leaves the token ids to the checkpoints; the window merger "
               "follows vision layer insert_layer_id (6 of the checkpoints' 27): the tiny tower's first",
               config=Override("", changes={**({"image_token_id": _MINICPM_IDS["image_token_id"]} if m != "minicpmv4_7"
                                               else _MINICPM_IDS),
                                            "insert_layer_id": 0, "vision_config.insert_layer_id": 0}),
               inputs=_minicpm_inputs)
       for m in ("minicpm_ocr", "minicpmv4_6", "minicpmv4_7")},
    **{m: Spec("the image is NaViT-packed (1, channels, patch, patches x patch) with each image's patch grid "
               "(target_sizes), as the MiniCPM-V processor makes it; the window merger follows layer insert_layer_id "
               "(6 of the checkpoints' 27): the tiny tower's first",
               config=Override("", changes={"insert_layer_id": 0}), inputs=_minicpm_images)
       for m in ("minicpm_ocr_vision", "minicpmv4_7_vision")},
    "kimi_k25": Spec("each patch goes in as an image (patches, channels, patch, patch) beside the patch grid, as "
                     "Kimi-K2.5's processor makes them", inputs=_kimi_inputs),
    "kimi_k25_vision": Spec("each patch goes in as an image (patches, channels, patch, patch) beside the patch grid, "
                            "as Kimi-K2.5's processor makes them",
                            inputs=lambda ctx: {"pixel_values": _kimi_patches(ctx, ctx.batch["pixel_values"])}),
    # multimodal: Inkling, PaddleOCR-VL, Molmo2, video LLMs
    "video_llama_3": Spec("the image processor hands over each image's merge size (image_merge_sizes, 1 for images) "
                          "besides its flattened patches and patch grid", inputs=_video_llama3_inputs),
    "video_llama_3_vision": Spec("the tower takes each image's merge size (1 for images, as the image processor "
                                 "makes it) besides its flattened patches and patch grid",
                                 inputs=lambda ctx: {"merge_sizes": torch.ones(BATCH, dtype=torch.long)}),
    "instructblipvideo": Spec("a video model: a clip of frames, its placeholders are video tokens (num_query_tokens "
                              "per frame, an id the checkpoints set and the default config leaves unset) at the head "
                              "of the prompt, and the Q-Former reads the instruction too",
                              config=Override("", changes={"video_token_index": 255, "num_query_tokens": 4}),
                              inputs=_instructblip_video_inputs),
    "deepseek_vl_hybrid": Spec("the image processor makes the image twice: for the low-resolution tower and, at the "
                               "SAM tower's size, for the high-resolution one (high_res_pixel_values); the SAM tower's "
                               "global-attention layers (the first of which the model reads) are ones the two-layer "
                               "tower has: its last, after a windowed one",
                               config=Override("", changes={"high_res_vision_config.global_attn_indexes": [1]}),
                               inputs=lambda ctx: {"high_res_pixel_values": _pixels(
                                   ctx, ctx.config.high_res_vision_config)}),
    "molmo2": Spec("the image processor's crops of flattened patches, the patches each image token pools "
                   "(image_token_pooling) and the pooled grids (image_grids); training requires mm_token_type_ids; "
                   "the adapter reads vision layers that the two-layer tower has; one position embedding per patch "
                   "of the tiny crop (2 x 2); the image token is in the additional vocabulary after the text "
                   "vocabulary, as in the checkpoints",
                   config=Override("", changes={"adapter_config.vision_feature_layer": [-1, -2],
                                                "vision_config.num_position_embeddings": 4, "image_patch_id": 258}),
                   inputs=_molmo2_inputs),
    "paddleocr_vl": Spec("the image processor hands over each patch as a small image, (patches, channels, patch, "
                         "patch), not flattened", inputs=_paddleocr_vl_inputs),
    **{m: Spec(_INKLING2_IMAGES + "; the prompt has one placeholder per token", inputs=_inkling2_inputs)
       for m in ("inkling2", "inkling2_loop")},
    "inkling2_vision": Spec(_INKLING2_IMAGES, inputs=_inkling2_images),
    "inkling_mm_model": Spec("the image processor cuts each image into patches of the tower's patch size, repeats "
                             "each over the temporal patch and lays them out (patches, time, h, w, channels); one "
                             "placeholder per patch", inputs=_inkling_inputs),
    # multimodal: image-token models, OCR, Granite
    "chameleon": Spec("the image tokenizer's vocabulary (image codes to token ids) comes with the checkpoints, "
                      "the default config has none: one for a 64-code VQ model; a VQ model sized for a 32-pixel "
                      "image (three stride-2 stages: 4 x 4 codes); text tokens are never image codes",
                      config=Override("", changes={"vocabulary_map": _chameleon_vocabulary(), **{
                          f"vq_config.{k}": v for k, v in dict(
                              resolution=32, base_channels=32, channel_multiplier=[1, 1, 1, 2], num_res_blocks=1,
                              num_embeddings=VQ_CODES, embed_dim=32, latent_channels=32).items()}}),
                      inputs=_text_without_image_codes),
    "emu3": Spec("the image tokenizer's vocabulary (image codes and the end-of-row token to token ids) comes with "
                 "the checkpoints, the default config has none: one for a 64-code VQ model; a VQ model sized for a "
                 "32-pixel image (three stride-2 stages: 4 x 4 codes, its attention at the last stage, whose width "
                 "is the VQ model's hidden size); text tokens are never image codes",
                 config=Override("", changes={"vocabulary_map": _emu3_vocabulary(), **{
                     f"vq_config.{k}": v for k, v in dict(
                         base_channels=32, channel_multiplier=[1, 1, 2, 2], num_res_blocks=1,
                         codebook_size=VQ_CODES, attn_resolutions=[3], hidden_size=64).items()}}),
                 inputs=_text_without_image_codes),
    "granite_docling": Spec(_DOCLING_TILE + "; the processor's images come as tiles per sample, (batch, tiles, "
                            "channels, h, w), with the mask of the real tiles (one tile each here)",
                            config=Override("", changes={"vision_config.image_size": 128,
                                                         "vision_config.deepstack_visual_indexes": [0, 1]}),
                            inputs=lambda ctx: {"pixel_attention_mask": torch.ones(BATCH, 1, dtype=torch.bool)}),
    "granite_docling_vision": _changes(_DOCLING_TILE, image_size=128, deepstack_visual_indexes=[0, 1]),
    **{m: _changes("the adapter reads the vision tower's merged patches: out_hidden_size is the tower's width times "
                   "merge_size squared (64 x 4), which the generic shrink does not derive", out_hidden_size=256)
       for m in ("muse_glimmer", "muse_spark")},
    "unlimited_ocr": _changes("the SAM neck's last width (downsample_channels) feeds the CLIP encoder as its patch "
                              "embeddings: it must be the encoder's width (64), which the generic shrink does not "
                              "derive", vision_config__sam_config__downsample_channels=[32, 64]),
    "granite4_vision": _changes("the default config leaves the projectors' layout to the checkpoints (None): the "
                                "Q-Former's query and key windows (downsample_rate 2/4, the checkpoints' 4/8 "
                                "halved, on a tile of 4 x 4 patches), one DeepStack projection and the four spatial "
                                "groups, each injected into its own decoder layer (five here)",
                                downsample_rate="2/4", vision_config__patch_size=16, deepstack_layer_map=[[-2, 0]],
                                spatial_target_layers=[1, 2, 3, 4], text_config__num_hidden_layers=5),
    "diffusion_gemma": Spec("every decoder layer has a mixture of experts, whose sizes the default config leaves unset "
                            "(None); the head takes the prompt and the canvas it denoises (decoder_input_ids, 8 "
                            "tokens here: drawn at random on the model's device when not given) and computes no loss; "
                            "its generate draws its canvases at random on the device (the device's random stream is "
                            "its own, as CUDA's is)",
                            config=Override("", changes={"text_config.num_experts": 4, "text_config.top_k_experts": 2,
                                                         "text_config.moe_intermediate_size": 32,
                                                         "canvas_length": 8}),
                            inputs=lambda ctx: {"decoder_input_ids": ordinary_ids(ctx, (BATCH, 8))},
                            labels=lambda ctx: {}, generate=False),
    "glm_image": Spec("a source image and the grid of the image to generate, as the processor makes them for "
                      "image-to-image generation; the VQ model quantizes the vision tower's features (its latent "
                      "width is the tower's) into codes that are token ids of the text vocabulary: 64 codes",
                      config=Override("", changes={"vq_config.latent_channels": 64, "vq_config.embed_dim": 32,
                                                   "vq_config.num_embeddings": 64}),
                      inputs=_glm_image_inputs),
}
