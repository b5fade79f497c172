"""Build the model of one rank and run one step under the recorder.

Full-size mode builds the model on fake tensors (FakeTensorMode: shapes and dtypes, no memory) and
applies the parallel plan with torch's ``fake`` process group: DTensor tensor parallelism from the
model's Hugging Face ``tp_plan`` and FSDP2 (``fully_shard``) over the data-parallel mesh dimension,
traced for rank 0 of the whole world without spawning a process. Record mode runs the same step on
``neuron`` tensors at the size given. A model built from a config with identical decoder layers is
traced with one and with two layers; the step of ``n`` layers is the one-layer step plus ``n - 1``
times the difference (an assumption the report states).
"""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from torch_neuronx.estimate._capture import Op, StepRecorder
from torch_neuronx.estimate._errors import EstimateError

TASKS = ("train", "prefill", "decode", "generate")
DTYPES = {"bf16": torch.bfloat16, "fp8": torch.bfloat16, "mxfp8": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class Plan:
    """The parallel plan: ranks = tp x pp x dp x cp; ep splits experts over the dp x tp ranks."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    fsdp: bool = False
    recompute: bool = False  # activation checkpointing of every decoder layer
    # Sequence parallelism with tp: None = on for train/prefill when the model's plan allows it (as
    # NeuronX Distributed and TorchTitan run TP), off otherwise; True requires it; False never.
    sp: bool | None = None

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    # Mesh dimensions, outermost first: tp innermost keeps a TP group on neighbouring cores.
    def dims(self) -> list[tuple[str, int]]:
        return [("pp", self.pp), ("dp", self.dp), ("cp", self.cp), ("tp", self.tp)]

    def stride(self, dim: str) -> int:
        s = 1
        for name, size in reversed(self.dims()):
            if name == dim:
                return s
            s *= size
        raise KeyError(dim)

    def group(self, dim: str) -> tuple[int, ...]:
        """Rank 0's group along ``dim``."""
        size = dict(self.dims())[dim]
        return tuple(i * self.stride(dim) for i in range(size))


@dataclass
class Capture:
    """One rank's step: ops (with how often the step runs each), memory and what was assumed."""

    ops: list[Op]
    peak_bytes: int  # per rank: bytes alive at the start + the recorder's peak
    static_bytes: int  # parameters, inputs and state alive before the step
    largest: list[tuple[str, int]]  # (description, bytes) of the largest tensors, largest first
    tokens: int  # tokens the whole job processes per step (global)
    micro_steps: int  # forward/backward passes per optimizer step on one rank
    layers: int | None  # decoder layers of the model (None: traced whole)
    stage_layers: int | None  # decoder layers of one pipeline stage
    assumptions: list[str] = field(default_factory=list)
    pp_boundary_bytes: int = 0  # activation sent between pipeline stages per micro-batch
    param_count: int = 0  # parameters of the whole model
    fused: bool = False  # full-size compiled: runs of element-wise ops cost as fused kernels (_model._fuse)
    sp: bool = False  # sequence parallelism applied (the step that defines the cost; decode never)


# ---- the step -------------------------------------------------------------------------------------


def _loss(out: Any) -> torch.Tensor:
    loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    from torch.utils._pytree import tree_leaves

    floats = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()
              and t.requires_grad]
    if not floats:
        raise EstimateError("the model's output has no float tensor that requires grad to build a loss from; "
                            "use --task prefill for inference")
    return sum(t.float().sum() for t in floats)


def _call(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def run_step(model, inputs, task: str, rec: StepRecorder, decode_inputs: Callable | None = None,
             compiled: bool = False) -> None:
    """One step under ``rec``: train = forward, backward, AdamW step (phases recorded separately);
    prefill = one forward without grad; decode = one forward of one token per sequence after an
    unrecorded prefill that fills the KV cache. ``compiled``: the model runs outside the recorder (its
    compiled graphs record their kernels), the optimizer inside it."""
    model_ctx = _compiled_ctx(rec) if compiled else rec
    if task == "train":
        opt = torch.optim.AdamW(_param_groups(model), lr=1e-4, foreach=True)
        model.train()
        with model_ctx, _loss_ctx(model):
            rec.phase = "forward"
            loss = _loss(_call(model, inputs))
            rec.forward_live = rec.live  # activations the backward needs
            rec.phase = "backward"
            loss.backward()
        with rec:
            rec.phase = "optimizer"
            opt.step()
        rec.state_bytes = sum(_storage_bytes(v) for s in opt.state.values() for v in s.values()
                              if isinstance(v, torch.Tensor))
        return
    model.eval()
    with torch.no_grad():
        if task == "prefill":
            with model_ctx:
                rec.phase = "prefill"
                _call(model, inputs)
            return
        # decode: the prefill that builds the cache is not part of the step
        out = _call(model, inputs)
        step_inputs = decode_inputs(out)
        with model_ctx:
            rec.phase = "decode"
            _call(model, step_inputs)


def _loss_ctx(model):
    """torch's ``loss_parallel`` when the head's logits are sharded over the vocabulary (apply_tp): the
    cross-entropy of forward and backward runs on each rank's vocabulary shard."""
    if not getattr(model, "_estimate_loss_parallel", False):
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


@contextlib.contextmanager
def _compiled_ctx(rec: StepRecorder):
    rec.compiled_recording = True
    try:
        yield
    finally:
        rec.compiled_recording = False


def _param_groups(model) -> list[dict]:
    """Parameters grouped by sharding: foreach kernels cannot mix plain tensors and DTensors (or DTensors
    of different meshes), so each kind gets its own group, as training scripts with TP do."""
    groups: dict[tuple, list] = {}
    for p in model.parameters():
        if p.requires_grad:
            mesh = getattr(p, "device_mesh", None)
            key = (type(p).__name__, id(mesh), tuple(map(str, getattr(p, "placements", ()))))
            groups.setdefault(key, []).append(p)
    return [{"params": ps} for ps in groups.values()]


def _storage_bytes(t: torch.Tensor) -> int:
    from torch_neuronx.estimate._capture import _local

    t = _local(t)
    try:
        return t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        return t.numel() * t.element_size()


# ---- parallel plans on fake process groups --------------------------------------------------------


@contextlib.contextmanager
def fake_world(plan: Plan, device: str):
    """torch's ``fake`` process group of ``plan.world`` ranks for rank 0 and its device mesh; the
    previous default group (if any) is not touched when the plan has one rank."""
    import torch.distributed as dist

    if plan.world == 1:
        yield None
        return
    if dist.is_initialized():
        raise EstimateError("a parallel plan is traced on its own fake process group, but this process already "
                            "has one initialized; call estimate() before init_process_group, or in a fresh process")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), world_size=plan.world, rank=0)
    try:
        names, sizes = zip(*plan.dims())
        yield init_device_mesh(device, sizes, mesh_dim_names=names)
    finally:
        dist.destroy_process_group()


# Hugging Face tp_plan styles -> torch's parallel styles ("gather"/"rep": the output replicated, as
# HF's colwise_gather_output head gathers the logits; "embedding_rowwise": vocab-parallel embedding).
_STYLE = {"colwise", "colwise_rep", "local_colwise", "colwise_gather_output", "rowwise", "rowwise_rep",
          "local_rowwise", "embedding_rowwise", "rowwise_split_input"}


def hf_tp_plan(model) -> dict[str, str]:
    """The model's Hugging Face tensor-parallel plan, module pattern -> style, with full module paths."""
    plan = dict(getattr(model, "_tp_plan", None) or {})
    base = getattr(model, "base_model_prefix", "")
    inner = getattr(model, base, None) if base else None
    cfg_plan = getattr(getattr(model, "config", None), "base_model_tp_plan", None) or {}
    for k, v in cfg_plan.items():
        plan[f"{base}.{k}" if inner is not None and inner is not model else k] = v
    return plan


class NoSequenceParallel(EstimateError):
    """The model's tensor-parallel plan leaves no place for sequence parallelism (the reason says why)."""


def apply_tp(model, mesh, plan: dict[str, str], *, sp: bool = False, vocab_parallel_loss: bool = False) -> None:
    """Tensor parallelism of ``plan`` (Hugging Face styles, or torch's ParallelStyle objects) through
    DTensor. ``sp``: sequence parallelism on top (``sequence_parallel_styles``; raises
    NoSequenceParallel when the plan does not allow it). ``vocab_parallel_loss``: the head's logits
    stay sharded over the vocabulary and the loss runs under torch's ``loss_parallel`` (run_step)."""
    import fnmatch

    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    names = [n for n, _ in model.named_modules()]
    styles = {}
    from torch.distributed.tensor.parallel import ParallelStyle

    for pattern, style in plan.items():
        if not isinstance(style, str):
            # diffusers' plans hold style objects: torch's own, or packed splits of fused projections,
            # which give each rank the same shapes as the even split they are costed as.
            kind = type(style).__name__
            if not isinstance(style, ParallelStyle):
                style = "rowwise" if "Rowwise" in kind else "colwise" if "Colwise" in kind else None
                if style is None:
                    continue
            else:
                rx = pattern.replace("*", "[0-9]*")
                styles.update({n: style for n in names if fnmatch.fnmatchcase(n, rx)})
                continue
        if style not in _STYLE:
            continue  # gather / sequence-parallel / ep styles: left replicated
        rx = pattern.replace("*", "[0-9]*")
        for n in names:
            if fnmatch.fnmatchcase(n, rx):
                if style.startswith("colwise") and ("rep" in style or "gather" in style):
                    styles[n] = ColwiseParallel(output_layouts=Replicate())
                elif style in ("rowwise_rep", "embedding_rowwise"):
                    styles[n] = RowwiseParallel(input_layouts=Replicate())
                else:
                    styles[n] = ColwiseParallel() if "colwise" in style else RowwiseParallel()
    if not styles:
        raise EstimateError("--tp > 1 needs a tensor-parallel plan: the model has no Hugging Face tp_plan "
                            "(config.base_model_tp_plan); use a module:function entry point that applies its own "
                            "plan, or --tp 1")
    head = _module_name(model, _get(model, "get_output_embeddings"))
    loss_parallel = vocab_parallel_loss and isinstance(styles.get(head), ColwiseParallel)
    if loss_parallel:
        # The logits stay a DTensor sharded over the vocabulary: no gather, the loss is vocab-parallel.
        styles[head] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    if sp:
        styles = sequence_parallel_styles(model, styles)
    parallelize_module(model, mesh, styles)
    model._estimate_loss_parallel = loss_parallel


def _get(model, method: str):
    try:
        return getattr(model, method)()
    except (AttributeError, NotImplementedError):
        return None


def _module_name(model, module) -> str | None:
    if module is None:
        return None
    for n, m in model.named_modules():
        if m is module:
            return n
    return None


def _is_norm(module) -> bool:
    """A LayerNorm / RMSNorm of the hidden states: its parameters (if any) are vectors, and its class is
    a norm (nn.LayerNorm, nn.RMSNorm or a model's own *RMSNorm / *LayerNorm). Adaptive norms with
    projections (diffusers' AdaLayerNorm) are not."""
    if isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm)):
        return True
    kind = type(module).__name__
    return kind.endswith(("RMSNorm", "LayerNorm")) and all(p.dim() == 1 for p in module.parameters())


def sequence_parallel_styles(model, styles: dict) -> dict:
    """Sequence parallelism on top of a tensor-parallel plan, as TorchTitan's Llama plan and NeuronX
    Distributed apply it (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
    Models"): between the tensor-parallel blocks the hidden states are sharded over the sequence, so
    every rank runs the norms, residual adds and other element-wise work on seq/tp tokens.

    - every norm of a decoder layer and the final norm: torch's ``SequenceParallel``;
    - every other child of a decoder layer is a tensor-parallel block (column-parallel in, row-parallel
      out): its input is all-gathered over the sequence (``GatherSequence``), its row-parallel outputs
      are reduce-scattered to sequence shards (``RowwiseParallel(output_layouts=Shard(1))``) instead of
      all-reduced;
    - the embedding's output is reduce-scattered to sequence shards (vocab-parallel embedding), or
      split (a replicated embedding); the head all-gathers its input.

    The hidden states between blocks are DTensors sharded on dim 1, so the model sees their global
    shape (positions, masks) while each op computes on the local shard. Raises NoSequenceParallel
    naming what does not fit."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, ParallelStyle, PrepareModuleOutput,
                                                   RowwiseParallel, SequenceParallel)

    class _GatherSequence(ParallelStyle):
        """The hidden states entering a tensor-parallel block (the first positional argument, or the
        ``hidden_states`` keyword): sequence shards all-gathered into the replicated DTensor the block's
        column-parallel projections take. PrepareModuleInput's job, for either calling convention
        (Hugging Face passes attention's input by keyword, the MLP's positionally). It stays a DTensor,
        so the projections' partial input gradients are summed as one and reduce-scattered by this
        gather's backward, not all-reduced each."""

        def _apply(self, module, device_mesh):
            def gather(x):
                if not isinstance(x, DTensor):
                    x = DTensor.from_local(x, device_mesh, (Shard(1),), run_check=False)
                return x.redistribute(placements=(Replicate(),))

            def hook(_mod, args, kwargs):
                if args and isinstance(args[0], torch.Tensor):
                    return (gather(args[0]), *args[1:]), kwargs
                if isinstance(kwargs.get("hidden_states"), torch.Tensor):
                    return args, {**kwargs, "hidden_states": gather(kwargs["hidden_states"])}
                raise NoSequenceParallel(f"sequence parallelism: {type(_mod).__name__} gets no hidden states to "
                                         "gather (neither a positional tensor nor hidden_states=)")

            module.register_forward_pre_hook(hook, with_kwargs=True)
            return module

    layers = decoder_layers(model)
    if layers is None:
        raise NoSequenceParallel("the model has no decoder layers (layers/h/blocks ModuleList)")
    new = dict(styles)
    for lname, layer in ((_module_name(model, ly), ly) for ly in layers):
        for cname, child in layer.named_children():
            full = f"{lname}.{cname}"
            if _is_norm(child):
                new[full] = SequenceParallel()
                continue
            inner = {n: s for n, s in styles.items() if n.startswith(full + ".")}
            if not inner:
                if any(True for _ in child.parameters()):
                    raise NoSequenceParallel(f"{full} ({type(child).__name__}) has parameters but no tensor-parallel "
                                             "style")
                continue  # dropout, rotary embedding: no parameters, any layout
            rows = [n for n, st in inner.items() if type(st) is RowwiseParallel]
            cols = [n for n, st in inner.items() if type(st) is ColwiseParallel]
            if not rows or not cols or len(rows) + len(cols) != len(inner):
                raise NoSequenceParallel(f"{full} ({type(child).__name__}) is not column-parallel in and row-parallel "
                                         "out")
            new[full] = _GatherSequence()
            for n in rows:
                new[n] = RowwiseParallel(input_layouts=styles[n].input_layouts[0], output_layouts=Shard(1),
                                         use_local_output=False)
    base = getattr(model, getattr(model, "base_model_prefix", ""), None) or model
    for cname, child in base.named_children():
        if _is_norm(child):
            new[_module_name(model, child)] = SequenceParallel()
    head = _module_name(model, _get(model, "get_output_embeddings"))
    if type(styles.get(head)) is ColwiseParallel:
        # The head all-gathers its sequence-sharded input explicitly (its backward reduce-scatters).
        st = styles[head]
        new[head] = ColwiseParallel(input_layouts=Shard(1), output_layouts=st.output_layouts[0],
                                    use_local_output=st.use_local_output)
    emb = _module_name(model, _get(model, "get_input_embeddings"))
    if emb is None:
        raise NoSequenceParallel("the model has no input embeddings to shard the sequence after")
    if type(styles.get(emb)) is RowwiseParallel:
        new[emb] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False)
    elif emb in styles:
        raise NoSequenceParallel(f"{emb}: its tensor-parallel style is not a vocabulary-parallel embedding")
    else:
        new[emb] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1),
                                       use_local_output=False)
    return new


def apply_recompute(model) -> None:
    """Activation checkpointing of every decoder layer (non-reentrant): the backward recomputes each
    layer's forward, and only the layers' inputs stay alive."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    layers = decoder_layers(model)
    if layers is None:
        raise EstimateError("--recompute checkpoints decoder layers, and this model has none (no layers/h/blocks "
                            "ModuleList)")
    for i, layer in enumerate(layers):
        layers[i] = checkpoint_wrapper(layer)


def apply_fsdp(model, mesh) -> None:
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(model) or []:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def decoder_layers(model):
    """The model's repeated blocks (an nn.ModuleList of decoder layers), or None."""
    for name in ("layers", "h", "blocks", "transformer_blocks", "block"):
        for mod in (model, getattr(model, getattr(model, "base_model_prefix", ""), None)):
            lst = getattr(mod, name, None) if mod is not None else None
            if isinstance(lst, torch.nn.ModuleList) and len(lst):
                return lst
    return None


# ---- models of a config ---------------------------------------------------------------------------


def text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def check_plan(config, plan: Plan, task: str) -> list[str]:
    """Errors for a plan that does not divide the model; returns the notes of adjustments made."""
    notes = []
    t = text_config(config)
    heads = getattr(t, "num_attention_heads", None)
    kv = getattr(t, "num_key_value_heads", None) or heads
    layers = getattr(t, "num_hidden_layers", None)
    if plan.tp > 1 and heads is not None:
        if heads % plan.tp:
            raise EstimateError(f"--tp {plan.tp} does not divide the model's {heads} attention heads; choose a tp "
                                f"that divides {heads} (e.g. {', '.join(str(d) for d in _divisors(heads) if d > 1)})")
        if kv % plan.tp:
            if plan.tp % kv:
                raise EstimateError(f"--tp {plan.tp} and the model's {kv} key-value heads: tp must divide them or be "
                                    f"a multiple of them (KV heads are then replicated)")
            notes.append(f"{kv} KV heads replicated to the TP degree {plan.tp} (one KV head per rank), as "
                         "NeuronX Distributed does for GQA")
    if plan.pp > 1 and layers is not None and layers % plan.pp:
        raise EstimateError(f"--pp {plan.pp} does not divide the model's {layers} layers; choose a pp that divides "
                            f"{layers}")
    if plan.pp > 1 and task != "train":
        notes.append("inference with --pp: stages run one after another for one batch (no micro-batch overlap)")
    if plan.ep > 1:
        experts = getattr(t, "num_experts", None) or getattr(t, "num_local_experts", None)
        if not experts:
            raise EstimateError(f"--ep {plan.ep} needs a mixture-of-experts model; this config has no experts")
        if experts % plan.ep:
            raise EstimateError(f"--ep {plan.ep} does not divide the model's {experts} experts")
        if (plan.dp * plan.tp) % plan.ep:
            raise EstimateError(f"--ep {plan.ep} must divide dp x tp = {plan.dp * plan.tp} (experts are split over "
                                "those ranks)")
    return notes


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0][:8]


def build_hf(config, layers: int, plan: Plan, dtype: torch.dtype, fake_mode):
    """The model of ``config`` with ``layers`` decoder layers, its KV heads replicated up to tp when the
    plan asks for it, built under ``fake_mode`` (or really, when None)."""
    from transformers import AutoModel, AutoModelForCausalLM

    cfg = copy.deepcopy(config)
    t = text_config(cfg)
    if getattr(t, "num_hidden_layers", None) is not None:
        t.num_hidden_layers = layers
        if getattr(t, "layer_types", None):
            t.layer_types = list(t.layer_types)[:layers]
    kv = getattr(t, "num_key_value_heads", None)
    if kv and plan.tp > kv:
        t.num_key_value_heads = plan.tp
    for c in {id(cfg): cfg, id(t): t}.values():
        c._attn_implementation = "sdpa"
        c.use_cache = True
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with fake_mode if fake_mode is not None else contextlib.nullcontext():
            try:
                return AutoModelForCausalLM.from_config(cfg)
            except ValueError:
                return AutoModel.from_config(cfg)
    finally:
        torch.set_default_dtype(old)


def to_fake(model, fake_mode):
    """A copy of ``model`` whose parameters and buffers are fake tensors of the same shapes: the
    real ones are neither copied nor changed (deepcopy's memo maps each to its fake twin)."""
    memo = {}
    with fake_mode:
        for t in list(model.parameters()) + list(model.buffers()):
            if id(t) in memo:
                continue
            fake = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
            memo[id(t)] = torch.nn.Parameter(fake, requires_grad=t.requires_grad) \
                if isinstance(t, torch.nn.Parameter) else fake
    return copy.deepcopy(model, memo)


def fake_inputs(inputs, fake_mode):
    """Fake CPU tensors of the inputs' shapes and dtypes (fake tensors hold no values, so the inputs'
    device and data do not matter)."""
    from torch.utils._pytree import tree_map

    def conv(x):
        if isinstance(x, torch.Tensor) and not isinstance(x, torch._subclasses.FakeTensor):
            with fake_mode:
                return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype).requires_grad_(x.requires_grad)
        return x

    return tree_map(conv, inputs)


def token_inputs(vocab: int, batch: int, seq: int, device, labels: bool):
    ids = torch.randint(0, vocab, (batch, seq), device=device)
    d = {"input_ids": ids}
    if labels:
        d["labels"] = ids.clone()
    return d


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def total_params(config) -> int | None:
    """Parameters of the whole model (from a meta build of the config), or None."""
    try:
        from transformers import AutoModel, AutoModelForCausalLM

        with torch.device("meta"):
            try:
                m = AutoModelForCausalLM.from_config(config)
            except ValueError:
                m = AutoModel.from_config(config)
        return sum(p.numel() for p in m.parameters())
    except Exception:  # noqa: BLE001 - a count for the report only
        return None


def is_pow2(n: int) -> bool:
    return n > 0 and math.log2(n).is_integer()
