"""Cost of one op of the step on one rank of a platform.

- Matmuls, attention, norms and softmax: the engine model of our shipped NKI kernels at the op's
  shapes (``kernel_time`` in _kernels.py, through the one seam ``kernel_cost`` below). The
  engine model is the only source of efficiency for these ops.
- Element-wise ops and reductions: the engine model of small streaming NKI kernels (_elementwise.py).
- Copies, gathers, concatenations: DMA and HBM traffic.
- Views and metadata: free.
Collectives are costed in _collectives.py; GPU comparators in _gpu.py.
"""

from __future__ import annotations

import functools
import math

from torch_neuronx.estimate import _facts
from torch_neuronx.estimate._capture import Op
from torch_neuronx.estimate._errors import EstimateError
from torch_neuronx.estimate._ops import (ATTENTION_FWD, COPY_OPS, MATMUL_OPS, NORM_OPS, SCALAR_OPS, SOFTMAX_OPS,
                                         VIEW_OPS, OpCost, Target, _mm_dims, base_name)

# Copies (gathers, concatenations, FSDP's copy-in/out) move through DMA: every byte is read and written
# once at the rank's share of HBM / DMA bandwidth (nki/deep-dives/nki_perf_guide.rst: HBM->HBM copies).
RULES = {"copy_passes": 1}

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
    ``shapes`` from the engine model (_kernels.kernel_time). The one place the step model asks
    the engine model."""
    try:
        from torch_neuronx.estimate._kernels import kernel_time
    except ImportError as e:
        raise EstimateError(f"the NKI engine model (nki) does not load: {e}; "
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


def fusable(op: Op) -> bool:
    """An element-wise op or reduction a compiler fuses with its neighbours (everything ``_elementwise``
    costs, apart from compiled kernels and the optimizer's list ops)."""
    name = base_name(op.name)
    if op.collective is not None or op.name.startswith(("inductor.", "fsdp.")) or name.startswith("_foreach_"):
        return False
    if name in VIEW_OPS or name in MATMUL_OPS or name in COPY_OPS or name in SOFTMAX_OPS:
        return False
    if name in ATTENTION_FWD or name in NORM_OPS or (name.endswith("_backward") and
                                                      (name[:-9] in ATTENTION_FWD or name[:-9] in NORM_OPS)):
        return False
    return bool(op.inputs or op.outputs)


def _ew_kind(op: Op) -> tuple[str, str, int, int]:
    """(kind, dtype, passes, elements) of an element-wise op, as ``_elementwise`` costs it."""
    name = base_name(op.name)
    sizes = [math.prod(s) for s, _ in op.inputs]
    n_big = sum(1 for n in sizes if n > 1)
    elems = max(sizes + [math.prod(s) for s, _ in op.outputs] + [0])
    dtype = _EW_DTYPE.get(op.inputs[0][1] if op.inputs else "", "float32")
    if name in SCALAR_OPS:
        return "activation", dtype, 1, elems
    if name in REDUCTIONS or name.rstrip("_") in REDUCTIONS:
        return "reduce", dtype, 1, elems
    if n_big >= 2:
        return "binary", dtype, n_big - 1, elems
    return "unary", dtype, 1, elems


def fused_cost(ops: list[Op], t: Target) -> OpCost:
    """A run of consecutive element-wise ops as one compiled (fused) kernel: every op still runs its
    instructions on its engine (VectorE / ScalarE, in parallel with each other), but the
    intermediates stay in SBUF: HBM is read and written once, at the widest op's inputs and output,
    and the kernel's fixed cost is paid once. Times per element are the engine model's
    (_elementwise.engine_rate / rate)."""
    from torch_neuronx.estimate._elementwise import engine_rate, rate

    eng = {"vector": 0.0, "scalar": 0.0}
    fixed = 0.0
    for op in ops:
        kind, dtype, passes, elems = _ew_kind(op)
        eng["scalar" if kind == "activation" else "vector"] += passes * elems * engine_rate(kind, dtype, t.name)
        fixed = max(fixed, rate(kind, dtype, t.name)[0])
    nbytes = max(op.in_bytes for op in ops) + max(op.out_bytes for op in ops)
    dma = nbytes / min(t.hbm_bw, t.dma_bw)  # the rank's share of HBM / DMA
    engine, busy = max(eng.items(), key=lambda kv: kv[1])
    busy /= t.lnc  # engine work splits over the rank's physical cores
    # Once per run of the kernel; a run's ops share one count (layer replication weights it, possibly < 0).
    return OpCost(ops[0].count * (fixed / t.lnc + max(busy, dma)), engine if busy >= dma else "dma")


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
        kind, dtype, passes, elems = _ew_kind(op)
        if name.startswith("_foreach_"):
            # a list op: one kernel per tensor of the list, all of its elements
            sizes = [math.prod(s) for s, _ in op.inputs]
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
    widest = _facts.chip(t.name)["pe_rows"]  # the kernels' head_dim limit (kernels.ops.head_dim_max)
    chunks = max(1, -(-d // widest))  # wider heads in parts of the widest the kernels take
    dd = min(d, widest)
    bh = b * h
    if backward:
        shp = ((bh, s, dd), (bh, sk, dd), (bh, sk, dd), (bh, s, dd), (bh, s, dd), (bh, s))
        sec, flops = kernel_cost("flash_attention_bwd", shp, kdt, t.name, causal)
    else:
        shp = ((bh, s, dd), (bh, sk, dd), (bh, sk, dd))
        sec, flops = kernel_cost("flash_attention_fwd", shp, kdt, t.name, causal)
    return OpCost(chunks * sec / t.lnc, "tensor", chunks * flops)
