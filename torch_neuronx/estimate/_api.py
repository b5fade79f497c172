"""``torch_neuronx.estimate(model, inputs, ...)``: capture one step of one rank, cost it per platform."""

from __future__ import annotations

import contextlib
import gc
import math
import sys
from typing import Any

import torch

from torch_neuronx.estimate import _facts, _prices
from torch_neuronx.estimate._capture import Op, StepRecorder
from torch_neuronx.estimate._errors import EstimateError
from torch_neuronx.estimate._step import (DTYPES, TASKS, Capture, NoSequenceParallel, Plan, apply_fsdp, apply_recompute,
                                          apply_tp, build_hf, check_plan,
                                          decoder_layers, fake_inputs, fake_world, hf_tp_plan, run_step,
                                          text_config, to_fake, token_inputs, total_params)

MODES = ("full", "record")



class _Bar:
    """tqdm when installed and wanted; otherwise nothing."""

    def __init__(self, enabled: bool):
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=None, file=sys.stderr, leave=False, unit="op", dynamic_ncols=True)
            except ImportError:
                pass

    def stage(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description(f"estimate: {text}")

    def tick(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t


def _state_bytes(model, inputs) -> tuple[int, list[tuple[str, int]], int]:
    """Bytes of parameters, buffers and input tensors before the step, the parameters by size, and the
    bytes of the parameters alone (one rank's shards)."""
    from torch.utils._pytree import tree_leaves

    named = []
    seen = set()
    total = params = 0
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        loc = _local(t)
        if id(loc) in seen:
            continue
        seen.add(id(loc))
        n = loc.numel() * loc.element_size()
        total += n
        params += n if isinstance(t, torch.nn.Parameter) else 0
        named.append((f"parameter {name} {tuple(loc.shape)} {str(loc.dtype).replace('torch.', '')}", n))
    for x in tree_leaves(inputs):
        if isinstance(x, torch.Tensor):
            total += x.numel() * x.element_size()
    return total, named, params


def _trace_one(build, task: str, mode: str, compile_: bool, bar: _Bar, plan: Plan) -> dict:
    """Build (model, inputs) with ``build(fake_mode, device)`` and record its step."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    device = "neuron" if mode == "record" else "cpu"
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if mode == "full" else None
    boundary = {}
    with fake_world(plan, device) as mesh:
        model, inputs, decode_inputs = build(fake_mode, device, mesh)
        layers = decoder_layers(model)
        if layers is not None and len(layers):
            def hook(_m, _a, out):
                o = out[0] if isinstance(out, (tuple, list)) else out
                if isinstance(o, torch.Tensor) and "bytes" not in boundary:
                    lo = _local(o)
                    boundary["bytes"] = lo.numel() * lo.element_size()
            handle = layers[0].register_forward_hook(hook)
        else:
            handle = None
        static, named, param_bytes = _state_bytes(model, inputs)
        rec = StepRecorder(progress=bar.tick)
        ctx = contextlib.nullcontext()
        if compile_:
            from torch_neuronx.estimate._compiled import inductor_kernels

            ctx = inductor_kernels(rec)
            model.compile(backend="neuron")
        with fake_mode if fake_mode is not None else contextlib.nullcontext(), ctx:
            if compile_:
                # First step compiles (unrecorded); the second is the one measured, and its peak
                # device memory is the compiled step's.
                run_step(model, inputs, task, StepRecorder(), decode_inputs, compiled=True)
                boundary.clear()
                torch.neuron.synchronize()
                torch.neuron.reset_peak_memory_stats()
                base = torch.neuron.memory_allocated()
            # The peak counts storages until Python frees them: with the cycle collector off during the
            # step, when that happens does not depend on when a collection happens to run (determinism).
            gc.collect()
            gc.disable()
            try:
                run_step(model, inputs, task, rec, decode_inputs, compiled=compile_)
            finally:
                gc.enable()
            if compile_:
                rec.peak_by_phase = {"step": torch.neuron.max_memory_allocated() - base}
                rec.state_bytes = 0  # the measured step already holds the optimizer state
        if handle is not None:
            handle.remove()
        if compile_:
            torch._dynamo.reset()
    phases = rec.peak_by_phase
    opt = phases.get("optimizer", 0)
    before_opt = max((v for k, v in phases.items() if k != "optimizer"), default=0)
    # Steady state: the optimizer state exists while forward and backward run.
    peak = static + max(before_opt + rec.state_bytes, opt)
    largest = named + [(f"{n} output {shape} {dt} ({ph})", b) for (n, ph, shape, dt), b in rec.largest.items()]
    return {"ops": rec.ops, "peak": peak, "static": static, "largest": largest, "boundary": boundary.get("bytes", 0),
            "params": param_bytes, "forward_live": rec.forward_live}


def _combine(traces: list[dict], layers: int | None) -> tuple[list[Op], int, int, list, int, int, int]:
    """Layer replication: with traces of 1 and 2 layers, the step of n layers is
    T1 + (n - 1) * (T2 - T1), i.e. T1 weighted 2 - n and T2 weighted n - 1."""
    if len(traces) == 1:
        weights = [1.0]
    else:
        weights = [2.0 - layers, layers - 1.0]
    ops = []
    for tr, w in zip(traces, weights):
        for op in tr["ops"]:
            op.count *= w
            ops.append(op)
    peak = int(sum(w * tr["peak"] for tr, w in zip(traces, weights)))
    static = int(sum(w * tr["static"] for tr, w in zip(traces, weights)))
    params = int(sum(w * tr["params"] for tr, w in zip(traces, weights)))
    largest = sorted(traces[-1]["largest"], key=lambda x: -x[1])
    # Activations one more layer keeps for the backward (the 2-layer trace's extra over the 1-layer one).
    per_layer = traces[1]["forward_live"] - traces[0]["forward_live"] if len(traces) == 2 else \
        traces[0]["forward_live"] // max(1, layers or 1)
    return ops, peak, static, largest, traces[-1]["boundary"], params, max(0, per_layer)


def _micro_steps(task: str, batch: int, micro_batch: int, plan: Plan) -> tuple[int, int]:
    """(sequences per rank per forward, forward/backward passes per step)."""
    if task == "train":
        per = plan.dp * micro_batch
        if batch % per:
            raise EstimateError(f"--batch {batch} is not a multiple of dp x micro-batch = {plan.dp} x {micro_batch}; "
                                "the global batch is split into micro-batches of every data-parallel rank")
        return micro_batch, batch // per
    if batch % plan.dp:
        raise EstimateError(f"--batch {batch} is not a multiple of --dp {plan.dp}")
    return batch // plan.dp, 1


def _synthesized(plan: Plan, cap_ops: list[Op], grad_bytes: int, micro_steps: int, boundary: int,
                 task: str) -> list[Op]:
    """Collectives the traced step does not issue itself: DDP's gradient all-reduce (dp without FSDP),
    pipeline point-to-point transfers, context-parallel K/V exchange."""
    extra = []
    if plan.dp > 1 and not plan.fsdp and task == "train":
        extra.append(Op("c10d.allreduce_.ddp", "backward", [], [], grad_bytes, 0, collective="all_reduce",
                        group=plan.group("dp"), comm_bytes=grad_bytes))
    if plan.pp > 1:
        phases = ("forward", "backward") if task == "train" else (task,)
        for ph in phases:
            extra.append(Op("c10d.send.pp", ph, [], [], boundary, 0, collective="send",
                            group=(0, plan.stride("pp")), comm_bytes=boundary, count=float(micro_steps)))
    if plan.cp > 1:
        for op in cap_ops:
            if "attention" in op.name and op.collective is None and len(op.inputs) >= 3:
                op.args["kv_scale"] = plan.cp
                bwd = op.name.split(".")[1].endswith("_backward")
                k_shape, dt = op.inputs[2 if bwd else 1]
                kv = 2 * math.prod(k_shape) * torch.empty((), dtype=getattr(torch, dt)).element_size()
                extra.append(Op("cp.kv_exchange", op.phase, [], [], kv * plan.cp, 0,
                                collective="reduce_scatter" if bwd else "all_gather", group=plan.group("cp"),
                                comm_bytes=kv * plan.cp, count=op.count))
    return extra


def capture(model: Any, inputs: Any = None, *, task: str = "train", batch: int | None = None, micro_batch: int = 1,
            seq: int | None = None, new_tokens: int | None = None, dtype: str = "bf16", plan: Plan = Plan(),
            mode: str = "full", compile: bool = False, progress: bool = False) -> Capture:
    """One rank's step of ``model`` (an nn.Module with ``inputs``, or a Hugging Face config)."""
    if task not in TASKS:
        raise EstimateError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
    if dtype not in DTYPES:
        raise EstimateError(f"unknown dtype {dtype!r}; choose from bf16, fp8, mxfp8, fp32")
    if mode not in MODES:
        raise EstimateError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    # Full size and compiled: the step is traced eagerly on fake tensors (Inductor's kernels cannot run
    # there) and its element-wise ops are costed as a graph compiler fuses them (_model._fuse).
    fuse = compile and mode == "full"
    compile = compile and not fuse
    for name, v in (("tp", plan.tp), ("pp", plan.pp), ("dp", plan.dp), ("cp", plan.cp), ("ep", plan.ep),
                    ("micro-batch", micro_batch)):
        if not isinstance(v, int) or v < 1:
            raise EstimateError(f"--{name} must be a positive integer, not {v!r}")
    if plan.fsdp and plan.dp == 1:
        raise EstimateError("--fsdp shards over the data-parallel ranks: give --dp > 1")
    if plan.sp and plan.tp == 1:
        raise EstimateError("--sp shards the sequence over the tensor-parallel ranks: give --tp > 1")
    bar = _Bar(progress)
    assumptions: list[str] = []
    torch_dtype = DTYPES[dtype]
    if dtype in ("fp8", "mxfp8"):
        assumptions.append(f"--dtype {dtype}: matmuls are costed at the FP8 rate; activations, attention and "
                           "memory stay in bf16")
    # A Hugging Face config, recognised without importing transformers (slow, and optional for modules).
    is_config = any(c.__name__.lower() == "pretrainedconfig" and c.__module__.startswith("transformers")
                    for c in type(model).__mro__)
    if task in ("decode", "generate") and not is_config:
        raise EstimateError(f"--task {task} builds a KV cache: give a Hugging Face config (or model name), not a "
                            "module with inputs")
    try:
        if is_config:
            cap = _capture_config(model, task, batch, micro_batch, seq, new_tokens, torch_dtype, plan, mode, compile,
                                  bar, assumptions)
        else:
            cap = _capture_module(model, inputs, task, batch, micro_batch, plan, mode, compile, bar, assumptions)
    except EstimateError:
        raise
    except torch.OutOfMemoryError as e:
        raise EstimateError(f"record mode ran out of device memory ({str(e).splitlines()[0]}); estimate at full size "
                            "on fake tensors instead (mode='full', the CLI's default)") from e
    except Exception as e:  # noqa: BLE001 - the model's own failure, reported with what to try
        where = "on fake tensors" if mode == "full" else "on neuron"
        raise EstimateError(f"the step failed to run {where} for this plan: {type(e).__name__}: "
                            f"{(str(e).strip().splitlines() or [''])[0]}. Check that the model runs with these inputs "
                            "on the CPU; for tensor parallelism the model's tp_plan must fit its forward (try --tp 1)"
                            ) from e
    finally:
        bar.close()
    if fuse:
        cap.fused = True
        cap.assumptions.append("compiled at full size: the step is traced eagerly on fake tensors and every run of "
                               "consecutive element-wise ops costs as one fused kernel (each op's instructions on its "
                               "engine, HBM read and written once, one fixed cost), as neuronx-cc / Inductor fuse them")
    return cap


def _capture_config(config, task, batch, micro_batch, seq, new_tokens, torch_dtype, plan, mode, compile_, bar,
                    assumptions) -> Capture:
    t = text_config(config)
    assumptions += check_plan(config, plan, task)
    batch = batch or 1
    seq = seq or 128
    if task == "generate":
        new_tokens = new_tokens or 128
    if seq % plan.cp:
        raise EstimateError(f"--seq {seq} is not a multiple of --cp {plan.cp}")
    per_rank, micro_steps = _micro_steps(task, batch, micro_batch, plan)
    vocab = getattr(t, "vocab_size", None)
    if not vocab:
        raise EstimateError(f"the config ({type(config).__name__}) has no vocab_size to make token inputs from; use "
                            "a module:function entry point that makes the inputs")
    layers = getattr(t, "num_hidden_layers", None)
    stage_layers = layers // plan.pp if layers else None
    traced = [1, 2] if stage_layers and stage_layers >= 3 else [stage_layers] if stage_layers else [None]
    if len(traced) == 2:
        assumptions.append(f"decoder layers are identical: one pipeline stage's {stage_layers} layers are costed as "
                           "the 1-layer model plus (n-1) times the 2-layer model's extra layer (traced twice)")
    if plan.pp > 1:
        assumptions.append("every pipeline stage is costed as the one holding the embedding and the head "
                           "(the slowest stage sets the pace)")
    local_seq = seq // plan.cp if task in ("train", "prefill") else seq
    grad_bytes = 0

    def make(phase_task, ctx_len, q_len, sp):
        def build(fake_mode, device, mesh, n_layers):
            model = build_hf(config, n_layers if n_layers is not None else layers, plan, torch_dtype, fake_mode)
            if mode == "record":
                model.to(device)
            if mesh is not None and plan.tp > 1:
                apply_tp(model, mesh["tp"], hf_tp_plan(model), sp=sp, vocab_parallel_loss=phase_task == "train")
            if plan.recompute and phase_task == "train":
                apply_recompute(model)
            if mesh is not None and plan.fsdp:
                apply_fsdp(model, mesh["dp"])
            with fake_mode if fake_mode is not None else contextlib.nullcontext():
                ins = token_inputs(vocab, per_rank, ctx_len, device, labels=phase_task == "train")
            # Inference computes the logits of the last position only (what generate and vLLM ask for,
            # and what on-device sampling reads), not of the whole prompt.
            last = {"logits_to_keep": 1} if phase_task != "train" and _takes(model, "logits_to_keep") else {}
            ins.update(last)
            decode_inputs = None
            if phase_task == "decode":
                # Transformers 5.x calls the KV cache `cache` (`past_key_values` is deprecated); models
                # written for 4.x still take `past_key_values`.
                cache_arg = "cache" if _takes(model, "cache") else "past_key_values"

                def decode_inputs(out, _ins=ins):
                    ids = _ins["input_ids"][:, -q_len:]
                    kv = out.cache if hasattr(out, "cache") else out.past_key_values
                    return {"input_ids": ids, cache_arg: kv, "use_cache": True, **last}
            return model, ins, decode_inputs
        return build

    def trace(phase_task, ctx_len, q_len=1):
        sp = _use_sp(plan, phase_task)
        while True:
            try:
                traces = []
                for n in traced:
                    bar.stage(f"{phase_task} with {n if n is not None else 'all'} layer(s)")
                    b = make(phase_task, ctx_len, q_len, sp)
                    tr = _trace_one(lambda fm, dev, mesh, n=n, b=b: b(fm, dev, mesh, n), phase_task, mode, compile_,
                                    bar, plan)
                    traces.append(tr)
                break
            except Exception as e:  # noqa: BLE001 - sequence parallelism by default only where it traces
                sp_notes.append(_sp_fallback(e, plan, sp, phase_task, retry=True))
                sp = False
        if phase_task in ("train", "prefill"):
            sp_used.append(sp)
        return _combine(traces, stage_layers)

    sp_notes: list[str] = []
    sp_used: list[bool] = []
    if task in ("train", "prefill"):
        ops, peak, static, largest, boundary, params, per_layer = trace(task, local_seq)
        if task == "train" and plan.pp > 1:
            # 1F1B: the first stage holds the activations of up to pp micro-batches at once.
            in_flight = min(plan.pp, micro_steps)
            peak += (in_flight - 1) * per_layer * (stage_layers or 1)
            assumptions.append(f"pipeline memory: the first stage keeps the layer activations of {in_flight} "
                               "micro-batches in flight (1F1B)")
        if task == "train":
            for op in ops:
                if op.phase != "optimizer":
                    op.count *= micro_steps
            grad_bytes = params  # DDP reduces gradients of the size of the rank's parameters
        tokens = batch * seq
    elif task == "decode":
        ops, peak, static, largest, boundary, _, _ = trace("decode", seq)
        tokens = batch
        assumptions.append(f"decode: one new token per sequence with a KV cache of {seq} tokens (prefill not counted)")
    else:  # generate: prefill once, then new_tokens decode steps at the mean context length
        ops, peak, static, largest, boundary, _, _ = trace("prefill", seq)
        mid = seq + new_tokens // 2
        d_ops, d_peak, _, d_largest, _, _, _ = trace("decode", mid)
        for op in d_ops:
            op.count *= new_tokens
        ops += d_ops
        peak = max(peak, d_peak)
        largest = sorted(largest + d_largest, key=lambda x: -x[1])
        tokens = batch * new_tokens
        assumptions.append(f"generate: prefill of {seq} tokens, then {new_tokens} decode steps each costed at the mean "
                           f"context length {mid}; tokens/s counts generated tokens")
    ops += _synthesized(plan, ops, grad_bytes, micro_steps, boundary, task)
    if plan.dp > 1 and not plan.fsdp and task == "train":
        assumptions.append("--dp without --fsdp: DDP, one all-reduce of the gradients per step overlapping the "
                           "backward")
    if plan.recompute and task == "train":
        assumptions.append("activation recompute: every decoder layer is checkpointed; its forward runs again in "
                           "the backward (traced, so its cost is counted)")
    if plan.pp > 1:
        assumptions.append(f"pipeline: 1F1B with {micro_steps} micro-batch(es) per step; bubble (pp-1) micro-batch "
                           "times; stage-to-stage transfers exposed only while the pipeline fills and drains")
    if plan.cp > 1:
        assumptions.append("context parallel: each rank holds seq/cp tokens; ring attention exchanges K/V over the cp "
                           "group, overlapping attention compute")
    sp = any(sp_used)
    assumptions += sp_notes + _sp_assumptions(plan, task, sp, last_token=True)
    return Capture(ops=ops, peak_bytes=peak, static_bytes=static, largest=largest, tokens=tokens,
                   micro_steps=micro_steps, layers=layers, stage_layers=stage_layers, assumptions=assumptions,
                   pp_boundary_bytes=boundary, param_count=total_params(config) or 0, sp=sp)


def _use_sp(plan: Plan, phase_task: str) -> bool:
    """Sequence parallelism for one traced phase: only with tp > 1, and never for decode (one token
    per sequence has no sequence to split; NeuronX Distributed uses it for context encoding only)."""
    if plan.tp == 1 or phase_task == "decode":
        return False
    return plan.sp is not False


def _sp_fallback(e: Exception, plan: Plan, sp: bool, task: str, retry: bool) -> str:
    """A trace with sequence parallelism failed with ``e``: re-raised unless sequence parallelism was
    only the default (``plan.sp`` None) and a retry without it is possible (``retry``), then the
    assumption that says why it is off. ``--sp`` asked for explicitly on a model that cannot have it
    is an EstimateError naming the module."""
    if isinstance(e, NoSequenceParallel) and plan.sp:
        raise EstimateError(f"--sp: {e}; run without --sp (tensor parallelism alone)") from e
    if not sp or plan.sp is not None or not retry:
        raise e
    why = str(e) if isinstance(e, NoSequenceParallel) else \
        f"the step failed to trace with it ({type(e).__name__}: {(str(e).splitlines() or [''])[0]})"
    return f"sequence parallelism not applied to {task}: {why}"


def _sp_assumptions(plan: Plan, task: str, sp: bool, last_token: bool) -> list[str]:
    notes = []
    if sp:
        notes.append("sequence parallelism (tp > 1): norms, residual adds and element-wise work between the "
                     "tensor-parallel blocks run on seq/tp tokens per rank; each block all-gathers its input over the "
                     "sequence and reduce-scatters its output (instead of one all-reduce), as NeuronX Distributed "
                     "and TorchTitan run TP" + ("; decode steps run without it" if task == "generate" else ""))
    elif plan.tp > 1 and task != "decode":
        notes.append("no sequence parallelism: every tensor-parallel rank runs norms and element-wise work on the "
                     "whole sequence")
    if plan.tp > 1 and task == "train":
        notes.append("vocabulary-parallel loss (tp > 1): the head's logits stay sharded over the vocabulary and the "
                     "cross-entropy runs on each rank's shard (torch's loss_parallel, as NeuronX Distributed's "
                     "parallel cross-entropy): no gathered full-vocabulary logits")
    if task != "train" and last_token:
        notes.append("inference computes the logits of the last position only (logits_to_keep=1, as generate, vLLM "
                     "and on-device sampling do)")
    return notes


def _takes(model, arg: str) -> bool:
    import inspect

    try:
        return arg in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _capture_module(model, inputs, task, batch, micro_batch, plan, mode, compile_, bar, assumptions) -> Capture:
    if not isinstance(model, torch.nn.Module):
        raise EstimateError(f"model must be an nn.Module or a Hugging Face config, not {type(model).__name__}")
    if inputs is None:
        raise EstimateError("a module needs example inputs (a tensor, a tuple of arguments or a dict of keyword "
                            "arguments) for one rank's micro-batch")
    if plan.pp > 1 or plan.cp > 1:
        raise EstimateError("--pp and --cp are modelled for Hugging Face configs (their layers and sequence); for "
                            "a module, trace one stage / one sequence shard yourself")
    from torch.utils._pytree import tree_leaves

    leaves = [x for x in tree_leaves(inputs) if isinstance(x, torch.Tensor)]
    ids = inputs.get("input_ids") if isinstance(inputs, dict) else None
    per_pass = ids.numel() if isinstance(ids, torch.Tensor) else (leaves[0].shape[0] if leaves and leaves[0].dim()
                                                                   else 1)
    if not isinstance(ids, torch.Tensor):
        assumptions.append("tokens are counted as samples (the first dimension of the first input)")
    samples = (leaves[0].shape[0] if leaves and leaves[0].dim() else 1)
    micro_steps = 1
    if batch is not None and task == "train":
        per = plan.dp * samples
        if batch % per:
            raise EstimateError(f"batch {batch} is not a multiple of dp x the inputs' batch = {plan.dp} x {samples}")
        micro_steps = batch // per
    n_params = sum(_local(p).numel() for p in model.parameters())

    def build(fake_mode, device, mesh, sp):
        m = model
        if fake_mode is not None:
            m = to_fake(model, fake_mode)
            ins = fake_inputs(inputs, fake_mode)
        else:
            m = model.to(device)
            from torch_neuronx.testing import to_device

            ins = to_device(inputs, torch.device(device))
        if mesh is not None and plan.tp > 1:
            apply_tp(m, mesh["tp"], hf_tp_plan(m), sp=sp, vocab_parallel_loss=task == "train")
        if plan.recompute and task == "train":
            apply_recompute(m)
        if mesh is not None and plan.fsdp:
            apply_fsdp(m, mesh["dp"])
        return m, ins, None

    bar.stage(task)
    sp = _use_sp(plan, task)
    try:
        tr = _trace_one(lambda fm, dev, mesh: build(fm, dev, mesh, sp), task, mode, compile_, bar, plan)
    except Exception as e:  # noqa: BLE001 - sequence parallelism by default only where it traces
        # A failed trace in record mode has already parallelized the caller's model: no second try.
        assumptions.append(_sp_fallback(e, plan, sp, task, retry=isinstance(e, NoSequenceParallel) or mode == "full"))
        sp = False
        tr = _trace_one(lambda fm, dev, mesh: build(fm, dev, mesh, sp), task, mode, compile_, bar, plan)
    assumptions += _sp_assumptions(plan, task, sp, last_token=False)
    ops = tr["ops"]
    if task == "train":
        for op in ops:
            if op.phase != "optimizer":
                op.count *= micro_steps
    ops += _synthesized(plan, ops, tr["params"], micro_steps, 0, task)
    tokens = per_pass * micro_steps * plan.dp
    return Capture(ops=ops, peak_bytes=tr["peak"], static_bytes=tr["static"],
                   largest=sorted(tr["largest"], key=lambda x: -x[1]), tokens=tokens, micro_steps=micro_steps,
                   layers=None, stage_layers=None, assumptions=assumptions, param_count=n_params, sp=sp)


def estimate(model: Any, inputs: Any = None, *, task: str = "train", batch: int | None = None, micro_batch: int = 1,
             seq: int | None = None, new_tokens: int | None = None, dtype: str = "bf16", tp: int = 1, pp: int = 1,
             dp: int = 1, cp: int = 1, ep: int = 1, fsdp: bool = False, recompute: bool = False,
             sp: bool | None = None, platforms="trn2,trn3",
             instances: int | None = None, compile: bool = False, mode: str = "full", prices: str | None = None,
             progress: bool = False, name: str | None = None):
    """Estimated step time, tokens/s, MFU, memory and $ per 1M tokens of one training or inference step
    on each platform, from one rank's step captured at the aten level. Returns an ``Estimate`` (print it,
    ``.to_json()``, ``.plot(path)``, ``.to_trace(path)``).

    ``model``: an nn.Module with ``inputs`` (one rank's micro-batch: a tensor, a tuple of arguments or a
    dict of keyword arguments), or a Hugging Face config (inputs are made from ``batch``/``seq``).
    ``mode="full"``: fake tensors, the model at its real size costs no memory; ``"record"``: the step runs
    on ``neuron`` at the size given; ``compile=True`` (record mode) costs Inductor's fused kernels.
    ``sp``: sequence parallelism with tp > 1 (None: on for train and prefill where the model's
    tensor-parallel plan allows it, as NeuronX Distributed and TorchTitan run TP; decode never).
    ``platforms``: "trn2,trn3" (also trn1, and h100/h200 as GPU comparators of a simpler model).
    Bad input raises ``EstimateError`` (a ValueError) naming the fix; a model that does not fit is
    reported (``fits`` False), not raised.
    """
    from torch_neuronx.estimate._model import evaluate
    from torch_neuronx.estimate._report import Estimate

    names = _facts.parse_platforms(platforms)
    price_table = _prices.load(prices)
    plan = Plan(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, fsdp=fsdp, recompute=recompute, sp=sp)
    for n in names:  # unknown or unbuildable platforms fail before the (long) trace
        from torch_neuronx.estimate._costs import target

        t = target(n)
        if instances is not None:
            need = math.ceil(math.ceil(plan.world / t.ranks_per_chip) / t.chips_per_instance)
            if instances < need:
                raise EstimateError(f"--instances {instances} is too few for {plan.world} ranks on {n}: they need "
                                    f"{need} x {t.instance}")
    cap = capture(model, inputs, task=task, batch=batch, micro_batch=micro_batch, seq=seq, new_tokens=new_tokens,
                  dtype=dtype, plan=plan, mode=mode, compile=compile, progress=progress)
    if dtype == "mxfp8":
        no_mx = [n for n in names if n in _facts.TRAINIUM and not _facts.chip(n)["supports_mx"]]
        if no_mx:
            cap.assumptions.append(f"--dtype mxfp8 on {', '.join(no_mx)}: no MX matmuls on that NeuronCore, costed at "
                                   "its FP8 rate")
    results = {n: evaluate(cap, plan, n, dtype, cap.tokens, instances, price_table) for n in names}
    label = name or (f"{type(model).__name__}" if not hasattr(model, "model_type") else
                     f"{getattr(model, 'name_or_path', '') or model.model_type} config")
    return Estimate(model=label, task=task, plan=plan, dtype=dtype, mode=mode, compiled=compile, capture=cap,
                    results=results, prices=price_table, settings=dict(batch=batch, micro_batch=micro_batch, seq=seq,
                                                                       new_tokens=new_tokens, instances=instances))
