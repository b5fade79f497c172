"""Cost of one op of the step on one rank of a platform.

- Matmuls, attention, norms and softmax: the engine model of our shipped NKI kernels at the op's
  shapes (``kernel_time`` in nki/_estimate.py, through the one seam ``kernel_cost`` below). The
  engine model is the only source of efficiency for these ops.
- Element-wise ops and reductions: the engine model of small streaming NKI kernels (_elementwise.py).
- Copies, gathers, concatenations: DMA and HBM traffic.
- Views and metadata: free.
Collectives are costed in _collectives.py; GPU comparators in _gpu.py.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from torch_neuronx.estimate import _facts
from torch_neuronx.estimate._capture import Op
from torch_neuronx.estimate._errors import EstimateError

# Copies (gathers, concatenations, FSDP's copy-in/out) move through DMA: every byte is read and written
# once at the rank's share of HBM / DMA bandwidth (nki/deep-dives/nki_perf_guide.rst: HBM->HBM copies).
RULES = {"copy_passes": 1}

VIEW_OPS = {
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "as_strided", "slice", "select",
    "alias", "detach", "unsqueeze", "squeeze", "split", "split_with_sizes", "chunk", "unbind", "narrow",
    "lift_fresh", "_reshape_alias", "view_as", "unflatten", "flatten", "expand_as", "empty", "empty_like",
    "empty_strided", "new_empty", "new_empty_strided", "_local_scalar_dense", "set_", "resize_", "sym_size",
    "sym_stride", "sym_numel", "is_same_size", "_has_compatible_shallow_copy_type", "_to_copy_meta",
    "record_stream", "wait_tensor", "zeros_like_meta", "_pin_memory", "_nested_tensor_from_mask",
    "scalar_tensor", "_assert_async", "_functional_assert_async", "copy_meta", "contiguous_meta",
}
MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "matmul", "mv", "addmv", "dot", "linear",
              "_int_mm", "_weight_int8pack_mm"}
ATTENTION_FWD = {"_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
                 "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                 "_flash_attention_forward", "_efficient_attention_forward", "flash_attention"}
NORM_OPS = {"native_layer_norm", "_fused_rms_norm", "rms_norm", "native_group_norm", "native_batch_norm",
            "_native_batch_norm_legit", "_native_batch_norm_legit_no_training"}
SOFTMAX_OPS = {"_softmax", "_log_softmax", "softmax", "log_softmax", "_safe_softmax"}
COPY_OPS = {"_to_copy", "copy_", "clone", "cat", "stack", "index_select", "embedding", "embedding_dense_backward",
            "gather", "scatter", "scatter_add", "scatter_add_", "scatter_", "index", "index_put", "index_put_",
            "_index_put_impl_", "slice_backward", "select_backward", "constant_pad_nd", "contiguous", "repeat",
            "repeat_interleave", "_foreach_copy_", "roll", "flip", "split_with_sizes_copy", "all_gather_copy_in",
            "chunk_cat", "index_add", "index_add_", "masked_scatter", "unfold", "col2im", "im2col", "pad", "tril",
            "triu", "fill_", "zero_", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros",
            "new_ones", "new_full", "arange", "_unsafe_index", "_unsafe_index_put", "narrow_copy", "diagonal_copy",
            "t_copy", "transpose_copy", "permute_copy", "expand_copy", "view_copy", "as_strided_copy",
            "as_strided_scatter", "slice_scatter", "select_scatter", "expand_copy", "unsqueeze_copy"}
# Element-wise ops that run on ScalarE's activation tables rather than on VectorE.
SCALAR_OPS = {"exp", "exp_", "exp2", "log", "log_", "log1p", "tanh", "tanh_", "sigmoid", "sigmoid_", "silu",
              "silu_", "gelu", "gelu_", "rsqrt", "rsqrt_", "sqrt", "sqrt_", "sin", "cos", "pow", "pow_", "erf",
              "erfinv", "softplus", "silu_backward", "gelu_backward", "tanh_backward", "sigmoid_backward",
              "reciprocal", "_foreach_sqrt", "_foreach_sqrt_", "expm1", "mish", "elu", "_foreach_pow",
              "_foreach_exp", "hardswish", "logit", "atan", "asin", "acos", "sinh", "cosh"}


def base_name(op_name: str) -> str:
    """'aten.mm.default' -> 'mm'; 'inductor.pointwise' -> 'pointwise'."""
    parts = op_name.split(".")
    return parts[1] if len(parts) >= 2 else parts[0]


@dataclass(frozen=True)
class Target:
    """One rank of a platform: its rates and capacity (a logical NeuronCore, or a GPU)."""

    name: str
    label: str
    kind: str  # "trainium" or "gpu"
    facts: dict
    lnc: int  # physical cores per rank
    ranks_per_chip: int
    chips_per_instance: int
    instance: str
    hbm_capacity: int  # bytes per rank
    hbm_bw: float  # bytes/s per rank
    dma_bw: float  # bytes/s per rank
    bf16_flops: float  # peak per rank, FLOP/s
    fp8_flops: float
    link_bw_chip: float  # bytes/s per chip over NeuronLink / NVLink
    link_dims: int
    link_latency: float  # s
    efa_bw_instance: float  # bytes/s per instance
    efa_latency: float  # s

    @property
    def ranks_per_instance(self) -> int:
        return self.ranks_per_chip * self.chips_per_instance

    def peak_flops(self, dtype: str) -> float:
        return self.fp8_flops if dtype in ("fp8", "mxfp8") else self.bf16_flops


@functools.lru_cache(maxsize=None)
def target(name: str) -> Target:
    name = name.lower()
    if name in _facts.GPUS:
        from torch_neuronx.estimate._gpu import gpu_target

        return gpu_target(name)
    f = _facts.chip(name)
    # LNC: AWS's default groups two physical NeuronCore-v3/v4 into one logical core; NeuronCore-v2
    # chips run one rank per physical core.
    lnc = 2 if f["nc_version"] >= 3 else 1
    rpc = f["physical_cores_per_chip"] // lnc
    if not f.get("chips_per_instance"):
        raise EstimateError("this build's platform model has no instance facts (chips per instance, EFA); "
                            "rebuild with: flock /tmp/neuron-build.lock make build")
    link = f["link_tbps"] * 1e12
    return Target(
        name=name, label=f"{name} ({f['product']}, {f['instance']})", kind="trainium", facts=f, lnc=lnc,
        ranks_per_chip=rpc, chips_per_instance=f["chips_per_instance"], instance=f["instance"],
        hbm_capacity=f["hbm_per_chip"] // rpc, hbm_bw=f["hbm_tbps"] * 1e12 / rpc, dma_bw=f["dma_tbps"] * 1e12 / rpc,
        bf16_flops=f["bf16_tflops_per_core"] * 1e12 * lnc, fp8_flops=f["fp8_tflops_per_core"] * 1e12 * lnc,
        # NeuronLink-v2 publishes no per-chip figure: the chip's DMA rate bounds what it can send.
        link_bw_chip=link if link > 0 else f["dma_tbps"] * 1e12, link_dims=max(1, f["link_dims"]),
        link_latency=f["link_latency_us"] * 1e-6, efa_bw_instance=f["efa_gbps"] * 1e9 / 8,
        efa_latency=f["efa_latency_us"] * 1e-6)


# ---- the seam to the engine model ---------------------------------------------------------------


_NKI_DTYPE = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "float8_e4m3fn": "float8_e4m3",
              "float8_e5m2": "float8_e5m2"}


@functools.lru_cache(maxsize=4096)
def kernel_cost(kernel: str, shapes: tuple, dtype: str, platform: str, causal: bool = False) -> tuple[float, float]:
    """(seconds on one physical NeuronCore, TensorE FLOPs) of our shipped NKI kernel ``kernel`` at
    ``shapes`` from the engine model (nki._estimate.kernel_time). The one place the step model asks
    the engine model."""
    try:
        from nki._estimate import kernel_time
    except ImportError as e:
        raise EstimateError("the NKI engine model (nki._estimate) is missing from this installation; "
                            "reinstall torch-neuronx") from e
    kw = {"causal": causal} if kernel.startswith("flash_attention") else {}
    t = kernel_time(kernel, shapes, dtype=dtype, platform=platform, **kw)
    return float(t.seconds), float(t.flops)


def matmul_kernel_cost(m: int, k: int, n: int, dtype: str, platform: str) -> float:
    """Seconds of the shipped matmul kernel for (m, k) @ (k, n). A contraction too long for the kernel's
    SBUF tiles (a 128k-vocabulary head's gradient) is costed in K blocks that fit, accumulated as a
    blocked matmul does: blocks x the kernel at one block."""
    block = k
    while True:
        try:
            sec, _ = kernel_cost("matmul", ((m, block), (block, n)), dtype, platform)
            return sec * k / block
        except EstimateError:
            raise
        except Exception as e:  # noqa: BLE001 - the kernel's verifier refused the tile (SBUF capacity)
            if block <= 512:
                raise EstimateError(f"the engine model cannot cost a ({m}, {k}) @ ({k}, {n}) matmul on {platform}: "
                                    f"{type(e).__name__}: {str(e).splitlines()[0]}") from e
            block = -(-block // 2)


def row_kernel_cost(kernel: str, rows: int, cols: int, dtype: str, platform: str) -> float:
    """Seconds of the row-wise kernel (softmax, rmsnorm) over ``rows`` x ``cols``. Rows wider than the
    kernel's SBUF tile (a 128k vocabulary) are costed in column blocks that fit, as an online
    (blocked) implementation runs them: blocks x the kernel at one block."""
    block = cols
    while True:
        shapes = ((rows, block),) if kernel == "softmax" else ((rows, block), (block,))
        try:
            sec, _ = kernel_cost(kernel, shapes, dtype, platform)
            return sec * cols / block
        except EstimateError:
            raise
        except Exception as e:  # noqa: BLE001 - the kernel's verifier refused the tile (SBUF capacity)
            if block <= 512:
                raise EstimateError(f"the engine model cannot cost {kernel} at ({rows}, {cols}) on {platform}: "
                                    f"{type(e).__name__}: {str(e).splitlines()[0]}") from e
            block = -(-block // 2)


def _mm_dims(op: Op) -> tuple[int, int, int, int] | None:
    """(batch, M, K, N) of a matmul op from its input shapes."""
    shapes = [s for s, _ in op.inputs]
    name = base_name(op.name)
    if name in ("addmm", "baddbmm", "addmv"):
        shapes = shapes[1:3]
    elif name == "_scaled_mm":
        shapes = shapes[:2]
    else:
        shapes = shapes[:2]
    if len(shapes) < 2:
        return None
    a, b = shapes
    if len(a) == 1:
        a = (1,) + a
    if len(b) == 1:
        b = b + (1,)
    batch = math.prod(a[:-2]) if len(a) > 2 else 1
    return batch, a[-2], a[-1], b[-1]


@dataclass
class OpCost:
    seconds: float
    engine: str  # "tensor", "vector", "scalar", "dma", "none"
    flops: float = 0.0  # model FLOPs (matmuls and attention)


def _kernel_dtype(op: Op, mode_dtype: str) -> str:
    if mode_dtype in ("fp8", "mxfp8"):
        return "float8_e4m3"
    dt = op.inputs[0][1] if op.inputs else "bfloat16"
    return _NKI_DTYPE.get(dt, "bfloat16")


def trainium_op_cost(op: Op, t: Target, dtype: str) -> OpCost:
    name = base_name(op.name)
    if op.collective is not None:
        return OpCost(0.0, "none")
    if name in VIEW_OPS or (not op.inputs and not op.outputs and not op.in_bytes):
        return OpCost(0.0, "none")
    if name in MATMUL_OPS:
        dims = _mm_dims(op)
        if dims is None:
            return _elementwise(op, t)
        b, m, k, n = dims
        kdt = _kernel_dtype(op, dtype)
        sec = matmul_kernel_cost(m, k, n, kdt, t.name)
        return OpCost(b * sec / t.lnc, "tensor", 2.0 * b * m * k * n)
    if name in ATTENTION_FWD or (name.endswith("_backward") and name[:-9] in ATTENTION_FWD):
        return _attention(op, t, dtype, backward=name.endswith("_backward"))
    if name in NORM_OPS or (name.endswith("_backward") and name[:-9] in NORM_OPS):
        shape = op.inputs[0][0] if op.inputs else ()
        if name.endswith("_backward"):
            shape = op.inputs[1][0] if len(op.inputs) > 1 else shape
        if len(shape) >= 1 and shape[-1] > 0:
            d = shape[-1]
            r = max(1, math.prod(shape) // d)
            sec = row_kernel_cost("rmsnorm", r, d, _NKI_DTYPE.get(op.inputs[0][1], "bfloat16"), t.name)
            # The backward reads the input, the output gradient and the statistics: twice the forward's work.
            return OpCost(sec * (2 if name.endswith("_backward") else 1) / t.lnc, "vector")
    if name in SOFTMAX_OPS:
        shape = op.inputs[0][0] if op.inputs else ()
        if len(shape) >= 1 and shape[-1] > 0:
            c = shape[-1]
            r = max(1, math.prod(shape) // c)
            sec = row_kernel_cost("softmax", r, c, _NKI_DTYPE.get(op.inputs[0][1], "bfloat16"), t.name)
            return OpCost(sec / t.lnc, "vector")
    if name in COPY_OPS or op.name.startswith("fsdp."):
        nbytes = op.in_bytes + op.out_bytes
        if name in ("zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones",
                    "new_full", "arange", "fill_", "zero_"):
            nbytes = op.out_bytes or op.in_bytes  # a write only
        sec = nbytes * RULES["copy_passes"] / min(t.hbm_bw, t.dma_bw)
        return OpCost(sec, "dma")
    return _elementwise(op, t)


REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "var", "std", "var_mean", "std_mean", "norm",
              "linalg_vector_norm", "argmax", "argmin", "prod", "logsumexp", "any", "all", "cumsum", "_foreach_norm",
              "nll_loss_forward", "nll_loss2d_forward"}
_EW_DTYPE = {"bfloat16": "bfloat16", "float16": "float16"}  # everything else streams as fp32


def _elementwise(op: Op, t: Target) -> OpCost:
    """Element-wise ops and reductions at the engine model's streaming rates (see _elementwise.py): a
    fixed time plus a time per element for the op's engine, kind and dtype, on one physical core,
    split over the rank's cores. Ops of k > 2 tensor inputs run as k - 1 two-input passes."""
    from torch_neuronx.estimate._elementwise import rate

    name = base_name(op.name)
    if op.name.startswith("inductor."):
        # A fused kernel: its elements, or its traffic in fp32 elements read and written, if larger.
        kind, dtype = ("reduce" if op.name.endswith("reduction") else "unary"), "float32"
        elems = max(int(op.args.get("elements", 0)), op.in_bytes // 8)
        passes = 1
    else:
        sizes = [math.prod(s) for s, _ in op.inputs]
        n_big = sum(1 for n in sizes if n > 1)
        elems = max(sizes + [math.prod(s) for s, _ in op.outputs] + [0])
        dtype = _EW_DTYPE.get(op.inputs[0][1] if op.inputs else "", "float32")
        if name in SCALAR_OPS:
            kind, passes = "activation", 1
        elif name in REDUCTIONS or name.rstrip("_") in REDUCTIONS:
            kind, passes = "reduce", 1
        elif n_big >= 2:
            kind, passes = "binary", n_big - 1
        else:
            kind, passes = "unary", 1
        if name.startswith("_foreach_"):
            # a list op: one kernel per tensor of the list, all of its elements
            elems = sum(math.prod(s) for s, _ in op.outputs) or sum(sizes) // max(1, passes + 1)
    fixed, per_element = rate(kind, dtype, t.name)
    sec = (fixed + passes * elems * per_element) / t.lnc
    return OpCost(sec, "scalar" if kind == "activation" else "vector")


def _attention(op: Op, t: Target, dtype: str, backward: bool) -> OpCost:
    shapes = [s for s, _ in op.inputs]
    # forward: (q, k, v, ...); backward: (grad_out, q, k, v, out, logsumexp, ...)
    q, k, v = (shapes[1:4] if backward else shapes[:3]) if len(shapes) >= (4 if backward else 3) else (None,) * 3
    if q is None or len(q) != 4:
        return _elementwise(op, t)
    b, h, s, d = q
    sk = k[2] * int(op.args.get("kv_scale", 1))  # context parallel: every rank attends to all keys
    causal = bool(op.args.get("is_causal", False))
    kdt = _kernel_dtype(op, "bf16")  # attention runs in the activation dtype
    chunks = max(1, -(-d // 128))  # the kernels take head_dim <= 128: wider heads in 128-wide parts
    dd = min(d, 128)
    bh = b * h
    if backward:
        shp = ((bh, s, dd), (bh, sk, dd), (bh, sk, dd), (bh, s, dd), (bh, s, dd), (bh, s))
        sec, flops = kernel_cost("flash_attention_bwd", shp, kdt, t.name, causal)
    else:
        shp = ((bh, s, dd), (bh, sk, dd), (bh, sk, dd))
        sec, flops = kernel_cost("flash_attention_fwd", shp, kdt, t.name, causal)
    return OpCost(chunks * sec / t.lnc, "tensor", chunks * flops)
