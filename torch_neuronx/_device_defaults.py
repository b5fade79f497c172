"""Per-device choices PyTorch keys by device type, made for ``neuron``.

Some PyTorch functions pick an algorithm from a table indexed by ``device.type`` and
fall back to a guess for devices they do not know. Where the guess is wrong for a
NeuronCore, the right entry is registered here, once, at device registration.

That includes fake tensors (what Dynamo and AOTAutograd trace with): PyTorch's fake
kernels describe the CPU's kernel for "cpu" and CUDA's for any other device, while
neuron runs the CPU's kernels, so where the two differ neuron's fakes are described as
the CPU's (tests/compile/test_fake_tensor.py, `make coverage-fake`).
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree


def register() -> None:
    _linear_cross_entropy_accumulation()
    _cpu_kernel_fakes()
    _efficient_attention_fake_kernels()


def _linear_cross_entropy_accumulation() -> None:
    # F.linear_cross_entropy's chunked path accumulates fp16/bf16 in the input dtype on
    # unknown devices ("compact"), assuming native low-precision GEMMs. NeuronCore
    # matmuls accumulate in fp32 (PSUM), and the simulator's low-precision GEMMs are
    # CPU ones: the CPU's choice (fp32 accumulation, "accurate") is right for both.
    try:
        from torch.nn.modules import linear_cross_entropy_options as lce
    except ImportError:  # a torch without linear_cross_entropy
        return
    defaults = getattr(lce, "_AUTO_DEFAULTS", None)
    options = getattr(lce, "LinearCrossEntropyOptions", None)
    if defaults is None or options is None or not hasattr(options, "_resolve_auto_acc_dtype"):
        return
    for dtype in (torch.float16, torch.bfloat16):
        if ("cpu", dtype) in defaults:
            defaults.setdefault(("neuron", dtype), defaults[("cpu", dtype)])
    resolve = options._resolve_auto_acc_dtype

    def _resolve_auto_acc_dtype(dtype, device):
        if device is not None and device.type == "neuron" and dtype in (torch.float16, torch.bfloat16):
            return torch.float32
        return resolve(dtype, device)

    options._resolve_auto_acc_dtype = staticmethod(_resolve_auto_acc_dtype)


def _efficient_attention_fake_kernels() -> None:
    # FakeTensorMode (Dynamo, AOTAutograd) computes the efficient-attention ops' outputs
    # with PyTorch's meta kernels, which describe CUDA's kernel: logsumexp padded to a
    # multiple of 32 queries, the output in [B, L, H, E] memory order. Neuron's kernel is
    # the CPU flash kernel (csrc/aten/attention.cpp) and keeps logsumexp unpadded, which
    # ring attention needs to merge chunks of any length; so fake neuron tensors get the
    # metadata of what the device kernel runs, the CPU flash ops, instead. Other devices,
    # and plain meta tensors, keep PyTorch's meta kernels (NotImplemented falls through).
    from torch._subclasses import fake_impls

    aten = torch.ops.aten
    forward, backward = aten._scaled_dot_product_efficient_attention.default, (
        aten._scaled_dot_product_efficient_attention_backward.default
    )

    def on_neuron(t) -> bool:
        return isinstance(t, torch.Tensor) and t.device.type == "neuron"

    @fake_impls.register_op_impl(lambda func: func is forward)
    def _forward(fake_mode, func, query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0,
                 is_causal=False, *, scale=None):  # fmt: skip
        if not on_neuron(query):
            return NotImplemented
        if dropout_p != 0.0:  # as the device kernel refuses it
            raise NotImplementedError(
                f"_scaled_dot_product_efficient_attention on neuron: dropout_p must be 0 (got {dropout_p}); "
                "scaled_dot_product_attention picks another kernel for dropout"
            )
        with fake_mode:
            out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
                query, key, value, dropout_p, is_causal, attn_mask=attn_bias, scale=scale
            )
            if not compute_log_sumexp:
                lse = lse.new_empty((lse.size(0), lse.size(1), 0))
            seed = torch.empty((), dtype=torch.long, device=query.device)
            offset = torch.empty((), dtype=torch.long, device=query.device)
        return out, lse, seed, offset

    @fake_impls.register_op_impl(lambda func: func is backward)
    def _backward(fake_mode, func, grad_out, query, key, value, attn_bias, out, logsumexp, philox_seed,
                  philox_offset, dropout_p, grad_input_mask, is_causal=False, *, scale=None):  # fmt: skip
        if not on_neuron(query):
            return NotImplemented
        if grad_input_mask[3]:
            raise NotImplementedError(
                "_scaled_dot_product_efficient_attention_backward on neuron: the gradient of attn_bias is not "
                "computed; scaled_dot_product_attention picks another kernel when the mask requires grad"
            )
        torch._check(
            logsumexp.dim() == 3 and logsumexp.size(2) >= query.size(2),
            lambda: f"_scaled_dot_product_efficient_attention_backward: logsumexp of shape {tuple(logsumexp.shape)} "
            f"does not cover {query.size(2)} queries",
        )
        with fake_mode:
            lse = logsumexp.narrow(2, 0, query.size(2)).contiguous()
            gq, gk, gv = aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad_out.contiguous(), query, key, value, out, lse, dropout_p, is_causal, attn_mask=attn_bias,
                scale=scale,
            )
        return gq, gk, gv, None


# Ops whose fake kernels take CUDA's branch for any device but "cpu" where the outputs
# differ in metadata (found by reading PyTorch's meta kernels and decompositions for
# device checks, and by `make coverage-fake`): layer/batch norm statistics keep the input
# dtype on CPU and batch norm's are empty in eval mode; nonzero_static is row-major;
# embedding_bag's bookkeeping outputs are sized differently; pixel_shuffle keeps
# channels_last; unique_dim returns inverse and counts unasked.
_CPU_DESCRIBED_OPS = (
    "native_layer_norm.default", "native_batch_norm.default", "_native_batch_norm_legit.default",
    "_native_batch_norm_legit.no_stats", "_native_batch_norm_legit_functional.default",
    "_native_batch_norm_legit_no_training.default", "_batch_norm_with_update.default",
    "_batch_norm_with_update_functional.default", "nonzero_static.default", "_embedding_bag.default",
    "_embedding_bag_forward_only.default", "pixel_shuffle.default", "unique_dim.default",
)  # fmt: skip


def _cpu_kernel_fakes() -> None:
    from torch._decomp import decomposition_table, meta_table
    from torch._subclasses import fake_impls

    ops = set()
    for name in _CPU_DESCRIBED_OPS:
        packet, overload = name.rsplit(".", 1)
        op = getattr(getattr(torch.ops.aten, packet, None), overload, None)
        if op is not None:  # absent from other torch versions
            ops.add(op)
    # FakeTensorMode runs the Python decompositions of ops missing from meta_table before
    # it looks for fake kernels, so for those the fake kernel below would never be asked.
    # Listed in meta_table, they reach it; it runs the same decomposition for other devices.
    decomposed = {op for op in ops if op not in meta_table and op in decomposition_table}
    for op in decomposed:
        meta_table[op] = decomposition_table[op]

    def describe_as_cpu(fake_mode, func, *args, **kwargs):
        flat = pytree.tree_leaves((args, kwargs))
        device = next((t.device for t in flat if isinstance(t, torch.Tensor) and t.device.type == "neuron"), None)
        if device is None:
            if func in decomposed:
                with fake_mode:
                    return decomposition_table[func](*args, **kwargs)
            return NotImplemented

        def as_cpu(t):
            if isinstance(t, torch.Tensor) and t.device.type == "neuron":
                return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
            return t

        def as_neuron(t):
            if isinstance(t, torch.Tensor):
                return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
            return t

        # The outputs of these ops are new tensors (none aliases an input), so describing
        # them by metadata alone is exact.
        with fake_mode:
            out = func(*pytree.tree_map(as_cpu, args), **pytree.tree_map(as_cpu, kwargs))
            return pytree.tree_map(as_neuron, out)

    # First: unique_dim's own fake kernel is registered before any added one would be asked.
    fake_impls.op_implementations_checks.insert(0, (ops.__contains__, describe_as_cpu))
