"""FlexAttention (``torch.nn.attention.flex_attention``) on ``neuron``.

What torch 2.13 does on the CPU, and what neuron does instead:

* ``flex_attention`` validates the device before anything runs: ``_validate_device`` accepts
  only cuda/cpu/xpu/hpu/mps, and refuses inputs that require grad on the CPU. Neuron is
  accepted, with gradients (`patch_api`).
* Under ``torch.compile``, Inductor lowers the ``flex_attention`` HOP on the CPU with a C++
  template (``CppFlexAttentionTemplate``, via ``kernel/flex/flex_cpu.py:lower_cpu``) and every
  other device with Triton. Neuron uses Inductor's C++ code generator on host memory, so it
  takes the CPU template (`_lower_flex_attention_factory`).
* That template writes only the attention output: no logsumexp, no max scores; the CPU
  therefore has no backward (and ``flex_attention_backward`` has only a Triton lowering). On
  neuron, a forward whose logsumexp or max scores are used (training: autograd saves the
  logsumexp for the backward; or ``return_aux``), and every backward, is rewritten before
  lowering into PyTorch's own math implementation of the HOPs (``sdpa_dense`` /
  ``sdpa_dense_backward``, what eager flex_attention runs on every device), traced to ATen
  ops that Inductor fuses into C++ kernels (`_decompose_flex_to_dense`, an FX pass of the
  neuron pass stage). That materializes the [B, H, L, S] score matrix in fp32, as eager does.
* Autocast: the HOP casts q/k/v to the autocast dtype under AutocastCPU/AutocastCUDA only;
  neuron gets the same rule (`register_autocast`).

Each patch below is checked against torch 2.13 and applies only to that version line; on
another version it is skipped, and flex_attention on neuron reports the device as
unsupported, as torch does.
"""

from __future__ import annotations

import functools
import operator

import torch

DEVICE = "neuron"
_CHECKED_TORCH = ((2, 13),)


def _torch_checked() -> bool:
    return tuple(int(x) for x in torch.__version__.split(".")[:2]) in _CHECKED_TORCH


# ---------------------------------------------------------------- the public API (eager and Dynamo)


def patch_api() -> None:
    """Accept neuron in ``flex_attention``'s device check (import hook of
    ``torch.nn.attention.flex_attention``)."""
    if not _torch_checked():
        return
    import torch.nn.attention.flex_attention as fa

    orig = fa._validate_device
    if getattr(orig, "_neuron_patched", False):
        return

    # torch 2.13: `_validate_device(query, key, value)` raises ValueError for any device outside
    # {cuda, cpu, xpu, hpu, mps}, and NotImplementedError for CPU inputs that require grad.
    # q/k/v are already checked to share a device. Neuron supports the backward (see module
    # docstring), so nothing else is checked for it. `flex_attention` looks the function up as
    # a module global, so replacing the attribute is enough (Dynamo inlines the wrapper).
    @functools.wraps(orig)
    def _validate_device(query, key, value):
        if query.device.type == DEVICE:
            return
        return orig(query, key, value)

    _validate_device._neuron_patched = True
    fa._validate_device = _validate_device


def register_autocast() -> None:
    """Autocast for the flex_attention HOPs on neuron (import hook of
    ``torch._higher_order_ops.flex_attention``)."""
    if not _torch_checked():
        return
    import importlib

    from torch._C import DispatchKey
    from torch.amp.autocast_mode import _cast

    # (the module: `torch._higher_order_ops.flex_attention` as an attribute is the HOP itself)
    hops = importlib.import_module("torch._higher_order_ops.flex_attention")

    AUTOCAST = DispatchKey.AutocastPrivateUse1
    if AUTOCAST in hops.flex_attention.py_kernels:
        return

    # torch 2.13: HOPs fall through only the CPU/CUDA/XPU autocast keys
    # (torch/_ops.py:_HIGHER_ORDER_OP_DEFAULT_FALLTHROUGH_DISPATCH_KEYS), and flex_attention
    # registers `_flex_attention_autocast_impl` (cast q/k/v to the autocast dtype, redispatch
    # without autocast) for AutocastCPU/AutocastCUDA only. Under torch.autocast("neuron") both
    # HOPs therefore fail ("could not find kernel ... AutocastPrivateUse1"), eager and compiled.
    # Do for neuron what torch does for those devices; the torch function itself excludes only
    # the CPU/CUDA keys when it redispatches, so it cannot be reused.
    @hops.flex_attention.py_impl(AUTOCAST)
    def flex_attention_autocast_neuron(
        query, key, value, score_mod, block_mask, scale, kernel_options,
        score_mod_other_buffers=(), mask_mod_other_buffers=(),
    ):  # fmt: skip
        device_type = query.device.type
        dtype = torch.get_autocast_dtype(device_type)
        query, key, value = (_cast(t, device_type, dtype) for t in (query, key, value))
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(AUTOCAST)):
            return hops.flex_attention(
                query, key, value, score_mod, block_mask, scale, kernel_options,
                score_mod_other_buffers, mask_mod_other_buffers,
            )  # fmt: skip

    hops.flex_attention_backward.fallthrough(AUTOCAST)  # as for the CPU/CUDA autocast keys


# ---------------------------------------------------------------- Inductor


def _decompose_flex_to_dense(graph: torch.fx.Graph) -> None:
    """Neuron FX pass: flex_attention nodes whose logsumexp/max are used, and all
    flex_attention_backward nodes, become PyTorch's dense math implementation (see the module
    docstring); flex_attention nodes whose statistics are unused are told so
    (``OUTPUT_LOGSUMEXP=False``), which is what lets them lower with the C++ template."""
    from torch._higher_order_ops.flex_attention import sdpa_dense, sdpa_dense_backward
    from torch._inductor.pattern_matcher import (
        CallFunctionVarArgs,
        Match,
        PatternMatcherPass,
        register_graph_pattern,
    )
    from torch.utils import _pytree as pytree

    # Helpers are nested: the pass's source enters Inductor's graph-cache key (_passes.py).
    def uses_stats(node: torch.fx.Node) -> bool:
        """Whether anything reads output 1 (logsumexp) or 2 (max scores) of a flex_attention node."""
        for user in node.users:
            if user.op != "call_function" or user.target is not operator.getitem:
                return True
            if user.args[1] != 0 and user.users:
                return True
        return False

    def on_neuron(node: torch.fx.Node) -> bool:
        val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        return isinstance(val, torch.Tensor) and val.device.type == DEVICE

    def trace_without_constants(fn, args, *, run_functional_passes=False):
        """``pattern_matcher.fwd_only``, then each 0-dim tensor constant made by ``torch.tensor(x)``
        in the traced code (``sdpa_dense`` has ``-inf``, ``sdpa_dense_backward`` has ``0``) becomes
        ``aten.full([], x)``: the replacement inserter copies only subgraph modules, not tensors."""
        from torch._inductor.pattern_matcher import fwd_only
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        gm = fwd_only(fn, args, run_functional_passes=run_functional_passes)
        for n in list(gm.graph.nodes):
            if n.op != "get_attr":
                continue
            t = getattr(gm, n.target)
            if not isinstance(t, torch.Tensor):
                continue
            if t.dim() != 0:
                raise NotImplementedError(f"flex_attention dense rewrite: unexpected tensor constant {n.target}")
            with unset_fake_temporarily():  # a real tensor, read while the compile's fake mode is active
                value = t.item()
            with gm.graph.inserting_before(n):
                full = gm.graph.call_function(
                    torch.ops.aten.full.default, ([], value), {"dtype": t.dtype, "device": t.device}
                )
            full.meta.update(n.meta)
            n.replace_all_uses_with(full)
            gm.graph.erase_node(n)
            delattr(gm, n.target)
        gm.recompile()
        return gm

    hops = torch.ops.higher_order
    if not any(
        n.op == "call_function" and n.target in (hops.flex_attention, hops.flex_attention_backward) and on_neuron(n)
        for n in graph.nodes
    ):
        return
    root = graph.owning_module

    def split(args):
        # HOP arguments -> (tensor/SymInt nodes to trace with, rebuild(values) -> arguments).
        # Subgraphs (get_attr nodes) are resolved to their GraphModules and closed over.
        flat, spec = pytree.tree_flatten(args)
        const = [getattr(root, a.target) if isinstance(a, torch.fx.Node) and a.op == "get_attr" else a for a in flat]
        idx = [i for i, a in enumerate(flat) if isinstance(a, torch.fx.Node) and a.op != "get_attr"]

        def rebuild(*vals):
            out = list(const)
            for i, v in zip(idx, vals):
                out[i] = v
            return pytree.tree_unflatten(out, spec)

        return [flat[i] for i in idx], rebuild

    pm_pass = PatternMatcherPass(pass_name="neuron_flex_attention_dense")

    @register_graph_pattern(
        CallFunctionVarArgs(hops.flex_attention), pass_dict=pm_pass, extra_check=lambda m: on_neuron(m.nodes[0])
    )
    def _forward(match: Match, *args, **kwargs):
        node = match.nodes[0]
        kernel_options = args[6]
        if not uses_stats(node):
            if kernel_options.get("OUTPUT_LOGSUMEXP") or kernel_options.get("OUTPUT_MAX"):
                node.update_arg(6, {**kernel_options, "OUTPUT_LOGSUMEXP": False, "OUTPUT_MAX": False})
            return
        nodes, rebuild = split(args)

        def dense(*vals):
            return sdpa_dense(*rebuild(*vals))

        match.replace_by_example(dense, nodes, trace_fn=trace_without_constants)

    @register_graph_pattern(
        CallFunctionVarArgs(hops.flex_attention_backward),
        pass_dict=pm_pass,
        extra_check=lambda m: on_neuron(m.nodes[0]),
    )
    def _backward(match: Match, *args, **kwargs):
        node = match.nodes[0]
        nodes, rebuild = split(args)
        # sdpa_dense_backward returns a gradient for a captured score_mod buffer iff the buffer
        # requires grad; post-grad values never do, so ask for the ones the node returns.
        wanted = [g is not None for g in node.meta["val"][3]]

        def dense(*vals):
            a = list(rebuild(*vals))
            a[12] = tuple(
                b.detach().requires_grad_() if w else b for b, w in zip(a[12], wanted, strict=True)
            )
            with torch.no_grad():
                return sdpa_dense_backward(*a)

        match.replace_by_example(dense, nodes, trace_fn=trace_without_constants)

    pm_pass.apply(graph)


def _lower_flex_attention_factory(orig):
    from torch._inductor.kernel.flex.flex_cpu import lower_cpu

    # torch 2.13 `kernel/flex/flex_attention.py:flex_attention` (the HOP's lowering) sends
    # `query.get_device().type == "cpu"` to `lower_cpu` (the C++ template), mps to Metal and
    # everything else to Triton. Neuron generates C++ on host memory: the CPU template.
    @functools.wraps(orig)
    def flex_attention(query, key, value, subgraph, block_mask, scale, kernel_options, *rest):
        if query.get_device().type == DEVICE:
            if kernel_options.get("OUTPUT_MAX"):
                # `_decompose_flex_to_dense` removes these; lower_cpu would ignore the flag.
                raise NotImplementedError("flex_attention max scores on neuron: expected the dense rewrite")
            return lower_cpu(query, key, value, subgraph, block_mask, scale, kernel_options, *rest)
        return orig(query, key, value, subgraph, block_mask, scale, kernel_options, *rest)

    flex_attention._neuron_patched = True
    return flex_attention


def register_inductor() -> None:
    """Lower flex_attention on neuron with the CPU C++ template, and add the dense rewrite to
    the neuron pass stage (import hook of ``torch._inductor.kernel.flex.flex_attention``)."""
    if not _torch_checked():
        return
    from torch._inductor.lowering import lowerings

    from torch_neuronx.compile import _passes

    hop = torch.ops.higher_order.flex_attention
    orig = lowerings[hop]
    if not getattr(orig, "_neuron_patched", False):
        lowerings[hop] = _lower_flex_attention_factory(orig)
    if not any(name == "flex_attention_dense" for name, _ in _passes.PASSES):
        _passes.register_fx_pass("flex_attention_dense", _decompose_flex_to_dense)
