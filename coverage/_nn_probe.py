"""Public ``torch.nn`` APIs run forward and backward on ``neuron``, to find the aten ops
without a CPU kernel (CUDA-only ops) that they reach there.

Each case is a small, realistic use of one public API; ``probe()`` runs every case in
a worker process and reports, per case, the CUDA-only ops that ran on the device (with
a neuron kernel or not) and the one that raised the device's "no CPU kernel" error.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

# The device's error for an op that has no CPU kernel to run; group 1 is the op.
NO_CPU_KERNEL = re.compile(r"aten::(\S+) is not supported on the neuron device: it has no CPU kernel")

DEVICE = "neuron"
CASES: dict[str, Callable[[str], object]] = {}

# Cases whose public API fails on the device for another reason than a missing kernel, and why.
REFUSED = {
    "nn.DataParallel": "its scatter needs torch._C._scatter, which only CUDA builds of torch have",
    "nn.TransformerEncoder (fast path, nested tensor)": (
        "in eval under no_grad with a padding mask and enable_nested_tensor (the default), it packs the input into a "
        "nested tensor (_nested_tensor_from_mask), and the device has dense tensors only"),
}
if not torch.neuron.is_fp8_supported():
    REFUSED["F.scaled_mm"] = ("FP8 compute needs Trainium 3: on trn2 _scaled_mm_v2 raises naming the platform and "
                              "the fix (NEURON_PLATFORM=trn3); on trn3 it runs (docs/fp8.md)")
    REFUSED["F.scaled_grouped_mm"] = ("FP8 compute needs Trainium 3: on trn2 _scaled_grouped_mm_v2 raises naming the "
                                      "platform and the fix (NEURON_PLATFORM=trn3); on trn3 it runs (docs/fp8.md)")


def case(name: str):
    def register(fn):
        if name in CASES:
            raise ValueError(f"duplicate case {name}")
        CASES[name] = fn
        return fn

    return register


def _x(dev, *shape, grad=True, dtype=torch.float32):
    return torch.randn(*shape, device=dev, dtype=dtype, requires_grad=grad)


def _module(dev, cls, *args, **kwargs):
    return cls(*args, **kwargs).to(dev)


def _simple(name: str, make: Callable[[], nn.Module], *shape: int):
    """A module applied to one random input of ``shape``."""

    @case(name)
    def run(dev):
        return make().to(dev)(_x(dev, *shape))

    return run


# ---- linear, convolution ----------------------------------------------------------
_simple("nn.Identity", nn.Identity, 2, 3)
_simple("nn.Linear", lambda: nn.Linear(4, 3), 2, 4)
_simple("nn.LazyLinear", lambda: nn.LazyLinear(3), 2, 4)
_simple("nn.Flatten", nn.Flatten, 2, 3, 4)
_simple("nn.Unflatten", lambda: nn.Unflatten(1, (2, 2)), 3, 4)


@case("nn.Bilinear")
def _(dev):
    return _module(dev, nn.Bilinear, 3, 4, 5)(_x(dev, 2, 3), _x(dev, 2, 4))


for _d in (1, 2, 3):
    _shape = (2, 4) + (6,) * _d
    _simple(f"nn.Conv{_d}d", lambda d=_d: getattr(nn, f"Conv{d}d")(4, 6, 3), *_shape)
    _simple(f"nn.Conv{_d}d(groups=in_channels)", lambda d=_d: getattr(nn, f"Conv{d}d")(4, 8, 3, groups=4), *_shape)
    _simple(f"nn.Conv{_d}d(dilation=2, padding='same')",
            lambda d=_d: getattr(nn, f"Conv{d}d")(4, 4, 3, dilation=2, padding="same", padding_mode="reflect"),
            *_shape)  # fmt: skip
    _simple(f"nn.ConvTranspose{_d}d", lambda d=_d: getattr(nn, f"ConvTranspose{d}d")(4, 2, 3, stride=2), *_shape)
    _simple(f"nn.ConvTranspose{_d}d(groups=in_channels)",
            lambda d=_d: getattr(nn, f"ConvTranspose{d}d")(4, 4, 3, groups=4), *_shape)  # fmt: skip
    _simple(f"nn.LazyConv{_d}d", lambda d=_d: getattr(nn, f"LazyConv{d}d")(3, 3), *_shape)
    _simple(f"nn.LazyConvTranspose{_d}d", lambda d=_d: getattr(nn, f"LazyConvTranspose{d}d")(3, 3), *_shape)


@case("nn.Conv2d(channels_last)")
def _(dev):
    conv = nn.Conv2d(4, 4, 3, groups=4).to(dev).to(memory_format=torch.channels_last)
    return conv(_x(dev, 2, 4, 6, 6).contiguous(memory_format=torch.channels_last))


@case("F.conv_tbc")
def _(dev):
    return F.conv_tbc(_x(dev, 5, 2, 3), _x(dev, 3, 3, 4), _x(dev, 4), 1)


# ---- pooling ----------------------------------------------------------------------
for _d in (1, 2, 3):
    _shape = (2, 3) + (8,) * _d
    _simple(f"nn.MaxPool{_d}d", lambda d=_d: getattr(nn, f"MaxPool{d}d")(2, ceil_mode=True), *_shape)
    _simple(f"nn.AvgPool{_d}d", lambda d=_d: getattr(nn, f"AvgPool{d}d")(3, stride=2, padding=1), *_shape)
    _simple(f"nn.LPPool{_d}d", lambda d=_d: getattr(nn, f"LPPool{d}d")(2, 2), *_shape)
    _simple(f"nn.AdaptiveAvgPool{_d}d", lambda d=_d: getattr(nn, f"AdaptiveAvgPool{d}d")(3), *_shape)
    _simple(f"nn.AdaptiveMaxPool{_d}d", lambda d=_d: getattr(nn, f"AdaptiveMaxPool{d}d")(3), *_shape)

    @case(f"nn.MaxUnpool{_d}d")
    def _(dev, d=_d, shape=_shape):
        out, idx = getattr(nn, f"MaxPool{d}d")(2, return_indices=True)(_x(dev, *shape))
        return getattr(nn, f"MaxUnpool{d}d")(2)(out, idx)


for _d in (2, 3):
    _simple(f"nn.FractionalMaxPool{_d}d", lambda d=_d: getattr(nn, f"FractionalMaxPool{d}d")(2, output_ratio=0.5),
            2, 3, *(8,) * _d)  # fmt: skip

# ---- padding ----------------------------------------------------------------------
for _kind in ("Reflection", "Replication", "Zero", "Circular"):
    for _d in (1, 2, 3):
        _simple(f"nn.{_kind}Pad{_d}d", lambda k=_kind, d=_d: getattr(nn, f"{k}Pad{d}d")(2), 2, 3, *(5,) * _d)
for _d in (1, 2, 3):
    _simple(f"nn.ConstantPad{_d}d", lambda d=_d: getattr(nn, f"ConstantPad{d}d")(2, 1.5), 2, 3, *(5,) * _d)

# ---- activations ------------------------------------------------------------------
for _name, _make in {
    "ELU": nn.ELU, "Hardshrink": nn.Hardshrink, "Hardsigmoid": nn.Hardsigmoid, "Hardtanh": nn.Hardtanh,
    "Hardswish": nn.Hardswish, "LeakyReLU": nn.LeakyReLU, "LogSigmoid": nn.LogSigmoid, "PReLU": nn.PReLU,
    "ReLU": nn.ReLU, "ReLU6": nn.ReLU6, "SELU": nn.SELU, "CELU": nn.CELU, "GELU": nn.GELU,
    "GELU(approximate='tanh')": lambda: nn.GELU(approximate="tanh"), "Sigmoid": nn.Sigmoid, "SiLU": nn.SiLU,
    "Mish": nn.Mish, "Softplus": nn.Softplus, "Softshrink": nn.Softshrink, "Softsign": nn.Softsign,
    "Tanh": nn.Tanh, "Tanhshrink": nn.Tanhshrink, "Threshold": lambda: nn.Threshold(0.1, 20.0), "GLU": nn.GLU,
    "Softmin": lambda: nn.Softmin(1), "Softmax": lambda: nn.Softmax(1), "Softmax2d": nn.Softmax2d,
    "LogSoftmax": lambda: nn.LogSoftmax(1), "RReLU": nn.RReLU, "RReLU.eval": lambda: nn.RReLU().eval(),
    "ChannelShuffle": lambda: nn.ChannelShuffle(2),
}.items():  # fmt: skip
    _simple(f"nn.{_name}", _make, 2, 4, 3, 4)


@case("nn.AdaptiveLogSoftmaxWithLoss")
def _(dev):
    m = _module(dev, nn.AdaptiveLogSoftmaxWithLoss, 8, 10, cutoffs=[4, 8])
    return m(_x(dev, 5, 8), torch.tensor([0, 3, 5, 9, 7], device=dev)).loss


# ---- normalization ----------------------------------------------------------------
for _d, _shape in ((1, (4, 3, 5)), (2, (4, 3, 5, 5)), (3, (4, 3, 3, 3, 3))):
    _simple(f"nn.BatchNorm{_d}d", lambda d=_d: getattr(nn, f"BatchNorm{d}d")(3), *_shape)
    _simple(f"nn.BatchNorm{_d}d.eval", lambda d=_d: getattr(nn, f"BatchNorm{d}d")(3).eval(), *_shape)
    _simple(f"nn.LazyBatchNorm{_d}d", lambda d=_d: getattr(nn, f"LazyBatchNorm{d}d")(), *_shape)
    _simple(f"nn.InstanceNorm{_d}d", lambda d=_d: getattr(nn, f"InstanceNorm{d}d")(3, affine=True,
            track_running_stats=True), *_shape)  # fmt: skip
    _simple(f"nn.LazyInstanceNorm{_d}d", lambda d=_d: getattr(nn, f"LazyInstanceNorm{d}d")(), *_shape)
_simple("nn.GroupNorm", lambda: nn.GroupNorm(2, 4), 2, 4, 3, 3)
_simple("nn.LayerNorm", lambda: nn.LayerNorm(3), 2, 4, 3)
_simple("nn.RMSNorm", lambda: nn.RMSNorm(3), 2, 4, 3)
_simple("nn.LocalResponseNorm", lambda: nn.LocalResponseNorm(2), 2, 4, 3, 3)
_simple("nn.CrossMapLRN2d", lambda: nn.CrossMapLRN2d(3), 2, 4, 3, 3)
_simple("nn.SyncBatchNorm (no process group)", lambda: nn.SyncBatchNorm(3), 4, 3, 5)


@contextlib.contextmanager
def two_rank_process_group():
    """A process group of two ranks in this process (PyTorch's fake backend, for the CPU
    and the device); the all-gather SyncBatchNorm uses sees two identical ranks."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def all_gather_single(output, input, group=None, async_op=False):
        output.copy_(input.reshape(1, -1).expand(2, -1).reshape(output.shape))

    dist.init_process_group(f"cpu:fake,{DEVICE}:fake", store=FakeStore(), rank=0, world_size=2)
    saved, dist.all_gather_single = dist.all_gather_single, all_gather_single
    try:
        yield
    finally:
        dist.all_gather_single = saved
        dist.destroy_process_group()


@case("nn.SyncBatchNorm (world size 2)")
def _(dev):
    with two_rank_process_group():
        out = nn.SyncBatchNorm(3).to(dev)(_x(dev, 4, 3, 5))
        out.sum().backward()  # within the group: the backward communicates too
        return None


# ---- recurrent --------------------------------------------------------------------
for _cls in ("RNN", "LSTM", "GRU"):
    _simple(f"nn.{_cls}", lambda c=_cls: getattr(nn, c)(3, 4, num_layers=2), 5, 2, 3)
    _simple(f"nn.{_cls}(bidirectional, batch_first)",
            lambda c=_cls: getattr(nn, c)(3, 4, bidirectional=True, batch_first=True), 2, 5, 3)  # fmt: skip
    _simple(f"nn.{_cls}Cell", lambda c=_cls: getattr(nn, f"{c}Cell")(3, 4), 2, 3)

    @case(f"nn.{_cls}(PackedSequence)")
    def _(dev, c=_cls):
        seq = nn.utils.rnn.pack_padded_sequence(_x(dev, 5, 3, 3), torch.tensor([5, 3, 2]))
        out, _ = getattr(nn, c)(3, 4).to(dev)(seq)
        return nn.utils.rnn.pad_packed_sequence(out)[0]


_simple("nn.RNN(nonlinearity='relu')", lambda: nn.RNN(3, 4, nonlinearity="relu"), 5, 2, 3)
_simple("nn.LSTM(proj_size)", lambda: nn.LSTM(3, 4, proj_size=2), 5, 2, 3)

# ---- attention, transformer -------------------------------------------------------


@case("nn.MultiheadAttention")
def _(dev):
    q = _x(dev, 2, 5, 8)
    return _module(dev, nn.MultiheadAttention, 8, 2, batch_first=True)(q, q, q)[0]


@case("nn.MultiheadAttention (fast path: eval, no_grad)")
def _(dev):
    q = _x(dev, 2, 5, 8, grad=False)
    m = _module(dev, nn.MultiheadAttention, 8, 2, batch_first=True).eval()
    with torch.no_grad():
        return m(q, q, q, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool, device=dev))[0]


@case("nn.MultiheadAttention(dropout, kdim/vdim)")
def _(dev):
    m = _module(dev, nn.MultiheadAttention, 8, 2, dropout=0.5, kdim=6, vdim=4)
    return m(_x(dev, 5, 2, 8), _x(dev, 3, 2, 6), _x(dev, 3, 2, 4))[0]


@case("nn.Transformer")
def _(dev):
    m = _module(dev, nn.Transformer, 8, 2, 1, 1, 16, batch_first=True)
    return m(_x(dev, 2, 5, 8), _x(dev, 2, 4, 8), tgt_mask=nn.Transformer.generate_square_subsequent_mask(4, device=dev))


@case("nn.TransformerEncoder")
def _(dev):
    m = _module(dev, nn.TransformerEncoder, nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 2)
    return m(_x(dev, 2, 5, 8))


@case("nn.TransformerEncoder (fast path: eval, no_grad)")
def _(dev):
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    m = _module(dev, nn.TransformerEncoder, layer, 2, enable_nested_tensor=False).eval()
    with torch.no_grad():
        return m(_x(dev, 2, 5, 8, grad=False), src_key_padding_mask=torch.zeros(2, 5, dtype=torch.bool, device=dev))


@case("nn.TransformerEncoder (fast path, nested tensor)")
def _(dev):
    m = _module(dev, nn.TransformerEncoder, nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 2).eval()
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2], device=dev)
    with torch.no_grad():
        return m(_x(dev, 2, 5, 8, grad=False), src_key_padding_mask=mask)


@case("nn.TransformerEncoderLayer(norm_first, gelu)")
def _(dev):
    return _module(dev, nn.TransformerEncoderLayer, 8, 2, 16, activation="gelu", norm_first=True)(_x(dev, 5, 2, 8))


@case("nn.TransformerDecoder")
def _(dev):
    m = _module(dev, nn.TransformerDecoder, nn.TransformerDecoderLayer(8, 2, 16, batch_first=True), 2)
    return m(_x(dev, 2, 4, 8), _x(dev, 2, 5, 8), tgt_is_causal=True,
             tgt_mask=nn.Transformer.generate_square_subsequent_mask(4, device=dev))  # fmt: skip


def _qkv(dev, heads_kv=2, dtype=torch.float32, lq=5, lk=5):
    return _x(dev, 2, 2, lq, 8, dtype=dtype), _x(dev, 2, heads_kv, lk, 8, dtype=dtype), _x(dev, 2, heads_kv, lk, 8,
                                                                                        dtype=dtype)  # fmt: skip


@case("F.scaled_dot_product_attention")
def _(dev):
    return F.scaled_dot_product_attention(*_qkv(dev))


@case("F.scaled_dot_product_attention(is_causal, dropout_p)")
def _(dev):
    return F.scaled_dot_product_attention(*_qkv(dev), is_causal=True, dropout_p=0.3)


@case("F.scaled_dot_product_attention(attn_mask, enable_gqa)")
def _(dev):
    q, k, v = _qkv(dev, heads_kv=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 5, dtype=torch.bool, device=dev).tril(),
                                          enable_gqa=True)  # fmt: skip


@case("F.scaled_dot_product_attention(bfloat16)")
def _(dev):
    return F.scaled_dot_product_attention(*_qkv(dev, dtype=torch.bfloat16), is_causal=True)


@case("torch.nn.attention.bias.causal_lower_right")
def _(dev):
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = _qkv(dev, lq=3, lk=5)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(3, 5))


@case("torch.nn.attention.sdpa_kernel(MATH)")
def _(dev):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(*_qkv(dev), is_causal=True)


@case("torch.nn.attention.varlen.varlen_attn")
def _(dev):
    from torch.nn.attention.varlen import varlen_attn

    q, k, v = (_x(dev, 6, 2, 8, dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 2, 6], dtype=torch.int32, device=dev)
    return varlen_attn(q, k, v, cu, cu, 4, 4)


@case("torch.nn.attention.varlen.varlen_attn_out")
def _(dev):
    from torch.nn.attention.varlen import varlen_attn_out

    q, k, v = (_x(dev, 6, 2, 8, dtype=torch.bfloat16, grad=False) for _ in range(3))
    cu = torch.tensor([0, 2, 6], dtype=torch.int32, device=dev)
    return varlen_attn_out(torch.empty_like(q), q, k, v, cu, cu, 4, 4)


@case("torch.nn.attention.flex_attention (eager)")
def _(dev):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(*_qkv(dev))


@case("F.multi_head_attention_forward")
def _(dev):
    m = nn.MultiheadAttention(8, 2).to(dev)
    q = _x(dev, 5, 2, 8)
    return F.multi_head_attention_forward(q, q, q, 8, 2, m.in_proj_weight, m.in_proj_bias, None, None, False, 0.0,
                                          m.out_proj.weight, m.out_proj.bias)[0]  # fmt: skip


# ---- dropout ----------------------------------------------------------------------
for _name, _make in {
    "Dropout": (nn.Dropout, 2), "Dropout1d": (nn.Dropout1d, 1), "Dropout2d": (nn.Dropout2d, 2),
    "Dropout3d": (nn.Dropout3d, 3), "AlphaDropout": (nn.AlphaDropout, 2),
    "FeatureAlphaDropout": (nn.FeatureAlphaDropout, 2), "Dropout(p=1)": (lambda _: nn.Dropout(1.0), 2),
    "Dropout(inplace)": (lambda p: nn.Dropout(p, inplace=True), 2),
}.items():  # fmt: skip
    # After a Linear, so that the dropped input is an autograd intermediate (as in a model).
    _simple(f"nn.{_name}", lambda m=_make[0]: nn.Sequential(nn.Linear(3, 3), m(0.3)), 2, 4, *(3,) * _make[1])


@case("F.dropout(bfloat16)")
def _(dev):
    return F.dropout(_x(dev, 4, 8, dtype=torch.bfloat16), 0.25)


# ---- embedding --------------------------------------------------------------------


@case("nn.Embedding(padding_idx, max_norm)")
def _(dev):
    return _module(dev, nn.Embedding, 10, 3, padding_idx=0, max_norm=1.0)(torch.tensor([[1, 0, 4]], device=dev))


@case("nn.Embedding(scale_grad_by_freq)")
def _(dev):
    return _module(dev, nn.Embedding, 10, 3, scale_grad_by_freq=True)(torch.tensor([[1, 1, 4]], device=dev))


for _mode in ("sum", "mean", "max"):

    @case(f"nn.EmbeddingBag(mode='{_mode}')")
    def _(dev, mode=_mode):
        m = _module(dev, nn.EmbeddingBag, 10, 3, mode=mode, padding_idx=0)
        return m(torch.tensor([1, 2, 4, 0, 3], device=dev), torch.tensor([0, 2], device=dev))


@case("nn.EmbeddingBag(per_sample_weights)")
def _(dev):
    m = _module(dev, nn.EmbeddingBag, 10, 3, mode="sum")
    return m(torch.tensor([[1, 2], [4, 3]], device=dev), per_sample_weights=_x(dev, 2, 2))


# ---- distances, losses ------------------------------------------------------------


@case("nn.CosineSimilarity")
def _(dev):
    return nn.CosineSimilarity()(_x(dev, 3, 4), _x(dev, 3, 4))


@case("nn.PairwiseDistance")
def _(dev):
    return nn.PairwiseDistance()(_x(dev, 3, 4), _x(dev, 3, 4))


@case("F.pdist")
def _(dev):
    return F.pdist(_x(dev, 4, 3))


@case("torch.cdist")
def _(dev):
    return torch.cdist(_x(dev, 2, 4, 3), _x(dev, 2, 5, 3))


def _labels(dev, n, classes):
    return torch.randint(0, classes, (n,), device=dev)


_LOSSES = {
    "LinearCrossEntropyLoss(bfloat16)": lambda d: _module(d, nn.LinearCrossEntropyLoss, 8, 6, dtype=torch.bfloat16)(
        _x(d, 40, 8, dtype=torch.bfloat16), _labels(d, 40, 6)),
    "L1Loss": lambda d: nn.L1Loss()(_x(d, 3, 4), _x(d, 3, 4)),
    "MSELoss": lambda d: nn.MSELoss()(_x(d, 3, 4), _x(d, 3, 4)),
    "CrossEntropyLoss": lambda d: nn.CrossEntropyLoss(ignore_index=1)(_x(d, 4, 5), _labels(d, 4, 5)),
    "CrossEntropyLoss(probabilities, label_smoothing)":
        lambda d: nn.CrossEntropyLoss(label_smoothing=0.1)(_x(d, 4, 5), _x(d, 4, 5, grad=False).softmax(1)),
    "CrossEntropyLoss(2d, weight)":
        lambda d: nn.CrossEntropyLoss(weight=torch.rand(5, device=d))(_x(d, 2, 5, 3, 3),
                                                                      torch.randint(0, 5, (2, 3, 3), device=d)),
    "NLLLoss": lambda d: nn.NLLLoss()(_x(d, 4, 5).log_softmax(1), _labels(d, 4, 5)),
    "NLLLoss2d": lambda d: nn.NLLLoss2d()(_x(d, 2, 5, 3, 3).log_softmax(1), torch.randint(0, 5, (2, 3, 3), device=d)),
    "PoissonNLLLoss": lambda d: nn.PoissonNLLLoss(full=True)(_x(d, 3, 4), torch.rand(3, 4, device=d) * 3),
    "GaussianNLLLoss": lambda d: nn.GaussianNLLLoss()(_x(d, 3, 4), _x(d, 3, 4), torch.rand(3, 4, device=d) + 0.1),
    "KLDivLoss": lambda d: nn.KLDivLoss(reduction="batchmean")(_x(d, 3, 4).log_softmax(1), torch.rand(3, 4, device=d)),
    "BCELoss": lambda d: nn.BCELoss()(_x(d, 3, 4).sigmoid(), torch.rand(3, 4, device=d)),
    "BCEWithLogitsLoss": lambda d: nn.BCEWithLogitsLoss(pos_weight=torch.rand(4, device=d))(_x(d, 3, 4),
                                                                                           torch.rand(3, 4, device=d)),
    "MarginRankingLoss": lambda d: nn.MarginRankingLoss()(_x(d, 4), _x(d, 4), torch.sign(torch.randn(4, device=d))),
    "HingeEmbeddingLoss": lambda d: nn.HingeEmbeddingLoss()(_x(d, 4), torch.sign(torch.randn(4, device=d))),
    "MultiLabelMarginLoss":
        lambda d: nn.MultiLabelMarginLoss()(_x(d, 2, 4), torch.tensor([[3, 0, -1, 1], [1, 2, 3, -1]], device=d)),
    "HuberLoss": lambda d: nn.HuberLoss()(_x(d, 3, 4), _x(d, 3, 4)),
    "SmoothL1Loss": lambda d: nn.SmoothL1Loss()(_x(d, 3, 4), _x(d, 3, 4)),
    "SoftMarginLoss": lambda d: nn.SoftMarginLoss()(_x(d, 3, 4), torch.sign(torch.randn(3, 4, device=d))),
    "MultiLabelSoftMarginLoss":
        lambda d: nn.MultiLabelSoftMarginLoss()(_x(d, 3, 4), torch.randint(0, 2, (3, 4), device=d).float()),
    "CosineEmbeddingLoss":
        lambda d: nn.CosineEmbeddingLoss()(_x(d, 3, 4), _x(d, 3, 4), torch.tensor([1, -1, 1], device=d)),
    "MultiMarginLoss": lambda d: nn.MultiMarginLoss()(_x(d, 3, 4), _labels(d, 3, 4)),
    "TripletMarginLoss": lambda d: nn.TripletMarginLoss(swap=True)(_x(d, 3, 4), _x(d, 3, 4), _x(d, 3, 4)),
    "TripletMarginWithDistanceLoss":
        lambda d: nn.TripletMarginWithDistanceLoss()(_x(d, 3, 4), _x(d, 3, 4), _x(d, 3, 4)),
    "LinearCrossEntropyLoss": lambda d: _module(d, nn.LinearCrossEntropyLoss, 8, 6)(_x(d, 4, 8), _labels(d, 4, 6)),
}  # fmt: skip
for _name, _fn in _LOSSES.items():
    case(f"nn.{_name}")(_fn)


@case("nn.CTCLoss")
def _(dev):
    log_probs = _x(dev, 12, 2, 5).log_softmax(2)
    targets = torch.randint(1, 5, (2, 4), device=dev)
    return nn.CTCLoss()(log_probs, targets, torch.tensor([12, 10]), torch.tensor([4, 3]))


@case("nn.CTCLoss(int32 CPU targets, concatenated)")
def _(dev):
    # The arguments CUDA would hand to cuDNN: int32 lengths and targets on the CPU.
    log_probs = _x(dev, 12, 2, 5).log_softmax(2)
    targets = torch.randint(1, 5, (7,), dtype=torch.int32)
    lengths = torch.tensor([12, 12], dtype=torch.int32)
    return F.ctc_loss(log_probs, targets, lengths, torch.tensor([4, 3], dtype=torch.int32), zero_infinity=True)


@case("F.linear_cross_entropy")
def _(dev):
    return F.linear_cross_entropy(_x(dev, 4, 8), _x(dev, 6, 8), _labels(dev, 4, 6))


# ---- vision, resampling -----------------------------------------------------------
_simple("nn.PixelShuffle", lambda: nn.PixelShuffle(2), 2, 8, 3, 3)
_simple("nn.PixelUnshuffle", lambda: nn.PixelUnshuffle(2), 2, 2, 4, 4)
_simple("nn.UpsamplingNearest2d", lambda: nn.UpsamplingNearest2d(scale_factor=2), 2, 3, 4, 4)
_simple("nn.UpsamplingBilinear2d", lambda: nn.UpsamplingBilinear2d(scale_factor=2), 2, 3, 4, 4)
_simple("nn.Fold", lambda: nn.Fold((4, 5), 2), 2, 12, 12)
_simple("nn.Unfold", lambda: nn.Unfold(2, dilation=1, padding=1, stride=2), 2, 3, 4, 4)
for _mode, _dims in (("nearest", (1, 2, 3)), ("nearest-exact", (1, 2, 3)), ("linear", (1,)), ("bilinear", (2,)),
                     ("bicubic", (2,)), ("trilinear", (3,)), ("area", (1, 2, 3))):  # fmt: skip
    for _d in _dims:
        _simple(f"nn.Upsample(mode='{_mode}', {_d}d)", lambda m=_mode: nn.Upsample(scale_factor=1.5, mode=m),
                2, 3, *(4,) * _d)  # fmt: skip
for _mode in ("bilinear", "bicubic"):

    @case(f"F.interpolate(mode='{_mode}', antialias=True)")
    def _(dev, mode=_mode):
        return F.interpolate(_x(dev, 2, 3, 8, 8), size=(5, 3), mode=mode, antialias=True)


@case("F.interpolate(align_corners, recompute_scale_factor)")
def _(dev):
    return F.interpolate(_x(dev, 2, 3, 5, 5), scale_factor=1.7, mode="bilinear", align_corners=True,
                         recompute_scale_factor=True)  # fmt: skip


for _mode in ("bilinear", "nearest", "bicubic"):
    for _pad in ("zeros", "border", "reflection"):

        @case(f"F.grid_sample(mode='{_mode}', padding_mode='{_pad}', 4d)")
        def _(dev, mode=_mode, pad=_pad):
            grid = torch.rand(2, 3, 3, 2, device=dev) * 2 - 1
            return F.grid_sample(_x(dev, 2, 3, 4, 4), grid.requires_grad_(), mode=mode, padding_mode=pad,
                                 align_corners=False)  # fmt: skip


for _mode in ("bilinear", "nearest"):

    @case(f"F.grid_sample(mode='{_mode}', 5d)")
    def _(dev, mode=_mode):
        grid = (torch.rand(2, 3, 3, 3, 3, device=dev) * 2 - 1).requires_grad_()
        return F.grid_sample(_x(dev, 2, 3, 4, 4, 4), grid, mode=mode, align_corners=True)


@case("F.affine_grid + F.grid_sample (2d)")
def _(dev):
    theta = _x(dev, 2, 2, 3)
    return F.grid_sample(_x(dev, 2, 3, 4, 4), F.affine_grid(theta, [2, 3, 5, 5], align_corners=False),
                         align_corners=False)  # fmt: skip


@case("F.affine_grid (3d)")
def _(dev):
    return F.affine_grid(_x(dev, 2, 3, 4), [2, 3, 4, 4, 4], align_corners=True)


for _pad_mode in ("constant", "reflect", "replicate", "circular"):

    @case(f"F.pad(mode='{_pad_mode}')")
    def _(dev, mode=_pad_mode):
        return F.pad(_x(dev, 2, 3, 4, 4), (1, 2, 2, 1), mode=mode)


# ---- other functionals ------------------------------------------------------------


@case("F.normalize")
def _(dev):
    return F.normalize(_x(dev, 3, 4), dim=1)


@case("F.gumbel_softmax(hard)")
def _(dev):
    return F.gumbel_softmax(_x(dev, 3, 4), hard=True)


@case("F.one_hot")
def _(dev):
    return F.one_hot(torch.tensor([0, 2, 1], device=dev), 3).float()


@case("F.rrelu(training)")
def _(dev):
    return F.rrelu(_x(dev, 3, 4), training=True)


@case("F.fractional_max_pool2d(output_size)")
def _(dev):
    return F.fractional_max_pool2d(_x(dev, 2, 3, 7, 7), 3, output_size=4)


@case("F.grouped_mm")
def _(dev):
    return F.grouped_mm(_x(dev, 2, 8, 16, dtype=torch.bfloat16), _x(dev, 2, 16, 8, dtype=torch.bfloat16))


@case("F.scaled_mm")
def _(dev):
    a = torch.randn(16, 32, device=dev).to(torch.float8_e4m3fn)
    b = torch.randn(16, 32, device=dev).to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=dev)
    return F.scaled_mm(a, b, one, F.ScalingType.TensorWise, one, F.ScalingType.TensorWise).float()


@case("F.scaled_grouped_mm")
def _(dev):
    a = torch.randn(2, 16, 32, device=dev).to(torch.float8_e4m3fn)
    b = torch.randn(2, 16, 32, device=dev).to(torch.float8_e4m3fn).transpose(-2, -1)
    sa, sb = torch.ones(2, 16, device=dev), torch.ones(2, 16, device=dev)
    return F.scaled_grouped_mm(a, b, sa, F.ScalingType.RowWise, sb, F.ScalingType.RowWise).float()


# ---- nn.utils ---------------------------------------------------------------------


@case("nn.utils.clip_grad_norm_")
def _(dev):
    m = nn.Linear(4, 3).to(dev)
    m(_x(dev, 2, 4)).sum().backward()
    return nn.utils.clip_grad_norm_(m.parameters(), 0.1)


@case("nn.utils.parametrizations.weight_norm")
def _(dev):
    return nn.utils.parametrizations.weight_norm(nn.Linear(4, 3)).to(dev)(_x(dev, 2, 4))


@case("nn.utils.parametrizations.spectral_norm")
def _(dev):
    return nn.utils.parametrizations.spectral_norm(nn.Linear(4, 3)).to(dev)(_x(dev, 2, 4))


@case("nn.utils.parametrizations.orthogonal")
def _(dev):
    return nn.utils.parametrizations.orthogonal(nn.Linear(4, 4)).to(dev)(_x(dev, 2, 4))


@case("nn.DataParallel")
def _(dev):
    return nn.DataParallel(nn.Linear(4, 3).to(dev))(_x(dev, 4, 4))


@case("torch.utils.checkpoint")
def _(dev):
    from torch.utils.checkpoint import checkpoint

    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.3)).to(dev)
    return checkpoint(m, _x(dev, 2, 4), use_reentrant=False)


for _opt, _kw in (("SGD", {"momentum": 0.9}), ("Adam", {}), ("AdamW", {}), ("Adagrad", {})):
    for _impl in ("foreach", "fused"):

        @case(f"torch.optim.{_opt}({_impl}=True)")
        def _(dev, opt=_opt, kw=_kw, impl=_impl):
            m = nn.Linear(4, 3).to(dev)
            m(_x(dev, 2, 4)).sum().backward()
            getattr(torch.optim, opt)(m.parameters(), lr=0.1, **kw, **{impl: True}).step()
            return m.weight


# ---- running the cases ------------------------------------------------------------


def _differentiable(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out] if out.requires_grad and (out.is_floating_point() or out.is_complex()) else []
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _differentiable(o)]
    return []


@dataclass(frozen=True)
class ProbeResult:
    """One case. ``reached``: the CUDA-only ops it ran on the device, kernel or not;
    ``op``: the one that stopped it for want of a kernel (``phase``: whether the case
    or the backward of its result raised);
    ``error``: any other failure."""

    api: str
    reached: tuple[str, ...] = ()
    op: str | None = None
    phase: str = ""
    error: str = ""


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300] if text else ''}"


def run_case(api: str, device: str = DEVICE) -> ProbeResult:
    from cuda_only_ops import cuda_only_ops

    cuda_only = {o.name for o in cuda_only_ops()}
    on_device = device != "cpu"
    torch.manual_seed(0)
    if on_device:
        torch.neuron.clear_op_tracking()
    phase, op, error = "forward", None, ""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecations and the like, not what this looks for
            out = CASES[api](device)
            phase = "backward"
            grads = _differentiable(out)
            if grads:
                sum(t.float().sum() for t in grads).backward()
    except NotImplementedError as e:
        found = NO_CPU_KERNEL.search(str(e))
        op, error = (found.group(1), "") if found else (None, _first_line(e))
    except Exception as e:  # noqa: BLE001 - recorded, not ours to judge here
        error = _first_line(e)
    ran = {k.removeprefix("aten::") for k in torch.neuron.get_executed_ops()} if on_device else set()
    reached = tuple(sorted(ran & cuda_only | ({op} if op else set())))
    return ProbeResult(api, reached, op, phase if op else "", error)


def probe(apis=None, *, workers: int | None = None, timeout: float = 120.0) -> list[ProbeResult]:
    """Run the cases (all, or ``apis``) in worker processes; a crash or hang becomes an error."""
    from torch_neuronx.testing._pool import run_isolated

    results = []
    for o in run_isolated(run_case, list(apis or CASES), workers=workers, timeout=timeout):
        results.append(o.value if o.kind == "ok" else ProbeResult(o.item, error=f"{o.kind}: {o.error[:300]}"))
    return sorted(results, key=lambda r: r.api)
