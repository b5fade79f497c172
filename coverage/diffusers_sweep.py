"""Diffusers model sweep: the library's model classes (UNets, DiT/MMDiT transformers, video
transformers, autoencoders, control nets, ...), each built from a tiny config with random
weights, run on CPU and on ``neuron`` with the same weights and inputs, and compared.

Stages: ``forward`` (every output tensor, eval mode, no grad), ``backward`` (train mode; the
loss is a fixed random projection of every output, so each output element matters; then every
parameter's gradient and the main input's gradient) and ``bf16`` (the forward again with the
weights and floating inputs in bfloat16, compared with bfloat16 tolerances). Parameters that a model
initialises to zero (zero-initialised output projections, adaLN-zero gates, control-net
zero convolutions) are given small random values first, so that every layer reaches the
output and gets a non-trivial gradient. The CPU run comes first: a model that cannot run
on CPU here is ``cpu-unrunnable``, not a device failure. Each model runs in a worker
process (``run_isolated``), so a crash or a hang is recorded for that model only.

    python coverage/diffusers_sweep.py [--fast | --only A,B] [--workers N]

writes ``docs/coverage/diffusers.{md,json}`` (full runs; subsets only with an explicit
``--out-dir``) and exits 1 when any runnable model does not pass. The tiny configs and
inputs are in ``coverage/_diffusers_specs.py``.
"""

from __future__ import annotations

import os

# No downloads, ever: configs are written out, weights are random.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")

import copy
import inspect
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from torch_neuronx.testing import compare, map_tensors, model_tolerance, tensors
from _sweep import (
    sweep_main, write_records,
    cell, count_statuses, diff_problem, error_text, failure_lines, grad_presence, run_stage, run_with_progress,
    settle, short_ops, unrunnable_lines, without_none_grads,
)
from _sweep import record_from_outcome as _record_from_outcome

DEVICE = "neuron"
STAGES = ("setup", "forward", "backward", "bf16")
KEY = "model"  # the name of a record's model (a key of SPECS)
DEFAULT_TIMEOUT = 300.0
REGENERATE = "python coverage/diffusers_sweep.py --workers 2"
ZERO_INIT_STD = 0.02  # the spread given to parameters a model initialises to zero

# The CI subset: the models of the pipelines most used, each a different code path.
FAST_MODELS = (
    "UNet2DConditionModel", "FluxTransformer2DModel", "Flux2Transformer2DModel", "QwenImageTransformer2DModel",
    "AutoencoderKL", "WanTransformer3DModel",
)


def specs() -> dict:
    from _diffusers_specs import SPECS

    return SPECS


def model_names() -> list[str]:
    return list(specs())


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    try:
        import diffusers
        import transformers

        diffusers.utils.logging.set_verbosity_error()
        transformers.logging.set_verbosity_error()
    except ImportError:
        pass


def _worker_setup() -> None:
    # Each worker's initializer: the library's import is slow and must not count against
    # the first model's timeout.
    _quiet()
    import diffusers  # noqa: F401
    import diffusers.models  # noqa: F401


# ---- building -----------------------------------------------------------------------------

def _model_class(spec):
    import diffusers

    if hasattr(diffusers, spec.cls):
        return getattr(diffusers, spec.cls)
    module, _, name = spec.cls.rpartition(".")
    import importlib

    return getattr(importlib.import_module(module), name)


def _fill_zero_params(model: torch.nn.Module, seed: int = 0) -> int:
    """Gives every floating parameter that is all zeros small random values (same on every call
    with the same seed); returns how many there were."""
    g = torch.Generator().manual_seed(seed)
    n = 0
    with torch.no_grad():
        for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if p.is_floating_point() and p.numel() and not bool(p.ne(0).any()):
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype) * ZERO_INIT_STD)
                n += 1
    return n


def _build(name: str):
    """The tiny float32 model on CPU and its spec; weights from ``torch.manual_seed(0)``."""
    spec = specs()[name]
    cls = _model_class(spec)
    torch.manual_seed(0)
    model = cls(**(spec.config() if callable(spec.config) else spec.config))
    model = model.float()
    if spec.prepare is not None:
        spec.prepare(model)
    filled = _fill_zero_params(model)
    return model, spec, filled


def _inputs(spec) -> dict:
    """The model's keyword inputs on CPU: the same values on every call."""
    g = torch.Generator().manual_seed(0)
    return spec.inputs(g)


def _to_device(kwargs: dict) -> dict:
    return map_tensors(kwargs, lambda t: t.to(DEVICE))


def _device_copy(model):
    """The copy of the CPU model that goes to the device (same weights, made before the CPU run)."""
    try:
        return copy.deepcopy(model)
    except RuntimeError:  # parameters computed from others (torch.nn.utils.weight_norm) refuse deepcopy
        clone = type(model).from_config(model.config).float()
        clone.load_state_dict(model.state_dict())
        return clone


# ---- running ------------------------------------------------------------------------------

def _tree(out: Any) -> Any:
    """A model's result as nested tuples/lists/dicts of tensors: output dataclasses become tuples,
    a latent distribution becomes its parameters, other objects are dropped."""
    from diffusers.utils import BaseOutput

    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, BaseOutput):
        return tuple(_tree(v) for v in out.to_tuple())
    if isinstance(out, (list, tuple)):
        return type(out)(_tree(v) for v in out) if not hasattr(out, "_fields") else tuple(_tree(v) for v in out)
    if isinstance(out, dict):
        return {k: _tree(v) for k, v in out.items()}
    params = getattr(out, "parameters", None)
    if isinstance(params, torch.Tensor):  # DiagonalGaussianDistribution and its kin
        return params
    return None


def _call(model, spec, kwargs: dict) -> Any:
    fn = getattr(model, spec.method)
    kwargs = dict(kwargs)
    if "return_dict" in inspect.signature(fn).parameters and "return_dict" not in kwargs:
        kwargs["return_dict"] = False
    return _tree(fn(**kwargs))


def _stage_forward(model, spec, kwargs: dict) -> dict:
    model.eval()
    torch.manual_seed(0)
    with torch.no_grad():
        out = _call(model, spec, kwargs)
    return {"out": out}


def _loss(out: Any) -> torch.Tensor:
    """A fixed random projection of every floating output that carries a gradient: each output
    element moves the loss by its own weight, so a wrong element cannot cancel out. Each term is
    divided by the square root of its output's size, which keeps gradients of order one whatever
    the output's size, so that the float32 tolerance means the same for every model."""
    total = None
    for i, t in enumerate(tensors(out)):
        if not (t.is_floating_point() or t.is_complex()) or not t.requires_grad:
            continue
        w = torch.randn(t.shape, generator=torch.Generator().manual_seed(1000 + i), dtype=torch.float32)
        term = (t.float() * w.to(t.device)).sum() / math.sqrt(t.numel())
        total = term if total is None else total + term
    if total is None:
        raise RuntimeError("no output of the model carries a gradient")
    return total


def _stage_backward(model, spec, kwargs: dict) -> dict:
    model.train()
    model.zero_grad(set_to_none=True)
    kwargs = dict(kwargs)
    grad_inputs = spec.grad_inputs if spec.grad_inputs is not None else _main_input(kwargs)
    for k in grad_inputs:
        kwargs[k] = kwargs[k].detach().clone().requires_grad_(True)
    torch.manual_seed(0)
    out = _call(model, spec, kwargs)
    loss = _loss(out)
    loss.backward()
    grads = {f"param.{n}": (p.grad.detach().clone() if p.grad is not None else None)
             for n, p in model.named_parameters() if p.requires_grad}
    for k in grad_inputs:
        g = kwargs[k].grad
        grads[f"input.{k}"] = g.detach().clone() if g is not None else None
    return {"loss": loss.detach(), "out": map_tensors(out, lambda t: t.detach()), "grads": grads}


def _bf16(kwargs: dict) -> dict:
    """The inputs of a bfloat16 model: floating tensors in bfloat16, the rest unchanged."""
    return map_tensors(kwargs, lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t)


def _main_input(kwargs: dict) -> tuple[str, ...]:
    """The first floating tensor input (the latents or the image), whose gradient is compared too."""
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return (k,)
    return ()


# ---- one model ----------------------------------------------------------------------------

def check_one_model(name: str) -> dict:
    """Run one model on CPU, then on neuron, and compare. Returns the result record (a plain
    dict: model, class, status, stage, reason, stages, fallback_ops, seconds, params, notes)."""
    start = time.perf_counter()
    _quiet()
    record: dict[str, Any] = {KEY: name, "class": "", "status": "pass", "stage": None, "reason": "",
                              "stages": {}, "fallback_ops": {}, "seconds": 0.0, "params": 0, "notes": []}
    try:
        _check(name, record)
    finally:
        record["seconds"] = round(time.perf_counter() - start, 2)
    return record


def _check(name: str, record: dict) -> None:
    stages = record["stages"]

    def cpu_unrunnable(stage: str, e: BaseException) -> None:
        record.update(status="cpu-unrunnable", stage=stage, reason=f"CPU {stage}: {error_text(e)}")

    # ---- CPU reference -------------------------------------------------------------------
    spec = specs()[name]
    record["class"] = spec.cls.rpartition(".")[2]
    try:
        model, spec, filled = _build(name)
        record["params"] = sum(p.numel() for p in model.parameters())
        if spec.notes:
            record["notes"].append(spec.notes)
        if filled:
            record["notes"].append(f"{filled} zero-initialised parameters given random values")
        unset = [n for n, p in model.named_parameters() if p.is_floating_point() and not bool(p.isfinite().all())]
        if unset:  # a parameter left uninitialised (torch.empty): its values are whatever memory held
            record["notes"].append(f"parameters with non-finite values after construction: {', '.join(unset[:4])}")
        device_model = _device_copy(model)  # moved to neuron after the CPU run
        bf16_model = _device_copy(model).to(torch.bfloat16)  # the bf16 stage, on CPU and then on neuron
    except Exception as e:
        return cpu_unrunnable("setup", e)
    try:
        cpu_inputs = _inputs(spec)
    except Exception as e:  # a gap in this sweep, not in the model: never hidden as cpu-unrunnable
        record.update(status="fail", stage="harness", reason=f"making the inputs: {error_text(e)}")
        return
    ref: dict[str, Any] = {}
    try:
        ref["forward"] = _stage_forward(model, spec, cpu_inputs)
    except Exception as e:
        return cpu_unrunnable("forward", e)
    try:
        ref["backward"] = _stage_backward(model, spec, _inputs(spec))
    except Exception as e:  # some ops have no CPU backward (FlexAttention): the forward still counts
        stages["backward"] = f"n/a: CPU backward raised {error_text(e)}"
    try:
        ref["bf16"] = _stage_forward(bf16_model, spec, _bf16(_inputs(spec)))
    except Exception as e:  # some models do not run in bfloat16 on CPU: not the device's doing
        stages["bf16"] = f"n/a: CPU bfloat16 forward raised {error_text(e)}"
    if not all(bool(torch.isfinite(t).all()) for t in tensors(ref["forward"]["out"]) if t.is_floating_point()):
        record["notes"].append("CPU forward output is not all finite")
    unused = [k for k, g in ref.get("backward", {}).get("grads", {}).items() if g is None]
    if unused:
        record["notes"].append(f"no gradient reaches {len(unused)} parameter{'s' if len(unused) > 1 else ''} "
                               "with this config (on CPU either)")
    del model

    # ---- neuron --------------------------------------------------------------------------
    torch.neuron.clear_op_tracking()
    try:
        try:
            device_model.to(DEVICE)
            dev_inputs = _to_device(_inputs(spec))
            stages["setup"] = "pass"
        except Exception as e:
            stages["setup"] = f"fail: {error_text(e)}"
            return
        tol = dict(tolerance=lambda dt: spec.tolerance or model_tolerance(dt))
        run_stage(stages, "forward", lambda: _stage_forward(device_model, spec, dev_inputs),
                  lambda out: diff_problem(compare(out, ref["forward"], **tol)))
        if "backward" in ref:
            run_stage(stages, "backward", lambda: _stage_backward(device_model, spec, _to_device(_inputs(spec))),
                      lambda out: grad_presence(out["grads"], ref["backward"]["grads"])
                      or diff_problem(compare(without_none_grads(out), without_none_grads(ref["backward"]), **tol)))
        if "bf16" in ref:
            run_stage(stages, "bf16",
                      lambda: _stage_forward(bf16_model.to(DEVICE), spec, _bf16(_to_device(_inputs(spec)))),
                      lambda out: diff_problem(compare(out, ref["bf16"], **tol)))
    finally:
        settle(record, STAGES)


# ---- report -------------------------------------------------------------------------------

def record_from_outcome(outcome) -> dict:
    """The result record for one ``run_isolated`` outcome; a crash, a timeout or an exception
    escaping the check is never a pass."""
    r = _record_from_outcome(outcome, KEY)
    if outcome.kind != "ok":
        spec = specs().get(outcome.item)
        r["class"] = spec.cls.rpartition(".")[2] if spec is not None else ""
    return r


def summarize(records: list[dict]) -> dict:
    """Counts per status and the pass rate over the models that run on CPU."""
    return count_statuses(records)


def unswept_classes() -> list[str]:
    """Model classes that ``diffusers`` exports and that no spec builds."""
    import diffusers

    covered = {s.cls.rpartition(".")[2] for s in specs().values()}
    out = []
    for n in dir(diffusers):
        if n.startswith("_") or n in covered:
            continue
        try:
            obj = getattr(diffusers, n)
        except Exception:
            continue
        if inspect.isclass(obj) and issubclass(obj, diffusers.ModelMixin) and obj is not diffusers.ModelMixin:
            out.append(n)
    return sorted(out)


def _versions() -> dict:
    import diffusers
    import transformers

    return {"torch": torch.__version__, "diffusers": diffusers.__version__, "transformers": transformers.__version__}


def render_markdown(records: list[dict], meta: dict) -> str:
    s = summarize(records)
    classes = {r["class"] for r in records}
    out = [
        "# Diffusers model coverage on `neuron`",
        "",
        f"diffusers {meta['diffusers']}, torch {meta['torch']}; generated {meta['date']} "
        f"({meta['workers']} workers, {meta['wall_seconds']:.0f} s wall).",
        "",
        f"Regenerate: `{meta['command']}`",
        "",
        "Each model class, built from a tiny config (`coverage/_diffusers_specs.py`) with "
        "random weights, runs on CPU and on `neuron` with the same weights and inputs: every forward output "
        "(eval mode); a backward pass (train mode, loss = a fixed random projection of every output, each "
        "divided by the square root of the output's size so that gradients are of order one) with every "
        "parameter gradient and the main input's gradient; and the forward again with weights and inputs in "
        "bfloat16. Parameters a model initialises to zero are given small random values first, so that every "
        "layer reaches the output. Tolerances: rtol = atol = 1e-4 in float32, 5e-2 in bfloat16. "
        "`cpu-unrunnable`: the CPU reference itself cannot run here; it is left out of the pass rate. A "
        "stage marked `n/a` raised on CPU, so it has no reference.",
        "",
        f"**Pass rate: {s['pass']} / {s['runnable']} = {100 * s['pass_rate']:.1f}%** "
        f"(pass {s['pass']}, fail {s['fail']}, crash {s['crash']}, timeout {s['timeout']}, "
        f"cpu-unrunnable {s['cpu-unrunnable']}; {s['total']} configurations of {len(classes)} model classes)",
        "",
        "| model | status | failing stage: reason / mismatch | fallback ops | parameters | seconds |",
        "|---|---|---|---|---:|---:|",
    ]
    for r in sorted(records, key=lambda r: r[KEY]):
        detail = f"{r['stage']}: {r['reason']}" if r["status"] in ("fail", "crash", "timeout") else r["reason"]
        out.append(f"| {r[KEY]} | {r['status']} | {cell(detail)} | {cell(short_ops(r['fallback_ops']), 80)} "
                   f"| {r['params']:,} | {r['seconds']:.1f} |")
    out += ["", "## Failures", ""] + failure_lines(records, KEY, "model")
    out += ["", "## CPU-unrunnable", ""] + unrunnable_lines(records, KEY)
    # What a reader needs to weigh a result (the JSON report has every note, the zero-initialised counts too).
    noted = {r[KEY]: [n for n in r.get("notes", []) if "zero-initialised" not in n] for r in records}
    noted = {k: v for k, v in noted.items() if v}
    if noted:
        out += ["", "## Notes", ""]
        for name in sorted(noted):
            out.append(f"- **{name}**: {cell('; '.join(noted[name]), 600)}")
    missing = meta.get("unswept") or []
    out += ["", f"## Model classes not in the sweep ({len(missing)})", ""]
    out.append(", ".join(missing) if missing else "None.")
    return "\n".join(out) + "\n"


def write_report(records: list[dict], out_dir: str | Path, meta: dict) -> tuple[Path, Path]:
    """Writes ``diffusers.md`` and ``diffusers.json`` into ``out_dir``."""
    return write_records(records, out_dir, meta, report="diffusers", render=render_markdown, summarize=summarize,
                         key=KEY)


def run_sweep(names: list[str], workers: int, timeout: float, progress: bool = True) -> list[dict]:
    return run_with_progress(check_one_model, names, workers=workers, timeout=timeout, initializer=_worker_setup,
                             key=KEY, unit="model", summarize=summarize, progress=progress)


def main(argv: list[str] | None = None) -> int:
    return sweep_main(argv, doc=__doc__, module="diffusers_sweep", item="model name",
                      example="FluxTransformer2DModel,AutoencoderKL", all_names=model_names(), fast=FAST_MODELS,
                      fast_name="FAST_MODELS",
                      unknown="no spec for: {} (see coverage/_diffusers_specs.py)",
                      default_timeout=DEFAULT_TIMEOUT, report="diffusers", regenerate=REGENERATE, run=run_sweep,
                      summarize=summarize, write_report=write_report, key=KEY, list_failures=True,
                      meta=lambda names: {**_versions(), "models": len(names), "unswept": unswept_classes()})

if __name__ == "__main__":
    sys.exit(main())
