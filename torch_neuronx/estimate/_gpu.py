"""GPU comparators (H100, H200): a simpler model than the Trainium one, with the same rules.

Matmuls and attention at the GPU's dense peak (no kernel model: an upper bound on speed), element-wise
ops and copies at HBM bandwidth, collectives over NVLink within the 8-GPU instance and EFA between
instances. One rank is one GPU.
"""

from __future__ import annotations

from torch_neuronx.estimate import _facts
from torch_neuronx.estimate._capture import Op
from torch_neuronx.estimate._ops import (ATTENTION_FWD, COPY_OPS, MATMUL_OPS, VIEW_OPS, OpCost, Target, _mm_dims,
                                         base_name)

# The same assumed per-step latencies as the platform model's Trainium entries (none are published).
_LINK_LATENCY_US = 2.0
_EFA_LATENCY_US = 15.0


def gpu_target(name: str) -> Target:
    g = _facts.GPU_FACTS[name]
    return Target(
        name=name, label=f"{name} ({g.product}, {g.instance}; simpler model)", kind="gpu",
        facts={"source": g.source, "instance": g.instance}, lnc=1, ranks_per_chip=1,
        chips_per_instance=g.gpus_per_instance, instance=g.instance, hbm_capacity=g.hbm_bytes,
        hbm_bw=g.hbm_tbps * 1e12, dma_bw=g.hbm_tbps * 1e12, bf16_flops=g.bf16_tflops * 1e12, fp8_flops=g.fp8_tflops * 1e12,
        link_bw_chip=g.nvlink_tbps * 1e12, link_dims=1, link_latency=_LINK_LATENCY_US * 1e-6,
        efa_bw_instance=g.efa_gbps * 1e9 / 8, efa_latency=_EFA_LATENCY_US * 1e-6)


def gpu_op_cost(op: Op, t: Target, dtype: str) -> OpCost:
    name = base_name(op.name)
    if op.collective is not None or name in VIEW_OPS:
        return OpCost(0.0, "none")
    peak = t.peak_flops(dtype)
    if name in MATMUL_OPS:
        dims = _mm_dims(op)
        if dims is not None:
            b, m, k, n = dims
            flops = 2.0 * b * m * k * n
            return OpCost(max(flops / peak, (op.in_bytes + op.out_bytes) / t.hbm_bw), "tensor", flops)
    attn_bwd = name.endswith("_backward") and name[:-9] in ATTENTION_FWD
    if name in ATTENTION_FWD or attn_bwd:
        shapes = [s for s, _ in op.inputs]
        q, k = (shapes[1], shapes[2]) if attn_bwd and len(shapes) > 2 else (shapes[0], shapes[1])
        if len(q) == 4:
            b, h, s, d = q
            sk = k[2] * int(op.args.get("kv_scale", 1))
            flops = 4.0 * b * h * s * sk * d * (0.5 if op.args.get("is_causal") else 1.0) * (2.5 if attn_bwd else 1)
            return OpCost(flops / t.bf16_flops, "tensor", flops)
    nbytes = op.in_bytes + op.out_bytes
    return OpCost(nbytes / t.hbm_bw, "dma" if name in COPY_OPS else "vector")
