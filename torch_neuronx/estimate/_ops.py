"""What the cost models share: which aten ops are which kind, a matmul's dimensions, and one rank of
a platform (``Target``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch_neuronx.estimate._capture import Op

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


