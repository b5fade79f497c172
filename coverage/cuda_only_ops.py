"""ATen ops that have a CUDA kernel but no CPU kernel, and which of them public
``torch.nn`` APIs reach on the ``neuron`` device.

The device runs ATen's CPU kernel for every op it has no kernel of its own for, so an
op with only a CUDA kernel raises ``NotImplementedError`` naming it. PyTorch treats
PrivateUse1 devices like CUDA in a few places (``is_privateuseone()`` next to
``is_cuda()``, or Python that only refuses devices other than CUDA and PrivateUse1),
and that is how such ops are reached from ordinary ``nn`` code.

The op list comes from torchgen's packaged ``native_functions.yaml`` of the installed
torch; which ops are reachable, and from where, is recorded in :data:`REACHABLE` and
checked by running public APIs on the device (``--probe``; ``tests/device/test_cuda_only_ops.py``).

    python coverage/cuda_only_ops.py           # the Markdown section (in docs/coverage/ops.md)
    python coverage/cuda_only_ops.py --list    # op names, one a line
    python coverage/cuda_only_ops.py --probe   # which CUDA-only ops public APIs reach on neuron
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from functools import cache

import yaml

COMPOSITE_PREFIX = "Composite"  # CompositeImplicitAutograd, CompositeExplicitAutograd[NonFunctional], ...
NEURON_ERROR = "NotImplementedError naming the op"

# Ops the neuron backend implements itself (csrc/aten); every other CUDA-only op raises.
NEURON_KERNELS = frozenset({
    "_thnn_fused_lstm_cell", "_thnn_fused_lstm_cell_backward_impl",
    "_thnn_fused_gru_cell", "_thnn_fused_gru_cell_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "record_stream", "_scaled_grouped_mm", "_scaled_grouped_mm_v2",
    "batch_norm_stats", "batch_norm_gather_stats", "batch_norm_gather_stats_with_counts", "batch_norm_elemt",
    "batch_norm_elemt.out", "batch_norm_backward_reduce", "batch_norm_backward_elemt",
})  # fmt: skip


@dataclass(frozen=True)
class Reach:
    """How a public API reaches an op on a PrivateUse1 device."""

    api: str
    route: str  # the code that sends it there
    cases: tuple[str, ...]  # _nn_probe cases that reach it
    after: tuple[str, ...] = ()  # CUDA-only ops the same call runs first (each must have a kernel for this one to run)


_LSTM_CASES = ("nn.LSTM", "nn.LSTMCell", "nn.LSTM(bidirectional, batch_first)", "nn.LSTM(PackedSequence)",
               "nn.LSTM(proj_size)")  # fmt: skip
_GRU_CASES = ("nn.GRU", "nn.GRUCell", "nn.GRU(bidirectional, batch_first)", "nn.GRU(PackedSequence)")
_SYNC_BN = ("nn.SyncBatchNorm (world size 2)",)
_SDPA_CASES = ("F.scaled_dot_product_attention", "F.scaled_dot_product_attention(bfloat16)",
               "torch.nn.attention.bias.causal_lower_right")
_SYNC_BN_API = "nn.SyncBatchNorm in training with a process group of more than one rank"
_SYNC_BN_ROUTE = (
    "torch/nn/modules/batchnorm.py: SyncBatchNorm.forward accepts the PrivateUse1 device type and runs "
    "torch/nn/modules/_functions.py SyncBatchNorm"
)
_CELL_ROUTE = (
    "aten/src/ATen/native/RNN.cpp: struct {cell} (run by at::{seq} for nn.{seq_cls} and by at::{fn} for nn.{cell}) "
    "takes the fused kernel when `input.is_cuda() || input.is_xpu() || input.is_privateuseone()`"
)
_CELL_BACKWARD_ROUTE = (
    "the autograd formula of {fwd} (tools/autograd/derivatives.yaml), which calls {call} when the backward builds "
    "no graph (with create_graph=True a differentiable composite backward runs instead)"
)

REACHABLE: dict[str, Reach] = {
    "_thnn_fused_lstm_cell": Reach(
        "nn.LSTM, nn.LSTMCell (every configuration: layers, bidirectional, proj_size, PackedSequence)",
        _CELL_ROUTE.format(cell="LSTMCell", seq="lstm", seq_cls="LSTM", fn="lstm_cell"), _LSTM_CASES),
    "_thnn_fused_lstm_cell_backward_impl": Reach(
        "backward of nn.LSTM, nn.LSTMCell",
        _CELL_BACKWARD_ROUTE.format(fwd="_thnn_fused_lstm_cell",
                                    call="_thnn_fused_lstm_cell_backward (composite), which calls this op"),
        _LSTM_CASES, after=("_thnn_fused_lstm_cell",)),
    "_thnn_fused_gru_cell": Reach(
        "nn.GRU, nn.GRUCell (every configuration: layers, bidirectional, PackedSequence)",
        _CELL_ROUTE.format(cell="GRUCell", seq="gru", seq_cls="GRU", fn="gru_cell"), _GRU_CASES),
    "_thnn_fused_gru_cell_backward": Reach(
        "backward of nn.GRU, nn.GRUCell",
        _CELL_BACKWARD_ROUTE.format(fwd="_thnn_fused_gru_cell", call="this op"),
        _GRU_CASES, after=("_thnn_fused_gru_cell",)),
    "batch_norm_stats": Reach(_SYNC_BN_API, _SYNC_BN_ROUTE, _SYNC_BN),
    "batch_norm_gather_stats_with_counts": Reach(_SYNC_BN_API, _SYNC_BN_ROUTE, _SYNC_BN, after=("batch_norm_stats",)),
    "batch_norm_elemt": Reach(_SYNC_BN_API, _SYNC_BN_ROUTE, _SYNC_BN,
                              after=("batch_norm_stats", "batch_norm_gather_stats_with_counts")),
    "batch_norm_backward_reduce": Reach(
        f"backward of {_SYNC_BN_API}", _SYNC_BN_ROUTE, _SYNC_BN,
        after=("batch_norm_stats", "batch_norm_gather_stats_with_counts", "batch_norm_elemt")),
    "batch_norm_backward_elemt": Reach(
        f"backward of {_SYNC_BN_API}", _SYNC_BN_ROUTE, _SYNC_BN,
        after=("batch_norm_stats", "batch_norm_gather_stats_with_counts", "batch_norm_elemt",
               "batch_norm_backward_reduce")),
    "_flash_attention_forward": Reach(
        "torch.nn.attention.varlen.varlen_attn",
        "torch/nn/attention/varlen.py: _varlen_attn takes cuDNN only for CUDA queries, this op on any other device",
        ("torch.nn.attention.varlen.varlen_attn",)),
    "_flash_attention_backward": Reach(
        "backward of torch.nn.attention.varlen.varlen_attn",
        "torch/nn/attention/varlen.py: _varlen_attn_backward, on every device but CUDA with cuDNN",
        ("torch.nn.attention.varlen.varlen_attn",), after=("_flash_attention_forward",)),
    "_flash_attention_forward_no_dropout_inplace": Reach(
        "torch.nn.attention.varlen.varlen_attn_out",
        "torch/nn/attention/varlen.py: _varlen_attn_out calls it on every device that is not CUDA with cuDNN",
        ("torch.nn.attention.varlen.varlen_attn_out",)),
    "_scaled_dot_product_efficient_attention": Reach(
        "F.scaled_dot_product_attention (and modules built on it) where the CPU would pick its flash kernel",
        "aten/src/ATen/native/transformers/attention.cpp: scaled_dot_product_attention asks the PrivateUse1 "
        "_fused_sdp_choice stub (csrc/aten/attention.cpp answers efficient_attention) and calls this op",
        _SDPA_CASES),
    "_scaled_dot_product_efficient_attention_backward": Reach(
        "backward of F.scaled_dot_product_attention",
        "the autograd formula of _scaled_dot_product_efficient_attention (tools/autograd/derivatives.yaml)",
        _SDPA_CASES, after=("_scaled_dot_product_efficient_attention",)),
    "_scaled_grouped_mm_v2": Reach(
        "torch.nn.functional.scaled_grouped_mm",
        "torch/nn/functional.py: scaled_grouped_mm calls torch._scaled_grouped_mm_v2 on any device",
        ("F.scaled_grouped_mm",)),
}  # fmt: skip

# What the nearest public API runs on neuron instead, for ops a reader would look for.
_NOT_REACHED = "not reachable: only on CUDA-specific branches"
NOTES: dict[str, str] = {
    "_fused_dropout": "nn.Dropout and F.dropout run native_dropout on neuron",
    "_masked_scale": "nn.Dropout and F.dropout run native_dropout on neuron",
    "_fused_rms_norm_backward": "nn.RMSNorm decomposes (CompositeImplicitAutograd) on neuron",
    "_use_cudnn_ctc_loss": "nn.CTCLoss runs _ctc_loss on neuron, also with int32 CPU targets",
    "_cudnn_ctc_loss": "nn.CTCLoss runs _ctc_loss on neuron, also with int32 CPU targets",
    "cudnn_grid_sampler": "F.grid_sample runs grid_sampler_2d/3d on neuron",
    "cudnn_affine_grid_generator": "F.affine_grid decomposes on neuron",
    "cudnn_batch_norm": "nn.BatchNorm* run native_batch_norm on neuron",
    "_conv_depthwise2d": "depthwise nn.Conv2d runs the neuron convolution kernel (CPU's algorithm choice)",
    "conv_depthwise3d": "depthwise nn.Conv3d runs the neuron convolution kernel (CPU's algorithm choice)",
    "_scaled_dot_product_flash_attention": (
        "F.scaled_dot_product_attention runs _scaled_dot_product_efficient_attention on neuron where the CPU "
        "would run its flash kernel, else the CPU's choice; "
        "nn.attention.bias.causal_lower_right uses it only when can_use_flash_attention, which needs CUDA"),
    "_efficient_attention_forward": (
        "nn.attention.bias.causal_lower_right uses it only when can_use_efficient_attention, which needs CUDA"),
    "mm.dtype": "torch.mm(..., out_dtype=) itself; nn.LinearCrossEntropyLoss mixes dtypes in its mm only on CUDA",
    "mm.dtype_out": "torch.mm(..., out_dtype=, out=) itself; nn.LinearCrossEntropyLoss uses it only on CUDA",
    "bmm.dtype": "torch.bmm(..., out_dtype=) itself",
    "bmm.dtype_out": "torch.bmm(..., out_dtype=, out=) itself",
    "addmm.dtype": "torch.addmm(..., out_dtype=) itself",
    "addmm.dtype_out": "torch.addmm(..., out_dtype=, out=) itself",
    "baddbmm.dtype": "torch.baddbmm(..., out_dtype=) itself",
    "baddbmm.dtype_out": "torch.baddbmm(..., out_dtype=, out=) itself",
    "_scaled_grouped_mm": (
        "torch._scaled_grouped_mm itself (MoE code calling it directly): native on trn3, refused on trn2 "
        "(docs/fp8.md); F.scaled_grouped_mm runs _scaled_grouped_mm_v2, native too"),
    "batch_norm_gather_stats": (
        "torch.batch_norm_gather_stats itself (one count for every rank); nn.SyncBatchNorm runs "
        "batch_norm_gather_stats_with_counts"),
    "batch_norm_elemt.out": "torch.batch_norm_elemt(..., out=) itself",
    "record_stream": (
        "Tensor.record_stream itself; nn.DataParallel's Scatter would record the device's streams, but fails before "
        "that on neuron: torch._C._scatter exists only in CUDA builds of torch"),
}  # fmt: skip


@dataclass(frozen=True)
class CudaOnlyOp:
    name: str  # "op" or "op.overload"
    schema: str
    backends: tuple[str, ...]  # dispatch keys with a kernel
    category: str
    delegate: str | None = None  # the structured out= op whose kernels this op uses

    @property
    def reach(self) -> Reach | None:
        return REACHABLE.get(self.name)

    @property
    def reachable_from(self) -> str:
        if self.reach:
            return self.reach.api
        note = NOTES.get(self.name)
        return f"{_NOT_REACHED}; {note}" if note else _NOT_REACHED

    @property
    def neuron(self) -> str:
        return "kernel" if self.name in NEURON_KERNELS else NEURON_ERROR


def native_functions_path() -> str:
    import torchgen

    return os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native", "native_functions.yaml")


def op_name(entry: dict) -> str:
    return entry["func"].split("(", 1)[0].strip()


def declared_keys(entry: dict) -> set[str]:
    """Dispatch keys an entry gives kernels for itself. A key of the ``dispatch:`` map may
    name several keys separated by commas; an entry without a map (and without a
    structured delegate) is implicitly CompositeImplicitAutograd; a ufunc op has CPU and
    CUDA kernels generated from its inner loops."""
    keys = {k.strip() for spec in (entry.get("dispatch") or {}) for k in str(spec).split(",") if k.strip()}
    if "ufunc_inner_loop" in entry:
        keys |= {"CPU", "CUDA"}
    if "dispatch" not in entry and "structured_delegate" not in entry:
        keys.add("CompositeImplicitAutograd")
    return keys


def kernel_keys(entries: list[dict]) -> dict[str, frozenset[str]]:
    """Every op's dispatch keys with a kernel, structured delegates resolved: functional
    and in-place variants get the kernels of the out= op they delegate to."""
    own = {op_name(e): declared_keys(e) for e in entries}
    delegates = {op_name(e): e["structured_delegate"] for e in entries if "structured_delegate" in e}

    def resolve(name: str, seen: tuple[str, ...] = ()) -> set[str]:
        if name in seen:
            raise ValueError(f"structured_delegate cycle: {' -> '.join(seen + (name,))}")
        target = delegates.get(name)
        return own[name] | (resolve(target, seen + (name,)) if target else set())

    return {name: frozenset(resolve(name)) for name in own}


def is_cuda_only(keys: frozenset[str] | set[str]) -> bool:
    return "CUDA" in keys and "CPU" not in keys and not any(k.startswith(COMPOSITE_PREFIX) for k in keys)


# Layout-specific kernels: the device has no tensors of these layouts, so a CUDA-only
# kernel among them is counted apart.
LAYOUT_KEYS = {"SparseCUDA": "SparseCPU", "SparseCsrCUDA": "SparseCsrCPU", "NestedTensorCUDA": "NestedTensorCPU",
               "QuantizedCUDA": "QuantizedCPU"}  # fmt: skip


def layout_cuda_only_ops(path: str | None = None) -> list[str]:
    """Ops with a sparse, nested or quantized CUDA kernel but no CPU counterpart for that
    layout (and no composite kernel), leaving out those :func:`cuda_only_ops` lists."""
    keys = _kernel_keys(path or native_functions_path())
    return [
        name for name, ks in keys.items()
        if not is_cuda_only(ks) and not any(k.startswith(COMPOSITE_PREFIX) for k in ks)
        and any(cuda in ks and cpu not in ks for cuda, cpu in LAYOUT_KEYS.items())
    ]  # fmt: skip


# First match wins; checked against the op name (base name and overload).
_CATEGORIES = (
    ("cudnn", ("cudnn",)),
    ("miopen", ("miopen",)),
    ("cufft", ("cufft",)),
    ("nested", ("_nested",)),
    ("sparse", ("sparse", "_cslt_")),
    ("quantized", ("quantized",)),
    ("low-precision matmul", ("int4pack", "_mixed_dtypes_linear", "_scaled_grouped_mm")),
    ("attention", ("attention", "mem_eff")),
    ("rnn", ("_thnn_fused",)),
    ("sync batch norm", ("batch_norm_",)),
    ("random", ("_philox", "dropout", "_masked_scale")),
    ("convolution", ("conv_depthwise",)),
    ("matmul", ("mm.dtype",)),
    ("normalization", ("rms_norm",)),
    ("streams", ("record_stream",)),
)


def category(name: str) -> str:
    for label, needles in _CATEGORIES:
        if any(n in name for n in needles):
            return label
    return "other"


@cache
def _entries(path: str) -> list[dict]:
    with open(path) as f:
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@cache
def _kernel_keys(path: str) -> dict[str, frozenset[str]]:
    return kernel_keys(_entries(path))


@cache
def _cuda_only_ops(path: str) -> tuple[CudaOnlyOp, ...]:
    entries, keys = _entries(path), _kernel_keys(path)
    return tuple(
        CudaOnlyOp(op_name(e), e["func"], tuple(sorted(keys[op_name(e)])), category(op_name(e)),
                   e.get("structured_delegate"))
        for e in entries
        if is_cuda_only(keys[op_name(e)])
    )  # fmt: skip


def cuda_only_ops(path: str | None = None) -> list[CudaOnlyOp]:
    """The ops of ``native_functions.yaml`` (default: the installed torch's) with a CUDA
    kernel and neither a CPU nor a composite kernel, in file order."""
    return list(_cuda_only_ops(path or native_functions_path()))


def reachable_ops() -> frozenset[str]:
    """CUDA-only ops that a public ``torch.nn`` API reaches on a PrivateUse1 device."""
    return frozenset(REACHABLE)


def markdown(ops: list[CudaOnlyOp] | None = None) -> str:
    import torch

    ops = cuda_only_ops() if ops is None else ops
    order = list(REACHABLE)
    reached = sorted((o for o in ops if o.reach), key=lambda o: order.index(o.name))
    rest = sorted((o for o in ops if not o.reach), key=lambda o: (o.category, o.name))
    lines = [
        "## CUDA-only aten ops on the `neuron` device",
        "",
        f"Ops of PyTorch {torch.__version__}'s `native_functions.yaml` with a CUDA kernel and neither a CPU kernel nor "
        f"a `Composite*` one (counting the kernels of an op's structured delegate): **{len(ops)}**. The device runs "
        "ATen's CPU kernel for every op it has no kernel of its own for, so these raise `NotImplementedError` naming "
        "the op, unless neuron implements them. PyTorch routes PrivateUse1 devices like CUDA in a few places; "
        f"**{len(reached)}** of these ops are reachable that way from public `torch.nn` APIs, and are listed first "
        "(with the code that routes them, and the CUDA-only ops the same call runs before them); the rest are called "
        "only on CUDA-specific branches, or by calling the op itself. Autogenerated "
        "`out=` variants of these ops have a CompositeExplicitAutograd kernel that calls the op, so they are not "
        f"listed; nor are the {len(layout_cuda_only_ops())} ops whose sparse, nested or quantized CUDA kernel has no "
        "CPU counterpart (`layout_cuda_only_ops()`): `neuron` has no tensors of those layouts.",
        "",
        "Regenerate: `make coverage-ops` (this section alone: `python coverage/cuda_only_ops.py`). "
        "`python coverage/cuda_only_ops.py --probe` runs "
        "public `torch.nn` APIs forward and backward on `neuron` and reports the CUDA-only ops they reach; "
        "`tests/device/test_cuda_only_ops.py` checks the reachable ones.",
        "",
        "| op | category | reachable from | neuron |",
        "|---|---|---|---|",
    ]
    for o in reached:
        r = o.reach
        before = f" Runs after {', '.join(f'`{a}`' for a in r.after)}." if r.after else ""
        lines.append(f"| `{o.name}` | {o.category} | {r.api}. Via {_md(r.route)}.{before} | {o.neuron} |")
    for o in rest:
        lines.append(f"| `{o.name}` | {o.category} | {_md(o.reachable_from)} | {o.neuron} |")
    from _nn_probe import REFUSED

    lines += ["", "Public APIs of the probe that fail on `neuron` for another reason, before they could reach any of "
              "these ops:", ""]  # fmt: skip
    lines += [f"- `{api}`: {why}." for api, why in REFUSED.items()]
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def _print_probe(workers: int | None) -> int:
    import _nn_probe

    cuda_only = {o.name for o in cuda_only_ops()}
    results = _nn_probe.probe(workers=workers)
    found: dict[str, list[str]] = {}
    for r in results:
        for op in r.reached:
            found.setdefault(op, []).append(r.api)
        if r.error:
            print(f"error  {r.api}: {r.error}")
    for op in sorted(found):
        print(f"{'reached' if op in cuda_only else 'reached (not CUDA-only?)'}  {op}  <- {', '.join(found[op])}")
    unexplained = sorted(set(found) - set(REACHABLE))
    print(f"{len(results)} cases, {len(found)} CUDA-only ops reached; not in REACHABLE: {unexplained or 'none'}")
    return 1 if unexplained else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python coverage/cuda_only_ops.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--markdown", action="store_true", help="the Markdown report (the default)")
    mode.add_argument("--list", action="store_true", help="op names, one a line, reachable ones marked")
    mode.add_argument("--probe", action="store_true", help="run public nn APIs on neuron; report the ops they reach")
    parser.add_argument("--workers", type=int, default=None, help="worker processes for --probe")
    args = parser.parse_args(argv)
    if args.probe:
        return _print_probe(args.workers)
    if args.list:
        for o in cuda_only_ops():
            print(f"{o.name}\t{o.category}\t{'reachable' if o.reach else ''}")
        return 0
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
