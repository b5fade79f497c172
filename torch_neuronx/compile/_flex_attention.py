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


def _check_captured_reads(graph: torch.fx.Graph) -> None:
    """Raises IndexError, before any code is generated, when a score_mod or mask_mod reads a
    tensor it captured at an index that runs past that tensor's size, naming the tensor (which
    captured buffer, its shape), the dimension and the index argument.

    A captured tensor is not broadcast: ``bias[b, h, q_idx, kv_idx]`` with a bias of batch
    size 1 reads past its end for every batch but the first. Inductor's C++ code on the CPU
    stops there too, but only when the kernel runs, with ``index out of bounds: tmp9 < 1L``
    (on CUDA the read is not checked). Only indices that are linear in ``b``, ``h``,
    ``q_idx``, ``kv_idx`` (plus constants) are checked, exactly; anything else is left to the
    kernel's own check."""
    hops = torch.ops.higher_order
    root = graph.owning_module

    def shape(node):
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        return tuple(int(d) for d in val.shape) if isinstance(val, torch.Tensor) else None

    def check(mod_node, kind, n_scalar, buffers, q, k):
        qs, ks = shape(q), shape(k)
        if qs is None or ks is None or not isinstance(mod_node, torch.fx.Node) or mod_node.op != "get_attr":
            return
        names = ("b", "h", "q_idx", "kv_idx")
        sizes = (qs[0], qs[1], qs[2], ks[2])
        meaning = ("batch", "head", "query", "key")
        sub = getattr(root, mod_node.target).graph
        ph = [n for n in sub.nodes if n.op == "placeholder"]
        # index expression of a node: ({argument position: coefficient}, constant), exact
        linear = {n: ({i: 1}, 0) for i, n in enumerate(ph[n_scalar - 4:n_scalar])}
        # tensor read of a node: (buffer position, the buffer's dimensions still in the view)
        views = {n: (i, list(range(len(shape(b) or ())))) for i, (n, b) in enumerate(zip(ph[n_scalar:], buffers))
                 if shape(b) is not None}

        def lin(x):
            if isinstance(x, int) and not isinstance(x, bool):
                return {}, x
            return linear.get(x)

        aten = torch.ops.aten
        for n in sub.nodes:
            if n.op != "call_function":
                continue
            if n.target in (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor) and len(n.args) == 2:
                a, c = lin(n.args[0]), lin(n.args[1])
                if a is None or c is None or n.kwargs.get("alpha", 1) != 1:
                    continue
                if n.target is aten.mul.Tensor:
                    if a[0] and c[0]:
                        continue  # not linear
                    (v, f), m = (a, c[1]) if a[0] else (c, a[1])
                    linear[n] = ({i: x * m for i, x in v.items()}, f * m)
                else:
                    sign = -1 if n.target is aten.sub.Tensor else 1
                    coef = dict(a[0])
                    for i, x in c[0].items():
                        coef[i] = coef.get(i, 0) + sign * x
                    linear[n] = (coef, a[1] + sign * c[1])
            elif n.target is aten.select.int and n.args[0] in views:
                buf, dims = views[n.args[0]]
                views[n] = (buf, dims[:n.args[1]] + dims[n.args[1] + 1:])
            elif n.target is aten.index.Tensor and n.args[0] in views:
                buf, dims = views[n.args[0]]
                indices = list(n.args[1])
                for pos, idx in enumerate(indices):
                    e = lin(idx) if idx is not None else None
                    if e is None or pos >= len(dims):
                        continue
                    lo = e[1] + sum(min(0, x * (sizes[i] - 1)) for i, x in e[0].items())
                    hi = e[1] + sum(max(0, x * (sizes[i] - 1)) for i, x in e[0].items())
                    size = shape(buffers[buf])[dims[pos]]
                    if lo < -size or hi >= size:
                        what = " + ".join(f"{x}*{names[i]}" if x != 1 else names[i] for i, x in e[0].items())
                        what = what or str(e[1])
                        if e[0] and e[1]:
                            what += f" {'+' if e[1] > 0 else '-'} {abs(e[1])}"
                        roles = ", ".join(f"{names[i]} = the {meaning[i]} index, 0..{sizes[i] - 1}" for i in e[0])
                        raise IndexError(
                            f"flex_attention on neuron: the {kind} reads the tensor it captured as buffer {buf} "
                            f"(shape {list(shape(buffers[buf]))}) at dimension {dims[pos]} with index {what}"
                            + (f" ({roles})" if roles else "") + f", which runs from {lo} to {hi}: out of bounds "
                            f"for size {size}. Captured tensors are not broadcast: index a dimension of size 1 "
                            f"with 0, or expand the tensor to the full size before flex_attention. (Inductor "
                            f"on the CPU stops at the same read with 'index out of bounds'.)")
                views[n] = (buf, [d for p, d in enumerate(dims) if p >= len(indices) or indices[p] is None])

    for n in graph.nodes:
        if n.op != "call_function":
            continue
        if n.target is hops.flex_attention:
            q, k, _, score_mod, block_mask, *_ = n.args
            score_bufs, mask_bufs = n.args[7], n.args[8]
        elif n.target is hops.flex_attention_backward:
            q, k, score_mod, block_mask = n.args[0], n.args[1], n.args[7], n.args[9]
            score_bufs, mask_bufs = n.args[12], n.args[13]
        else:
            continue
        check(score_mod, "score_mod", 5, list(score_bufs), q, k)
        if isinstance(block_mask, (tuple, list)) and block_mask:
            check(block_mask[-1], "mask_mod", 4, list(mask_bufs), q, k)


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
    _check_captured_reads(graph)  # only raises: the generated code does not depend on it
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
