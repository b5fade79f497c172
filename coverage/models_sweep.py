"""Hugging Face model-family sweep: every entry of Transformers' ``MODEL_MAPPING_NAMES``
(encoders, encoder-decoders, decoders, vision, audio, video and multimodal models), each with
the task head its family is used with, tiny and randomly initialised, run on CPU and on
``neuron`` with the same weights and inputs, and compared stage by stage.

Stages: ``forward`` (every output tensor, eval mode, labels given so the loss is computed
too), ``backward`` (train mode; the head's own loss, or for a head without one a fixed random
projection of every output; then every parameter gradient), ``step`` (one AdamW step, every
parameter), ``generate`` (the heads that generate text: greedy, on the initial weights, token
ids compared exactly), ``bf16`` (the forward stage with the weights in bfloat16). The heads,
configs and inputs are chosen in ``coverage/_models_specs.py``. The CPU run comes
first: an architecture whose CPU reference cannot run here for a reason outside this sweep (a
package that is not installed, a declared library defect) is ``cpu-unrunnable``; any other CPU
error is a failure of this sweep's inputs (stage ``harness``), never hidden. Each architecture
runs in a worker process (``run_isolated``), so a crash or a hang is recorded for that
architecture only.

    python coverage/models_sweep.py [--fast | --only a,b] [--workers N]

writes ``docs/coverage/transformers_models.{md,json}`` (full runs; subsets only with an
explicit ``--out-dir``) and exits 1 when any runnable architecture does not pass.
"""

from __future__ import annotations

import os

# No downloads, ever: configs come from the library's defaults, weights are random.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import collections
import copy
import gc
import inspect
import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from torch_neuronx.testing import compare, compare_with_float64, map_tensors, model_tolerance, tensors
from _sweep import (
    sweep_main, write_records,
    cell, count_statuses, error_text, failure_lines, grad_presence, run_stage, run_with_progress,
    settle, short_ops, unrunnable_lines, without_none_grads,
)
from _sweep import record_from_outcome as _record_from_outcome
from transformers_sweep import (
    ADAMW, _bf16_inputs, _generate_mismatch, _quiet, _stage_step, _versions,
)
from transformers_sweep import _stage_generate as _generate

DEVICE = "neuron"
KEY = "arch"
STAGES = ("setup", "forward", "backward", "step", "generate", "bf16")
DEFAULT_TIMEOUT = 600.0
REGENERATE = "python coverage/models_sweep.py --workers 2"
REPORT = "transformers_models"

# The CI subset: the families most used in practice, one or more per modality.
FAST_ARCHITECTURES = (
    "bert", "roberta", "distilbert", "deberta-v2", "electra", "modernbert", "t5", "bart", "whisper", "wav2vec2",
    "vit", "convnext", "swin", "clip", "siglip", "llava", "qwen2_vl", "gpt2", "llama", "mamba",
)
# Missing packages: the CPU reference cannot run here; not a device or harness matter.
_MISSING_PACKAGE = ("No module named", "requires the", "pip install", "is not installed", "could not import")


def architectures() -> list[str]:
    from _models_specs import architectures as archs

    return archs()


def _worker_setup() -> None:
    _quiet()
    import transformers  # noqa: F401  (slow import: not counted against the first architecture)


# ---- stages -------------------------------------------------------------------------------------

def _tree(out: Any) -> Any:
    """A model's output as nested dicts/tuples of tensors: output dataclasses become dicts of
    their set fields, caches and other objects are dropped."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping):
        items = {k: _tree(v) for k, v in out.items()}
        return {k: v for k, v in items.items() if v is not None}
    if isinstance(out, (list, tuple)):
        items = [_tree(v) for v in out]
        return tuple(v for v in items if v is not None) if any(v is not None for v in items) else None
    return None


def _call(model, batch: dict) -> Any:
    from _models_specs import SPECS

    kwargs = {k: v for k, v in batch.items() if not k.startswith("_")}
    spec = SPECS.get(getattr(model.config, "model_type", None))
    if spec is not None and spec.call is not None:  # a family whose computation is not its forward
        return spec.call(model, kwargs)
    if "use_cache" in inspect.signature(model.forward).parameters:
        kwargs["use_cache"] = False  # a scoring/training forward needs no cache; generate tests it
    return model(**kwargs)


def projection_loss(out: Any) -> torch.Tensor:
    """A fixed random projection of every floating output that carries a gradient: each output
    element moves the loss by its own weight, so a wrong element cannot cancel out; each term
    is divided by the square root of its output's size, so gradients stay of order one."""
    total = None
    for i, t in enumerate(tensors(out)):
        if not t.is_floating_point() or not t.requires_grad:
            continue
        w = torch.randn(t.shape, generator=torch.Generator().manual_seed(1000 + i), dtype=torch.float32)
        t = t if t.dtype == torch.float64 else t.float()  # float64 for the float64 reference
        term = (t * w.to(t.device)).sum() / math.sqrt(max(t.numel(), 1))
        total = term if total is None else total + term
    if total is None:
        raise RuntimeError("no output of the model carries a gradient")
    return total


def _loss(out: Any) -> torch.Tensor:
    loss = getattr(out, "loss", None) if not isinstance(out, (tuple, list)) else None
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss if loss.dim() == 0 else loss.mean()
    return projection_loss(_tree(out))


def _stage_forward(model, batch: dict) -> dict:
    model.eval()
    torch.manual_seed(0)
    with torch.no_grad():
        out = _call(model, batch)
    return {"out": map_tensors(_tree(out), lambda t: t.detach())}


def _stage_backward(model, batch: dict) -> dict:
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    out = _call(model, batch)
    loss = _loss(out)
    loss.backward()
    grads = {n: (p.grad.detach().clone() if p.grad is not None else None)
             for n, p in model.named_parameters() if p.requires_grad}
    return {"loss": loss.detach(), "out": map_tensors(_tree(out), lambda t: t.detach()), "grads": grads}


def _stage_generate(model, batch: dict) -> dict:
    """Greedy generate of its full length: generate merges the model's own generation config
    into the one it is given, so its end-of-sequence tokens (and a forced one) go from there."""
    model.generation_config.eos_token_id = None
    model.generation_config.forced_eos_token_id = None
    return _generate(model, batch)


def _device_copy(model):
    """The copy of the CPU model that goes to the device (same weights, made before the CPU run)."""
    return _copy(model)


def _copy(model):
    """An exact copy of ``model``."""
    try:
        return copy.deepcopy(model)
    except RuntimeError:  # parameters computed from others (weight_norm) refuse deepcopy
        clone = type(model)._from_config(model.config, dtype=torch.float32)
        clone.load_state_dict(model.state_dict())
        return clone


def _to_device(batch: dict) -> dict:
    return map_tensors(batch, lambda t: t.to(DEVICE))


def _adamw(params) -> torch.optim.AdamW:
    """The sweep's optimizer over the parameters of ``params`` that require gradients."""
    return torch.optim.AdamW([p for p in params if p.requires_grad], **ADAMW)


def _float64_stages(model, batch: dict) -> dict:
    """forward and backward of ``model`` (a pristine float32 copy, converted in place) in
    float64 on CPU: the arbiter when CPU and neuron differ by more than the tolerance (a step
    that differs is checked from the device's gradients instead, ``_cpu_step``)."""
    model.double()
    batch = map_tensors(batch, lambda t: t.double() if t.is_floating_point() else t)
    return {"forward": _stage_forward(model, batch), "backward": _stage_backward(model, batch)}


def _cpu_step(initial: dict, grads: dict) -> dict:
    """CPU's AdamW step from the parameters ``initial`` with the gradients ``grads`` (any
    device): what the device's step must give from the device's own gradients."""
    params = {n: torch.nn.Parameter(t.clone(), requires_grad=n in grads) for n, t in initial.items()}
    for n, g in grads.items():
        params[n].grad = None if g is None else g.detach().cpu().clone()
    torch.manual_seed(0)
    _adamw(params.values()).step()
    return {"params": {n: p.detach() for n, p in params.items()}}


# ---- one architecture ---------------------------------------------------------------------------

def check_one_arch(model_type: str, device: bool = True) -> dict:
    """Run one architecture on CPU, then (``device``) on neuron, and compare. Returns the result
    record (a plain dict: arch, task, class, status, stage, reason, stages, fallback_ops, seconds,
    params, notes)."""
    start = time.perf_counter()
    _quiet()
    record: dict[str, Any] = {KEY: model_type, "task": None, "class": None, "status": "pass", "stage": None,
                              "reason": "", "stages": {}, "fallback_ops": {}, "seconds": 0.0, "params": 0,
                              "notes": []}
    try:
        _check(model_type, record, device)
    finally:
        record["seconds"] = round(time.perf_counter() - start, 2)
        if device:  # the worker goes on with other architectures: give the cached blocks back
            gc.collect()
            torch.neuron.empty_cache()
    return record


def _cpu_failure(model_type: str, stage: str, e: BaseException) -> dict:
    """The record fields for a CPU reference that raised: ``cpu-unrunnable`` for a missing
    package or a declared library defect (whose error must be the declared one), else a failure
    of this sweep's inputs or config (stage ``harness``)."""
    from _models_specs import SPECS

    text = error_text(e)
    spec = SPECS.get(model_type)
    if spec is not None and spec.unrunnable and spec.unrunnable_match in text:
        return {"status": "cpu-unrunnable", "stage": stage, "reason": f"{spec.unrunnable} (CPU {stage}: {text})"}
    if isinstance(e, ImportError) or any(m in str(e) for m in _MISSING_PACKAGE):
        return {"status": "cpu-unrunnable", "stage": stage, "reason": f"CPU {stage}: {text}"}
    return {"status": "fail", "stage": "harness", "reason": f"CPU {stage}: {text}"}


def _check(model_type: str, record: dict, device: bool) -> None:
    import _models_specs as specs

    stages = record["stages"]
    try:
        record["task"], record["class"] = specs.task_of(model_type)  # known even when building fails
        model, config, task = specs.build(model_type)
        record.update(task=task, **{"class": type(model).__name__})
        record["params"] = sum(p.numel() for p in model.parameters())
        device_model = _device_copy(model)
        float64_model = _copy(model)
        initial = {n: p.detach().clone() for n, p in model.named_parameters()}
        # two bfloat16 copies: a CPU forward may cache state on its model (codebooks, masks)
        bf16_ref, bf16_model = (_device_copy(model).to(torch.bfloat16) for _ in range(2))
    except Exception as e:
        record.update(_cpu_failure(model_type, "setup", e))
        return
    try:
        train, gen = specs.make_inputs(model_type, model, config, task)
    except Exception as e:  # a gap in this sweep, not in the model: never hidden as cpu-unrunnable
        fail = _cpu_failure(model_type, "inputs", e)
        if fail["status"] == "cpu-unrunnable":
            record.update(fail)
        else:
            record.update(status="fail", stage="harness", reason=f"making the inputs: {error_text(e)}")
        return
    # The device gets the inputs as they are now: some heads write to their inputs (BLIP's
    # generate sets the first token), which must not reach the other stages.
    pristine = map_tensors((train, gen), lambda t: t.clone())
    ref: dict[str, Any] = {}
    try:
        ref["forward"] = _stage_forward(model, train)
    except Exception as e:
        record.update(_cpu_failure(model_type, "forward", e))
        return
    spec = specs.SPECS.get(model_type)
    if spec is not None and spec.unrunnable:
        record.update(status="fail", stage="harness",
                      reason=f"declared cpu-unrunnable ({spec.unrunnable}) but the CPU forward runs")
        return
    if gen is not None:
        try:
            ref["generate"] = _stage_generate(model, map_tensors(gen, lambda t: t.clone()))
        except Exception as e:
            record.update(_cpu_failure(model_type, "generate", e))
            return
    try:
        ref["bf16"] = _stage_forward(bf16_ref, _bf16_inputs(train))
    except Exception as e:  # some models do not run in bfloat16 on CPU: not the device's doing
        stages["bf16"] = f"n/a: CPU bfloat16 forward raised {error_text(e)}"
    del bf16_ref
    try:
        ref["backward"] = _stage_backward(model, train)
    except Exception as e:
        record.update(_cpu_failure(model_type, "backward", e))
        return
    if not all(bool(torch.isfinite(t).all()) for t in tensors(ref["forward"]) if t.is_floating_point()):
        record["notes"].append("CPU forward outputs are not all finite")
    if not torch.isfinite(ref["backward"]["loss"]):
        record["notes"].append("CPU loss is not finite")
    if "generate" in ref:
        steps = ref["generate"]["logits"]
        if steps and len(steps) != specs.NEW_TOKENS:
            record["notes"].append(f"CPU generate produced {len(steps)} new tokens, not {specs.NEW_TOKENS}")
    try:
        optimizer = _adamw(model.parameters())
        ref["step"] = _stage_step(model, optimizer)
    except Exception as e:
        record.update(_cpu_failure(model_type, "step", e))
        return
    del model, optimizer
    if not device:
        return

    torch.neuron.clear_op_tracking()
    arbitrated: list[str] = []  # stages that passed by float64 arbitration
    try:
        try:
            device_model.to(DEVICE)
            dtrain = _to_device(pristine[0])
            dgen = _to_device(pristine[1]) if gen is not None else None
            stages["setup"] = "pass"
        except Exception as e:
            stages["setup"] = f"fail: {error_text(e)}"
            return
        float64: dict[str, Any] = {}

        def judge(out: Any, expected: Any, stage: str, key: str | None = None, part=lambda x: x) -> str | None:
            """None when ``out`` matches CPU's ``expected`` within the model tolerance, or is as
            accurate as CPU's against float64 stage ``key`` (``compare_with_float64``); else
            the problem."""
            d = compare(out, expected, tolerance=model_tolerance)
            if d.ok:
                return None
            if not float64:
                try:
                    float64.update(_float64_stages(float64_model, pristine[0]))
                except Exception as e:
                    float64["error"] = error_text(e)
            if "error" in float64:
                return f"{d.summary()} (no float64 arbiter: {float64['error']})"
            f = compare_with_float64(part(out), part(expected), part(float64[key or stage]))
            if not f.ok:
                return f"{d.summary()}; against float64: {f.summary()}"
            arbitrated.append(f"{stage} as accurate as CPU against float64, beyond the tolerance of CPU ({d.summary()})")
            return None

        run_stage(stages, "forward", lambda: _stage_forward(device_model, dtrain),
                  lambda out: judge(out, ref["forward"], "forward"))
        if "generate" in ref:
            run_stage(stages, "generate", lambda: _stage_generate(device_model, dgen),
                      lambda out: None if compare(out["sequences"], ref["generate"]["sequences"]).ok
                      else _generate_mismatch(out, ref["generate"]))
        if "bf16" in ref:
            run_stage(stages, "bf16", lambda: _stage_forward(bf16_model.to(DEVICE), _bf16_inputs(dtrain)),
                      lambda out: judge(out, ref["bf16"], "bf16", "forward"))
        del bf16_model
        back = run_stage(stages, "backward", lambda: _stage_backward(device_model, dtrain),
                         lambda out: grad_presence(out["grads"], ref["backward"]["grads"])
                         or judge(out, ref["backward"], "backward", part=without_none_grads))
        if back is None:
            stages["step"] = "skipped: backward raised"
        else:
            def step():
                return _stage_step(device_model, _adamw(device_model.parameters()))

            def step_problem(out: dict) -> str | None:
                # AdamW's first step moves each parameter by about lr * sign(gradient): gradient
                # elements near zero, within both sides' rounding of it, may step either way. With
                # gradients that passed, the step itself is what is checked, from the device's gradients.
                d = compare(out, ref["step"], tolerance=model_tolerance)
                if d.ok or not str(stages.get("backward")).startswith("pass"):
                    return None if d.ok else d.summary()
                own = compare(out, _cpu_step(initial, back["grads"]), tolerance=model_tolerance)
                if not own.ok:
                    return f"{d.summary()}; from the device's gradients: {own.summary()}"
                arbitrated.append(f"step equal to CPU's AdamW step from the device's gradients, beyond the "
                                  f"tolerance of CPU's from CPU's gradients ({d.summary()})")
                return None

            run_stage(stages, "step", step, step_problem)
    finally:
        settle(record, STAGES)
        if record["status"] == "pass" and arbitrated:
            record["reason"] = "; ".join([record["reason"], *arbitrated] if record["reason"] else arbitrated)


# ---- report -------------------------------------------------------------------------------------

def record_from_outcome(outcome) -> dict:
    """The result record for one ``run_isolated`` outcome; a crash, a timeout or an exception
    escaping the check is never a pass."""
    r = _record_from_outcome(outcome, KEY)
    r.setdefault("task", None)
    return r


def summarize(records: list[dict]) -> dict:
    """Counts per status and the pass rate over the architectures that run on CPU; passes per task."""
    s = count_statuses(records)
    by_task: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for r in records:
        if r["status"] != "cpu-unrunnable":
            t = by_task[r.get("task") or "unknown"]
            t[0] += r["status"] == "pass"
            t[1] += 1
    return {**s, "by_task": dict(sorted(by_task.items()))}


def render_markdown(records: list[dict], meta: dict) -> str:
    s = summarize(records)
    out = [
        "# Hugging Face model families on `neuron`",
        "",
        f"transformers {meta['transformers']}, torch {meta['torch']}; generated {meta['date']} "
        f"({meta['workers']} workers, {meta['wall_seconds']:.0f} s wall).",
        "",
        f"Regenerate: `{meta['command']}`",
        "",
        "Every entry of `MODEL_MAPPING_NAMES` (encoders, encoder-decoders, decoders, vision, audio, video, "
        "multimodal), with the task head its family is used with (chosen in "
        "`coverage/_models_specs.py`), shrunk to a tiny random config, runs on CPU and on "
        "`neuron` with the same weights and inputs: forward (every output, labels given), loss backward "
        "(the head's loss, or a fixed random projection of every output) and every gradient, one AdamW "
        "step and every parameter, greedy generate for the heads that generate text (token ids exact), "
        "and the forward with bfloat16 weights. `cpu-unrunnable`: the CPU reference itself cannot run "
        "here (a package not installed, a declared library defect); it is left out of the pass rate. "
        "Any other CPU error counts as a failure (stage `harness`). Where a stage differs from CPU by more than "
        "the model tolerance, float64 decides: it passes when the device's result is as accurate as CPU's "
        "against the same computation in float64 on CPU (`torch_neuronx.testing.compare_with_float64`), and "
        "an AdamW step is then checked from the device's own gradients; the report says so in the reason.",
        "",
        f"**Pass rate: {s['pass']} / {s['runnable']} = {100 * s['pass_rate']:.1f}%** "
        f"(pass {s['pass']}, fail {s['fail']}, crash {s['crash']}, timeout {s['timeout']}, "
        f"cpu-unrunnable {s['cpu-unrunnable']}; {s['total']} architectures)",
        "",
        "| task | pass / runnable |",
        "|---|---:|",
    ]
    out += [f"| {t} | {p} / {n} |" for t, (p, n) in s["by_task"].items()]
    out += [
        "",
        "| architecture | task | head | status | failing stage: reason / mismatch | fallback ops | params | seconds |",
        "|---|---|---|---|---|---|---:|---:|",
    ]
    for r in sorted(records, key=lambda r: r[KEY]):
        detail = f"{r['stage']}: {r['reason']}" if r["status"] in ("fail", "crash", "timeout") else r["reason"]
        out.append(f"| {r[KEY]} | {r.get('task') or ''} | {r.get('class') or ''} | {r['status']} | {cell(detail)} "
                   f"| {cell(short_ops(r['fallback_ops']), 80)} | {r['params']} | {r['seconds']:.1f} |")
    harness = sum(r["status"] == "fail" and r["stage"] == "harness" for r in records)
    out += ["", "## Failures", "",
            f"Stage `harness` ({harness} architectures): the CPU reference raised with the inputs or the tiny "
            "config this sweep built, so the family never reached the device; what it lacks is in the error "
            "(an input its forward requires, a config field the generic shrink breaks). They count as failures "
            "until `_models_specs.py` covers them. Any other stage is the device's result differing from CPU's "
            "(or raising).", ""]
    out += failure_lines(records, KEY, "architecture")
    out += ["", "## CPU-unrunnable", ""] + unrunnable_lines(records, KEY)
    na = [r for r in records if str(r["stages"].get("bf16", "")).startswith("n/a")]
    if na:
        out += ["", "## bfloat16 forward not applicable (raised on CPU, so there is no reference)", ""]
        for r in sorted(na, key=lambda r: r[KEY]):
            out.append(f"- **{r[KEY]}**: {cell(r['stages']['bf16'][len('n/a: '):], 600)}")
    ops: collections.Counter = collections.Counter()
    for r in records:
        ops.update(r["fallback_ops"].keys())
    out += ["", "## Ops through the generic fallback", "",
            "Ops that ran through the boxed CPU fallback (`torch.neuron.get_fallback_ops()`), by how many "
            "architectures used them.", ""]
    out += [f"- `{op}`: {n}" for op, n in ops.most_common()] or ["None."]
    return "\n".join(out) + "\n"


def write_report(records: list[dict], out_dir: str | Path, meta: dict) -> tuple[Path, Path]:
    """Writes ``transformers_models.md`` and ``transformers_models.json`` into ``out_dir``."""
    return write_records(records, out_dir, meta, report=REPORT, render=render_markdown, summarize=summarize,
                         key=KEY)


def run_sweep(names: list[str], workers: int, timeout: float, progress: bool = True) -> list[dict]:
    return run_with_progress(check_one_arch, names, workers=workers, timeout=timeout, initializer=_worker_setup,
                             key=KEY, unit="arch", summarize=summarize, progress=progress)


def main(argv: list[str] | None = None) -> int:
    return sweep_main(argv, doc=__doc__, module="models_sweep", item="model type",
                      example="bert,vit", all_names=architectures(), fast=FAST_ARCHITECTURES,
                      fast_name="FAST_ARCHITECTURES", unknown="not in MODEL_MAPPING_NAMES: {}",
                      default_timeout=DEFAULT_TIMEOUT, report=REPORT, regenerate=REGENERATE, run=run_sweep,
                      summarize=summarize, write_report=write_report, key=KEY,
                      meta=lambda names: {**_versions(), "architectures": len(names)})

if __name__ == "__main__":
    sys.exit(main())
