"""Does my model run on ``neuron``, and does it compute what the CPU computes?

``check_model(model, example_inputs)`` runs the model on ``neuron`` and, as the
reference, on the CPU (two deep copies with the same weights): an inference and a
short training step, then compares outputs, gradients and weights after the step, and
records fallback ops, peak device memory and time per step. Every problem found comes
with a line of advice. ``python -m torch_neuronx.check TARGET`` does the same for a
Hugging Face config, a model in the local Hugging Face cache or a Python entry point;
see ``--help``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import importlib.util
import inspect
import json
import os
import platform as _platform
import re
import shlex
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from torch_neuronx.testing import compare, map_tensors, model_tolerance, tensors, to_cpu, to_device

SEED = 0
_OP = re.compile(r"\baten::[A-Za-z0-9_.]+")

ADVICE = {
    "fallback": (
        "runs through the generic fallback; allow it with set_fallback_policy('warn') "
        "(CLI: --fallback-policy warn) or report it so it gets a native kernel"
    ),
    "mismatch": (
        "neuron computes different numbers than the CPU from the same weights and inputs: "
        "a device bug; report it with the repro info below"
    ),
    "oom": (
        "out of device memory: reduce the batch size or sequence length (CLI: --batch/--seq), or give "
        "the device more memory with NEURON_DEVICE_MEMORY (e.g. NEURON_DEVICE_MEMORY=48GiB)"
    ),
    "device_code": (
        "the model's own code computes something else on neuron than on the CPU (every aten op matches "
        "the CPU on its inputs): look for code that branches on the device or picks a dtype by device"
    ),
    "error": "fails on neuron but runs on the CPU: a device bug; report it with the repro info below",
    "compile": (
        "fails to compile for neuron (eager neuron is not affected): run without --compile, or let failing "
        "graphs run eagerly with TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0; report it with the repro info below"
    ),
    "cpu_error": (
        "fails on the CPU too: the model or its inputs are wrong, not the device; "
        "fix them so the model runs on the CPU first"
    ),
}


@dataclass
class Run:
    """One stage (``load``, ``inference``, ``training``) on one device."""

    stage: str
    device: str
    seconds: float | None = None  # median wall-clock time per step
    peak_memory: int | None = None  # bytes, device runs only
    error: str | None = None


@dataclass
class Comparison:
    """Worst difference from the CPU of one named result over all steps of a stage."""

    stage: str
    name: str  # an output ("logits", "loss", "output[0]"), "gradients" or "weights after step"
    ok: bool
    max_abs: float
    max_rel: float
    where: str  # worst tensor inside it (a parameter name for gradients and weights)
    message: str


@dataclass
class Problem:
    kind: str  # "fallback", "mismatch", "oom", "error" or "cpu_error"
    what: str
    stages: list[str]
    advice: str


@dataclass
class CheckReport:
    model: str
    device: str
    fallback_policy: str
    runs: list[Run] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    fallback_ops: dict[str, int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    repro: dict[str, str] = field(default_factory=dict)
    divergence: str = ""  # for a mismatch: the first aten op that computes differently, if any
    # With compile: backend, compiles, recompiles, graph breaks (count, reasons), compile time.
    compile: dict[str, Any] = field(default_factory=dict)
    # Estimated step time on Trainium (torch_neuronx.estimate, one rank, full size on fake tensors):
    # platform -> seconds, or "error" -> why no estimate was made.
    estimate: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        d = asdict(self)
        d["passed"] = self.passed
        return d

    def __str__(self) -> str:
        lines = [f"torch_neuronx.check: {self.model}"]
        if "inputs" in self.repro:
            lines.append(f"  inputs: {self.repro['inputs']}")
        lines.append(f"  on {self.device}, fallback policy '{self.fallback_policy}'")
        lines += [f"  note: {n}" for n in self.notes]
        lines.append("")
        rows = [("stage", "device", "time/step", "peak memory", "result")]
        for r in self.runs:
            result = "error" if r.error else "ok"
            rows.append((r.stage, r.device, _fmt_time(r.seconds), _fmt_bytes(r.peak_memory), result))
        lines += _table(rows)
        if self.comparisons:
            lines += ["", "compared with the CPU (model tolerance: rtol=atol=1e-4 in fp32, 5e-2 in bf16/fp16):"]
            rows = [("stage", "output", "max abs diff", "status")]
            for c in self.comparisons:
                per_parameter = c.where and c.name in ("gradients", "weights after step")
                name = f"{c.name} (worst: {c.where})" if per_parameter else c.name
                rows.append((c.stage, name, f"{c.max_abs:.3g}", "ok" if c.ok else "MISMATCH"))
            lines += _table(rows)
        blocked = {m.group(0) for p in self.problems if p.kind == "fallback" for m in [_OP.search(p.what)] if m}
        listed = {**{op: 0 for op in blocked}, **self.fallback_ops}  # a blocked op never ran: no count
        ops = ", ".join(op + (f" x{n}" if n else "") + (" (blocked)" if op in blocked else "")
                        for op, n in sorted(listed.items())) or "none"
        lines += ["", f"generic-fallback ops on neuron: {ops}"]
        if self.estimate:
            if "error" in self.estimate:
                lines.append(f"estimated step time on Trainium: not available ({self.estimate['error']})")
            else:
                times = ", ".join(f"{k} {_fmt_time(v)}" for k, v in self.estimate.items())
                lines.append(f"estimated {'training' if 'training' in {r.stage for r in self.runs} else 'inference'}"
                             f" step time on Trainium (torch_neuronx.estimate, one core): {times}")
        if self.compile:
            c = self.compile
            lines.append(
                f"torch.compile(backend={c['backend']!r}) on neuron: {c['compiles']} graph(s) compiled, "
                f"{c['recompiles']} recompile(s), {c['graph_breaks']} graph break(s), "
                f"compile time {_fmt_time(c['compile_time_s'])}"
            )
            for reason, n in c["graph_break_reasons"].items():
                lines.append(f"  graph break x{n}: {reason.splitlines()[0] if reason else reason}")
        lines.append("")
        if self.passed:
            lines.append("PASS: the model runs on neuron and matches the CPU")
        else:
            n = len(self.problems)
            lines.append(f"FAIL: {n} problem{'s' if n > 1 else ''}")
            by_advice: dict[str, list[Problem]] = {}
            for p in self.problems:
                by_advice.setdefault(p.advice, []).append(p)
            for advice, problems in by_advice.items():
                for p in problems:
                    lines.append(f"  [{p.kind}] {'/'.join(p.stages)}: {p.what}")
                    if p.kind == "mismatch" and self.divergence:
                        lines.append(f"    where it starts: {self.divergence}")
                lines.append(f"    what to do: {advice}")
            lines += ["", "repro info:"]
            lines += _table([(f"{k}:", v) for k, v in self.repro.items()], header=False)
        return "\n".join(lines)


def check_model(
    model: torch.nn.Module,
    example_inputs: Any,
    *,
    train: bool = True,
    steps: int = 1,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: str | Callable[[Any], torch.optim.Optimizer] = "adamw",
    fallback_policy: str = "silent",
    device: str | torch.device = "neuron",
    progress: bool = True,
    name: str | None = None,
    compile: bool | str = False,
) -> CheckReport:
    """Run ``model`` on ``device`` and on the CPU (the reference) and compare.

    ``example_inputs``: a tensor, a tuple/list of positional arguments or a dict of keyword
    arguments. ``model`` itself is not changed: each device gets a deep copy. The training
    step uses ``loss_fn(output)``, else the output's ``.loss``, else the sum of the float
    outputs, then ``backward()`` and an optimizer step (``"adamw"``, ``"sgd"`` or a callable
    ``params -> Optimizer``). The device runs under ``fallback_policy``. Exceptions raised by
    the model are caught and reported, never raised. Resets the op tracking
    (``torch.neuron.clear_op_tracking``) and the device's peak memory statistics.

    ``compile=True`` (or a backend name; True means ``"neuron"``) runs the device copy under
    ``torch.compile`` and reports its graph breaks, recompiles and compile time
    (``torch.neuron.get_dynamo_metrics``, which this resets).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, not {steps}")
    if fallback_policy not in ("silent", "warn", "error"):
        raise ValueError(f"fallback_policy must be 'silent', 'warn' or 'error', not {fallback_policy!r}")
    dev = torch.device(device)
    if dev.type != "neuron":
        raise ValueError(f"device must be a neuron device, not {dev}")
    if dev.index is None:
        dev = torch.device("neuron", torch.neuron.current_device())
    args, kwargs = _split_inputs(example_inputs)
    make_optimizer = _optimizer_factory(optimizer)

    report = CheckReport(model=name or _describe_model(model), device=str(dev), fallback_policy=fallback_policy)
    report.repro = _repro(model, args, kwargs, dev, fallback_policy, train, steps)
    stages = ["inference"] + (["training"] if train else [])
    bar = _progress(1 + 2 * steps * len(stages), progress)
    problems: dict[tuple[str, str], Problem] = {}

    def problem(kind: str, what: str, stage: str) -> None:
        p = problems.setdefault((kind, what), Problem(kind, what, [], ADVICE[kind]))
        if stage not in p.stages:
            p.stages.append(stage)

    try:
        cpu_model = copy.deepcopy(model).to("cpu")
        dev_model = copy.deepcopy(model)
    except Exception as e:  # noqa: BLE001 - a model that cannot be copied cannot be checked
        raise ValueError(f"check_model needs two copies of the model with the same weights, "
                         f"but copy.deepcopy failed: {type(e).__name__}: {e}") from e
    cpu_args, cpu_kwargs = to_cpu(args), to_cpu(kwargs)
    backend = ("neuron" if compile is True else compile) or None
    if backend:
        from torch import _dynamo

        _dynamo.reset()
        torch.neuron.reset_dynamo_metrics()
        dev_model.compile(backend=backend)  # in place: parameter names stay comparable

    dev_args, dev_kwargs = (), {}
    torch.neuron.clear_op_tracking()
    load = Run("load", str(dev))
    report.runs.append(load)
    bar.set_description(f"check: load on {dev}")
    try:
        with torch.neuron.fallback_policy(fallback_policy):
            torch.neuron.reset_peak_memory_stats(dev)
            start = time.perf_counter()
            dev_model.to(dev)
            dev_args, dev_kwargs = to_device(args, dev), to_device(kwargs, dev)
            torch.neuron.synchronize(dev)
            load.seconds = time.perf_counter() - start
            load.peak_memory = torch.neuron.max_memory_allocated(dev)
    except Exception as e:  # noqa: BLE001 - the device's failure is the finding
        load.error = _first_line(e)
        problem(*_classify(e, fallback_policy), "load")
    bar.update(1)

    if load.error is None:
        for stage in stages:
            _run_stage(stage, cpu_model, dev_model, (cpu_args, cpu_kwargs), (dev_args, dev_kwargs), dev, steps,
                       loss_fn, make_optimizer, fallback_policy, report, problem, bar)
    bar.close()
    report.fallback_ops = torch.neuron.get_fallback_ops()
    mismatched = {stage for p in problems.values() if p.kind == "mismatch" for stage in p.stages}
    if mismatched:
        report.divergence, op_found = _locate(model, args, kwargs, dev, "training" in mismatched, loss_fn)
        if not op_found:
            for p in problems.values():
                if p.kind == "mismatch":
                    p.advice = ADVICE["device_code"]
    if report.fallback_ops and fallback_policy != "error" and not problems:
        report.notes.append("the generic-fallback ops below work, but have no native kernel; "
                            "--fallback-policy error (fallback_policy='error') fails on them")
    report.problems = list(problems.values())
    report.estimate = _estimate(model, args, kwargs, train)
    if backend:
        m = torch.neuron.get_dynamo_metrics()
        report.compile = dict(backend=backend, compiles=m.compiles, recompiles=m.recompiles,
                              recompile_reasons=m.recompile_reasons, graph_breaks=m.graph_breaks,
                              graph_break_reasons=m.graph_break_reasons, compile_time_s=m.compile_time_s)
        _dynamo.reset()
    del dev_model, dev_args, dev_kwargs
    torch.neuron.empty_cache()
    return report


def _run_stage(stage, cpu_model, dev_model, cpu_in, dev_in, dev, steps, loss_fn, make_optimizer, policy,
               report, problem, bar) -> None:
    """Run ``steps`` steps on each device, the CPU step first, and keep the worst difference per result."""
    training = stage == "training"
    sides = {
        "cpu": dict(model=cpu_model, inputs=cpu_in, run=Run(stage, "cpu"), times=[], ctx=contextlib.nullcontext),
        "dev": dict(model=dev_model, inputs=dev_in, run=Run(stage, str(dev)), times=[],
                    ctx=lambda: torch.neuron.fallback_policy(policy)),
    }
    for side in sides.values():
        report.runs.append(side["run"])
        side["model"].train(training)
        side["opt"] = make_optimizer(side["model"].parameters()) if training else None
    if not training:
        # One untimed forward per device first: otherwise the first device to run pays the
        # process's one-time costs (kernel selection, allocator growth) and the times mislead.
        for key, side in sides.items():
            args, kwargs = side["inputs"]
            try:
                with side["ctx"](), torch.no_grad():
                    side["model"](*args, **kwargs)
            except Exception:  # noqa: BLE001 - the timed run below reports it
                pass
    worst: dict[str, Comparison] = {}
    torch.neuron.reset_peak_memory_stats(dev)
    for step in range(steps):
        results = {}
        for key, side in sides.items():
            run = side["run"]
            bar.set_description(f"check: {stage} on {run.device} ({step + 1}/{steps})")
            if run.error is None:
                args, kwargs = side["inputs"]
                try:
                    with side["ctx"]():
                        # Same seed on both devices: neuron draws CPU's random stream, so dropout agrees.
                        torch.manual_seed(SEED + step)
                        start = time.perf_counter()
                        if training:
                            result = _train_step(side["model"], side["opt"], args, kwargs, loss_fn)
                        else:
                            with torch.no_grad():
                                result = {"outputs": _named(side["model"](*args, **kwargs))}
                        if key == "dev":
                            torch.neuron.synchronize(dev)
                        side["times"].append(time.perf_counter() - start)
                    results[key] = result
                except Exception as e:  # noqa: BLE001 - the model's failure is the finding
                    run.error = _first_line(e)
                    if key == "cpu":
                        problem("cpu_error", f"{type(e).__name__}: {_first_line(e)}", stage)
                    elif sides["cpu"]["run"].error is None:
                        problem(*_classify(e, policy), stage)
            bar.update(1)
        if len(results) == 2:
            for name, (actual, expected) in _pairs(results["dev"], results["cpu"]).items():
                diff = compare(actual, expected, tolerance=model_tolerance, device_type=dev.type)
                if diff.compared == 0 and diff.ok:
                    continue  # nothing numeric in it (e.g. a key-value cache object)
                where = diff.where or (diff.mismatched[0] if diff.mismatched else "")
                c = worst.setdefault(name, Comparison(stage, name, True, 0.0, 0.0, where, ""))
                if diff.max_abs > c.max_abs:
                    c.max_abs, c.where = diff.max_abs, where
                c.max_rel = max(c.max_rel, diff.max_rel)
                if c.ok and not diff.ok:
                    c.ok, c.message, c.where = False, diff.message, where
    for side in sides.values():
        # The first step pays one-time costs (autograd and optimizer state set-up); with
        # more than one step it is left out of the median.
        times = side["times"][1:] if len(side["times"]) > 1 else side["times"]
        side["run"].seconds = statistics.median(times) if times else None
    sides["dev"]["run"].peak_memory = torch.neuron.max_memory_allocated(dev)
    for c in worst.values():
        report.comparisons.append(c)
        if not c.ok:
            problem("mismatch", _mismatch(c.name, c.message), stage)


def _estimate(model, args, kwargs, train: bool) -> dict[str, Any]:
    """Estimated step time on trn2 and trn3 of the step checked (one rank, fake tensors)."""
    from torch_neuronx.estimate import estimate

    try:
        est = estimate(model, kwargs if kwargs else args, task="train" if train else "prefill",
                       platforms="trn2,trn3", mode="full")
    except Exception as e:  # noqa: BLE001 - the estimate is extra information; the check stands without it
        return {"error": f"{type(e).__name__}: {_first_line(e)}"}
    return {name: r.step_time_s for name, r in est.results.items()}


def _locate(model, args, kwargs, dev, training: bool, loss_fn) -> tuple[str, bool]:
    """Runs the model once more on the device (forward, and backward when training
    mismatched) with every aten op replayed on CPU, and names the first op that differs.
    Returns (what was found, whether an op was found)."""
    from torch_neuronx.testing._divergence import find_divergence

    m = copy.deepcopy(model).to(dev).train(training)
    dev_args, dev_kwargs = to_device(args, dev), to_device(kwargs, dev)

    def run():
        torch.manual_seed(SEED)
        with torch.set_grad_enabled(training):
            out = m(*dev_args, **dev_kwargs)
            if training:
                loss, _ = _loss(out, loss_fn)
                loss.backward()

    try:
        first, compared = find_divergence(run)
    except Exception as e:  # noqa: BLE001 - locating is best effort; the mismatch stands
        return f"could not replay the model op by op ({type(e).__name__}: {_first_line(e)})", True
    if first is not None:
        return str(first), True
    return (f"all {compared} aten ops match the CPU on their inputs, so the difference comes from Python code that "
            "behaves differently on the device (a branch on x.device or x.is_neuron, a device-specific dtype)"), False


def _mismatch(name: str, message: str) -> str:
    """'<what> differs from the CPU: <how much>' from a Diff message '<path>: <how much>'."""
    path, _, how = message.partition(": ")
    if name == "gradients":
        subject = f"gradient of {path}"
    elif name == "weights after step":
        subject = f"{path} after the optimizer step"
    elif path in ("result", ""):
        subject = name
    else:
        subject = name + (path if path.startswith("[") else "." + path)
    return f"{subject} differs from the CPU: {how}"


def _train_step(model, opt, args, kwargs, loss_fn) -> dict[str, Any]:
    opt.zero_grad(set_to_none=True)
    out = model(*args, **kwargs)
    named = _named(out)
    loss, loss_name = _loss(out, loss_fn)
    if loss_name is not None:
        named["loss" if "loss" not in named else "loss_fn"] = loss
    loss.backward()
    opt.step()
    # No copies (they would count in the peak memory): results are compared before the next
    # step updates the weights in place, and zero_grad(set_to_none) leaves old gradients intact.
    return {"outputs": map_tensors(named, torch.Tensor.detach),
            "gradients": {n: p.grad for n, p in model.named_parameters() if p.grad is not None},
            "weights after step": {k: v.detach() for k, v in model.state_dict().items()}}


def _pairs(dev_result, cpu_result) -> dict[str, tuple[Any, Any]]:
    """(neuron, cpu) pairs by reported name: each output, then gradients and weights when trained."""
    pairs = {k: (dev_result["outputs"].get(k), v) for k, v in cpu_result["outputs"].items()}
    for k in ("gradients", "weights after step"):
        if k in cpu_result:
            pairs[k] = (dev_result[k], cpu_result[k])
    return pairs


def _named(out: Any) -> dict[str, Any]:
    """The model's outputs by name: mapping keys (ModelOutput fields), tuple positions, or ``output``."""
    if isinstance(out, Mapping):
        return {str(k): v for k, v in out.items()}
    if isinstance(out, tuple) and hasattr(out, "_fields"):
        return {f: getattr(out, f) for f in out._fields}
    if isinstance(out, (list, tuple)):
        return {f"output[{i}]": v for i, v in enumerate(out)}
    return {"output": out}


def _loss(out: Any, loss_fn) -> tuple[torch.Tensor, str | None]:
    """The scalar to backpropagate, and the name to report it under (None: it is already an output)."""
    if loss_fn is not None:
        return loss_fn(out), "loss_fn"
    loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss, None
    floats = [t for t in tensors(out) if t.is_floating_point() and t.requires_grad]
    if not floats:
        raise ValueError("the model's output has no float tensor that requires grad to build a loss "
                         "from; pass loss_fn= or use train=False (--no-train)")
    return sum(t.float().sum() for t in floats), "loss"


def _split_inputs(example_inputs: Any) -> tuple[tuple, dict]:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    if isinstance(example_inputs, Mapping):
        return (), dict(example_inputs)
    raise TypeError("example_inputs must be a tensor, a tuple/list of positional arguments or a dict of "
                    f"keyword arguments, not {type(example_inputs).__name__}")


def _optimizer_factory(optimizer):
    if callable(optimizer):
        return optimizer
    if optimizer == "adamw":
        # eps=1e-6 rather than 1e-8: Adam's first update is about lr * g / (|g| + eps), so for a
        # gradient near 1e-9 a rounding-level difference in g would move the update by a
        # sizeable fraction of lr and show up as a false mismatch of the weights.
        return lambda params: torch.optim.AdamW(params, lr=1e-3, eps=1e-6, weight_decay=0.01)
    if optimizer == "sgd":
        return lambda params: torch.optim.SGD(params, lr=1e-2)
    raise ValueError(f"optimizer must be 'adamw', 'sgd' or a callable params -> Optimizer, not {optimizer!r}")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _classify(e: BaseException, policy: str) -> tuple[str, str]:
    """(kind, what) of an exception raised on the device."""
    line = _first_line(e)
    op = _OP.search(str(e))
    if isinstance(e, NotImplementedError) and op and "fallback" in str(e):
        return "fallback", f"{op.group(0)} is blocked by the fallback policy '{policy}'"
    if isinstance(e, torch.OutOfMemoryError):
        return "oom", f"OutOfMemoryError: {line}"
    if type(e).__name__ in ("BackendCompilerFailed", "InductorError", "NeuronCompileError"):
        return "compile", f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    return "error", f"{type(e).__name__}: {line}" + (f" (op {op.group(0)})" if op and op.group(0) not in line else "")


def _describe_model(model: torch.nn.Module) -> str:
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in params})
    return f"{type(model).__name__} ({_fmt_count(n)} parameters{', ' + '/'.join(dtypes) if dtypes else ''})"


def _describe_inputs(args, kwargs) -> str:
    def one(v):
        if isinstance(v, torch.Tensor):
            return f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}"
        return type(v).__name__
    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
    return ", ".join(parts) or "none"


def _repro(model, args, kwargs, dev, policy, train, steps) -> dict[str, str]:
    import torch_neuronx

    info = {
        "versions": f"torch {torch.__version__}, torch_neuronx {torch_neuronx.__version__}, "
                    f"python {_platform.python_version()}",
        "model": _describe_model(model),
        "inputs": _describe_inputs(args, kwargs),
        "run": f"seed {SEED}, fallback policy '{policy}', {'inference + training' if train else 'inference'}, "
               f"{steps} step(s)",
    }
    p = torch.neuron.get_platform()
    info["device"] = f"{dev} {torch.neuron.get_device_name(dev)}, platform {p['platform']}, LNC={p['lnc']}"
    env = [f"{k}={os.environ[k]}" for k in sorted(os.environ) if k.startswith(("NEURON_", "TORCH_NEURONX_"))]
    if env:
        info["environment"] = " ".join(env)
    return info


class _NoBar:
    def update(self, n=1):
        pass

    def set_description(self, s):
        pass

    def close(self):
        pass


def _progress(total: int, enabled: bool):
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is optional: no bar then
        return _NoBar()
    return tqdm(total=total, file=sys.stderr, leave=False, unit="run", dynamic_ncols=True, disable=not enabled)


def _fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.1f} ms" if s < 10 else f"{s:.1f} s"


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _fmt_count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def _table(rows, header: bool = True) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    out = ["  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if header:
        out.insert(1, "  " + "  ".join("-" * w for w in widths))
    return out


# ---- command line -----------------------------------------------------------------------------


class TargetError(Exception):
    """A TARGET that cannot be turned into (model, inputs); the message names the fix."""


EPILOG = """\
TARGET is one of:
  path/to/config.json or a directory holding one
      a Hugging Face config: the model is built with AutoModelForCausalLM.from_config (falling
      back to AutoModel), weights random (seed 0) unless the directory holds weights; inputs are
      random token ids (batch 2, seq 16 unless --batch/--seq) with labels = input_ids, so the
      model returns a .loss
  a model name, e.g. meta-llama/Llama-3.2-1B
      looked up in the LOCAL Hugging Face cache only (nothing is downloaded); cached weights are
      loaded, otherwise the config is used with random weights (the report says which)
  module:function or path/to/file.py:function
      a function returning (model, example_inputs); example_inputs is a tensor, a tuple of
      positional arguments or a dict of keyword arguments. --batch/--seq are passed to it as
      batch=/seq= if it takes them

What it does: deep-copies the model, runs an inference (eval, no_grad) and a training step
(loss, backward, AdamW step) on neuron and on the CPU, and compares outputs, gradients and
weights after the step. The report lists fallback ops, the largest difference per output,
peak device memory, time per step, and for each problem what to do.

exit status: 0 pass; 1 the model does not pass on neuron (fallback op blocked, mismatch with
the CPU, error, out of memory); 2 bad usage or target (missing file, model not in the local
cache, bad entry point, model fails on the CPU too)

examples:
  python -m torch_neuronx.check ./my-llama/config.json
  python -m torch_neuronx.check meta-llama/Llama-3.2-1B --batch 1 --seq 128 --no-train
  python -m torch_neuronx.check my_project.models:build --fallback-policy error
  python -m torch_neuronx.check ./repro.py:make_model --steps 3 --json report.json
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m torch_neuronx.check",
        description="Check that a model runs on the neuron device and matches the CPU.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", metavar="TARGET", help="HF config.json (or its directory), cached HF model name, "
                   "or module:function / file.py:function returning (model, example_inputs)")
    p.add_argument("--fallback-policy", choices=("silent", "warn", "error"), default="silent",
                   help="policy for ops without a native neuron kernel while the model runs (default: silent); "
                        "'error' fails the check on any fallback op")
    p.add_argument("--no-train", action="store_true", help="inference only, no training step")
    p.add_argument("--steps", type=int, default=3, metavar="N",
                   help="steps per stage; times are the median of the steps after the first (default: 3)")
    p.add_argument("--batch", type=int, metavar="B", help="batch size of the generated inputs (default: 2)")
    p.add_argument("--seq", type=int, metavar="S", help="sequence length of the generated inputs (default: 16)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON to PATH")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--compile", nargs="?", const="neuron", metavar="BACKEND",
                   help="run the neuron copy under torch.compile (default backend: neuron) and report graph "
                        "breaks, recompiles and compile time")
    return p


def _hf_inputs(config, batch: int, seq: int) -> dict[str, torch.Tensor]:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = getattr(text, "vocab_size", None)
    if not vocab:
        raise TargetError(f"the config ({type(config).__name__}) has no vocab_size, so no token ids can be "
                          "generated; use a module:function entry point that makes the inputs")
    g = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


def _hf_model(config, weights_from: str | None):
    """(model, weights loaded?): weights from ``weights_from`` when it has loadable ones, else random init."""
    import transformers
    from transformers import AutoModel, AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    if weights_from is not None:
        for auto in (AutoModelForCausalLM, AutoModel):
            try:
                return auto.from_pretrained(weights_from, local_files_only=True), True
            except (OSError, ValueError):  # no weights there, or not this kind of model
                continue
    torch.manual_seed(SEED)
    try:
        return AutoModelForCausalLM.from_config(config), False
    except ValueError:  # not a causal LM (an encoder, say)
        return AutoModel.from_config(config), False


def _load_hf(target: str, batch: int | None, seq: int | None):
    # Nothing is downloaded: the check only looks at files that are already here.
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        from transformers import AutoConfig
    except ImportError as e:
        raise TargetError("a Hugging Face target needs transformers: pip install transformers") from e
    if os.path.exists(target):
        path = os.path.abspath(target)
        cfg_file = os.path.join(path, "config.json") if os.path.isdir(path) else path
        if not os.path.isfile(cfg_file):
            raise TargetError(f"{target}: no config.json in this directory; pass a Hugging Face config.json or "
                              "its directory")
        try:
            config = AutoConfig.from_pretrained(path)
        except Exception as e:  # noqa: BLE001 - any failure here is a bad config file
            raise TargetError(f"{cfg_file}: not a usable Hugging Face config ({type(e).__name__}: "
                              f"{_first_line(e)}); it needs at least a known model_type") from e
        has_weights = os.path.isdir(path) and any(f.endswith((".safetensors", ".bin")) for f in os.listdir(path))
        weights_from, where = (path if has_weights else None), f"in {os.path.dirname(cfg_file)}"
    else:
        try:
            config = AutoConfig.from_pretrained(target, local_files_only=True)
        except Exception as e:  # noqa: BLE001 - not cached, not a repo name, not a path
            from huggingface_hub import constants

            raise TargetError(
                f"'{target}' is not a file, and not a model in the local Hugging Face cache "
                f"({constants.HF_HUB_CACHE}); download it first (hf download {target}, on a machine with "
                "access), or pass a path to its config.json or a module:function entry point") from e
        weights_from, where = target, "in the local cache"
    try:
        model, loaded = _hf_model(config, weights_from)
    except Exception as e:  # noqa: BLE001
        raise TargetError(f"{target}: transformers cannot build a model from its config "
                          f"({type(e).__name__}: {_first_line(e)})") from e
    note = f"weights loaded from {weights_from}" if loaded else f"random weights (seed {SEED}): no weights {where}"
    inputs = _hf_inputs(config, batch or 2, seq or 16)
    return model, inputs, f"{target}: {_describe_model(model)}", [note]


def _load_entry_point(target: str, batch: int | None, seq: int | None):
    module_name, _, func_name = target.rpartition(":")
    if not module_name or not func_name:
        raise TargetError(f"'{target}': an entry point is module:function or path/to/file.py:function")
    if module_name.endswith(".py") or os.sep in module_name or "/" in module_name:
        if not os.path.isfile(module_name):
            raise TargetError(f"{module_name}: no such file; pass an existing path/to/file.py:function")
        folder = os.path.dirname(os.path.abspath(module_name))
        if folder not in sys.path:
            sys.path.insert(0, folder)  # so the file can import its neighbours
        spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(module_name))[0], module_name)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - the user's file is broken
            raise TargetError(f"{module_name} fails to run: {type(e).__name__}: {_first_line(e)}") from e
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            raise TargetError(f"cannot import module '{module_name}' ({e}); check the name and that it is "
                              "importable from the current directory, or pass path/to/file.py:function") from e
        except Exception as e:  # noqa: BLE001
            raise TargetError(f"module '{module_name}' fails to import: {type(e).__name__}: {_first_line(e)}") from e
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise TargetError(f"'{module_name}' has no function '{func_name}'; the entry point must name a function "
                          "returning (model, example_inputs)")
    extra = {k: v for k, v in (("batch", batch), ("seq", seq)) if v is not None}
    if extra:
        params = inspect.signature(fn).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        missing = [k for k in extra if k not in params and not takes_any]
        if missing:
            raise TargetError(f"{target} takes no {'/'.join(missing)} argument; --batch/--seq apply to Hugging Face "
                              "targets, or to a function that accepts batch=/seq=")
    try:
        result = fn(**extra)
    except Exception as e:  # noqa: BLE001
        raise TargetError(f"{target} raised {type(e).__name__}: {_first_line(e)}") from e
    if not (isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], torch.nn.Module)):
        raise TargetError(f"{target} must return (model, example_inputs) with model an nn.Module, "
                          f"not {type(result).__name__}")
    model, inputs = result
    return model, inputs, f"{target}: {_describe_model(model)}", []


def load_target(target: str, batch: int | None = None, seq: int | None = None):
    """``(model, example_inputs, label, notes)`` for a CLI TARGET; raises TargetError."""
    target = os.path.expanduser(target)
    if ":" in target and not os.path.exists(target):
        return _load_entry_point(target, batch, seq)
    # "org/name" is a model name, but these can only be meant as paths
    looks_like_path = target.endswith((".json", ".py")) or target.startswith((".", os.sep))
    if not os.path.exists(target) and looks_like_path:
        raise TargetError(f"{target}: no such file or directory; pass a Hugging Face config.json (or its "
                          "directory), a cached model name, or module:function")
    if target.endswith(".py"):
        raise TargetError(f"{target}: a Python file needs the function to call: {target}:function")
    return _load_hf(target, batch, seq)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = _parser().parse_args(argv)
    if a.steps < 1 or (a.batch is not None and a.batch < 1) or (a.seq is not None and a.seq < 1):
        print("torch_neuronx.check: error: --steps, --batch and --seq must be >= 1", file=sys.stderr)
        return 2
    try:
        model, inputs, label, notes = load_target(a.target, a.batch, a.seq)
        _split_inputs(inputs)
    except TargetError as e:
        print(f"torch_neuronx.check: error: {e}", file=sys.stderr)
        return 2
    except TypeError as e:
        print(f"torch_neuronx.check: error: {a.target}: {e}", file=sys.stderr)
        return 2
    report = check_model(model, inputs, train=not a.no_train, steps=a.steps, fallback_policy=a.fallback_policy,
                         progress=not a.no_progress, name=label, compile=a.compile or False)
    report.notes[:0] = notes
    report.repro["command"] = "python -m torch_neuronx.check " + shlex.join(argv)
    print(report)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
    if any(p.kind == "cpu_error" for p in report.problems):
        return 2
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
