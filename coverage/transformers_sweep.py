"""Hugging Face causal-LM architecture sweep: every ``AutoModelForCausalLM`` architecture,
tiny and randomly initialised, run on CPU and on ``neuron`` with the same weights and
inputs, and compared stage by stage.

Stages: ``forward`` (logits, eval mode), ``backward`` (loss with labels = input ids, then
every parameter gradient, train mode), ``step`` (one AdamW step, every parameter),
``generate`` (greedy, on the initial weights, token ids compared exactly), ``bf16``
(forward logits with the weights in bfloat16, compared with bfloat16 tolerances),
``compiled`` (the backward stage again with the model compiled by
``torch.compile(backend="neuron")``: loss, logits and every gradient compared with eager
``neuron`` and with CPU; Dynamo's graph breaks are counted). The CPU run
comes first: an architecture that cannot run on CPU here is ``cpu-unrunnable``, not a
device failure.
Each architecture runs in a worker process (``run_isolated``), so a crash or a hang is
recorded for that architecture only.

    python coverage/transformers_sweep.py [--fast | --only a,b] [--workers N]

writes ``docs/coverage/transformers.{md,json}`` (full runs; subsets only with an explicit
``--out-dir``) and exits 1 when any runnable architecture does not pass.
"""

from __future__ import annotations

import os

# No downloads, ever: configs come from the library's defaults, weights are random.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import copy
import inspect
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from torch_neuronx.testing import compare, map_tensors, model_tolerance, to_cpu
from _sweep import (
    sweep_main, write_records,
    cell as _cell, count_statuses, diff_problem, error_text as _error_text, failure_lines,
    grad_presence as _compare_grads, run_stage, run_with_progress, settle, short_ops as _short_ops,
    unrunnable_lines, without_none_grads as _without_none,
)
from _sweep import record_from_outcome as _record_from_outcome

DEVICE = "neuron"
BATCH, SEQ, PAD, NEW_TOKENS = 2, 16, 3, 4
STAGES = ("setup", "forward", "backward", "step", "generate", "bf16", "compiled")
# lr and weight decay as a typical fine-tune; eps 1e-6 rather than 1e-8 because Adam's first
# step is ~lr * g / (|g| + eps): for a parameter whose gradient is ~1e-9, a rounding-level
# difference in g would otherwise move the update by a sizeable fraction of lr.
ADAMW = dict(lr=1e-3, eps=1e-6, weight_decay=0.01)
DEFAULT_TIMEOUT = 600.0  # the compiled stage's cold compile of forward and backward dominates
# Inductor's own random numbers differ from eager's by design (dropout); the aten ops draw eager's.
COMPILE_OPTIONS = {"fallback_random": True}
REGENERATE = "python coverage/transformers_sweep.py --workers 2"

# The CI subset: the families most used in practice, dense and MoE, each a different code path.
FAST_ARCHITECTURES = (
    "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text", "phi3", "gpt2",
    "gpt_neox", "falcon", "opt", "olmo2", "granite", "deepseek_v3", "gpt_oss", "mixtral", "cohere", "starcoder2",
)


def architectures() -> list[str]:
    """Every model type of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, in the mapping's order."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _quiet() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")


def _worker_setup() -> None:
    # Each worker's initializer: the library's import is slow and must not count against
    # the first architecture's timeout.
    _quiet()
    from transformers import AutoModelForCausalLM  # noqa: F401


def _build(model_type: str):
    """The tiny float32 model on CPU and its config, weights from ``torch.manual_seed(0)``."""
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from _tiny_configs import OVERRIDES, tiny_config

    override = OVERRIDES.get(model_type)
    config = tiny_config(model_type)
    if override is not None and override.build_from:
        config = getattr(config, override.build_from)
    torch.manual_seed(0)
    try:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except Exception:
        cls = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
        torch.manual_seed(0)
        model = cls._from_config(config, dtype=torch.float32)
    return model.float(), config


def _special_ids(config, found: set[int] | None = None) -> set[int]:
    """Every token id the config names (pad, bos, image tokens, ...), nested configs included."""
    found = set() if found is None else found
    for k, v in config.to_dict().items() if hasattr(config, "to_dict") else config.items():
        if isinstance(v, dict):
            _special_ids(v, found)
        elif isinstance(k, str) and k.endswith(("token_id", "token_ids", "token_index")):
            for x in v if isinstance(v, list) else [v]:
                if isinstance(x, int) and not isinstance(x, bool):
                    found.add(x)
    return found


def _vocab_size(model, config) -> int:
    """Ids valid both as inputs and as labels: the smaller of the input embedding's rows
    (which can include extra rows, e.g. prompt tokens) and the configured vocabulary."""
    sizes = [getattr(config.get_text_config(decoder=True), "vocab_size", None)]
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if isinstance(emb, torch.nn.Embedding):
        sizes.append(emb.num_embeddings)
    return min(s for s in sizes if isinstance(s, int) and s > 0)


def _make_batches(model_type: str, model, config) -> tuple[dict, dict]:
    """``(train_batch, generate_batch)``: random ordinary token ids (no special ids). Training
    pads the second row on the right (labels -100 there), generation on the left, as usual."""
    from _tiny_configs import OVERRIDES

    params = inspect.signature(model.forward).parameters
    vocab = _vocab_size(model, config)
    specials = _special_ids(config)
    ordinary = torch.tensor([i for i in range(vocab) if i not in specials])
    g = torch.Generator().manual_seed(1)
    ids = ordinary[torch.randint(0, len(ordinary), (BATCH, SEQ), generator=g)]
    pad_id = getattr(config.get_text_config(decoder=True), "pad_token_id", None)
    pad_id = pad_id if isinstance(pad_id, int) and 0 <= pad_id < vocab else int(ordinary[0])
    train = {"input_ids": ids.clone()}
    gen = {"input_ids": ids[:, : SEQ // 2].clone()}
    if "attention_mask" in params:
        mask = torch.ones_like(ids)
        mask[1, -PAD:] = 0
        train["input_ids"][1, -PAD:] = pad_id
        train["attention_mask"] = mask
        gmask = torch.ones_like(gen["input_ids"])
        gmask[1, :PAD] = 0
        gen["input_ids"][1, :PAD] = pad_id
        gen["attention_mask"] = gmask
    labels = train["input_ids"].clone()
    if "attention_mask" in train:
        labels[train["attention_mask"] == 0] = -100
    train["labels"] = labels
    override = OVERRIDES.get(model_type)
    if override is not None and override.batch is not None:
        train = override.batch(config, train, g)
        gen = {k: v for k, v in override.batch(config, gen, g).items() if k != "labels"}
        if train["input_ids"].shape[0] != BATCH:  # one row per codebook: the mask is per sample
            gen.pop("attention_mask", None)
    gen["_pad_token_id"] = pad_id
    return train, gen


def _call_kwargs(model, batch: dict) -> dict:
    kwargs = {k: v for k, v in batch.items() if not k.startswith("_")}
    if "use_cache" in inspect.signature(model.forward).parameters:
        kwargs["use_cache"] = False  # a scoring/training forward needs no cache; generate tests it
    return kwargs


def _logits(out) -> torch.Tensor:
    logits = getattr(out, "logits", None)
    return logits if logits is not None else out[0]


def _loss(out, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    loss = getattr(out, "loss", None)
    if loss is not None:
        return loss
    # A model that does not compute its own loss: next-token cross entropy.
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=-100)


def _stage_forward(model, batch: dict) -> dict:
    model.eval()
    torch.manual_seed(0)
    kwargs = _call_kwargs(model, batch)
    kwargs.pop("labels", None)
    with torch.no_grad():
        out = model(**kwargs)
    return {"logits": _logits(out).detach()}


def _stage_backward(model, batch: dict) -> dict:
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    out = model(**_call_kwargs(model, batch))
    logits = _logits(out)
    loss = _loss(out, logits, batch["labels"])
    loss.backward()
    grads = {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in model.named_parameters()}
    return {"loss": loss.detach(), "logits": logits.detach(), "grads": grads}


def _stage_compiled(model, batch: dict) -> dict:
    """The backward stage with ``model`` compiled for neuron (``nn.Module.compile``, so parameter
    names stay), from a clean Dynamo state; adds the graph breaks Dynamo made."""
    torch._dynamo.reset()
    torch.neuron.reset_dynamo_metrics()
    eager_grads = [(p, p.grad) for p in model.parameters()]
    model.compile(backend="neuron", options=COMPILE_OPTIONS)
    try:
        out = _stage_backward(model, batch)
    finally:
        # Back to eager, with eager's gradients, for the optimizer step that follows.
        model._compiled_call_impl = None
        for p, g in eager_grads:
            p.grad = g
    metrics = torch.neuron.get_dynamo_metrics()
    reasons: dict[str, int] = {}
    for reason, n in metrics.graph_break_reasons.items():  # the first line names the cause
        first = reason.strip().splitlines()[0] if reason.strip() else reason
        reasons[first] = reasons.get(first, 0) + n
    out["dynamo"] = {"compiles": metrics.compiles, "graph_breaks": metrics.graph_breaks,
                     "graph_break_reasons": reasons}
    return out


def _stage_step(model, optimizer) -> dict:
    torch.manual_seed(0)
    optimizer.step()
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def _stage_generate(model, batch: dict) -> dict:
    model.eval()
    gc = copy.deepcopy(model.generation_config)
    gc.eos_token_id = None  # so generation always runs its full length
    if gc.pad_token_id is None:
        gc.pad_token_id = batch["_pad_token_id"]
    gc.do_sample = False
    gc.num_beams = 1
    gc.num_return_sequences = 1
    gc.max_new_tokens = NEW_TOKENS
    gc.min_new_tokens = None
    gc.max_length = None
    torch.manual_seed(0)
    kwargs = {k: v for k, v in batch.items() if not k.startswith("_")}
    with torch.no_grad():
        out = model.generate(**kwargs, generation_config=gc, return_dict_in_generate=True, output_logits=True)
    sequences = out.sequences if hasattr(out, "sequences") else out
    logits = [x.detach() for x in (getattr(out, "logits", None) or [])]
    return {"sequences": sequences.detach(), "logits": logits}


def _generate_mismatch(dev: dict, ref: dict) -> str:
    """Which token differs first, and how close the CPU's top two logits were there."""
    a, e = dev["sequences"].cpu(), ref["sequences"]
    if a.shape != e.shape:
        return f"sequences shape {tuple(a.shape)} != {tuple(e.shape)}"
    diff = (a != e).nonzero()
    row, col = (int(diff[0, 0]), int(diff[0, 1])) if len(diff) else (0, 0)
    step = col - (e.shape[1] - len(ref["logits"]))
    gap = ""
    if 0 <= step < len(ref["logits"]):
        top = ref["logits"][step][row].float().topk(2).values
        gap = f"; CPU top-2 logit gap there {float(top[0] - top[1]):.3g}"
    return f"generated token ids differ at row {row}, position {col}: neuron {int(a[row, col])} vs CPU " \
           f"{int(e[row, col])}{gap}"


def check_one_arch(model_type: str) -> dict:
    """Run one architecture on CPU, then on neuron, and compare. Returns the result record
    (a plain dict: arch, status, stage, reason, stages, fallback_ops, seconds, params, notes)."""
    start = time.perf_counter()
    _quiet()
    record: dict[str, Any] = {"arch": model_type, "status": "pass", "stage": None, "reason": "",
                              "stages": {}, "fallback_ops": {}, "seconds": 0.0, "params": 0, "notes": []}
    try:
        _check(model_type, record)
    finally:
        record["seconds"] = round(time.perf_counter() - start, 2)
    return record


def _device_copy(model):
    """The copy of the CPU model that goes to the device (same weights, made before the CPU
    run changes them)."""
    return copy.deepcopy(model)


def _check(model_type: str, record: dict) -> None:
    stages = record["stages"]

    def cpu_unrunnable(stage: str, e: BaseException) -> None:
        record.update(status="cpu-unrunnable", stage=stage, reason=f"CPU {stage}: {_error_text(e)}")

    # ---- CPU reference -------------------------------------------------------------------
    try:
        model, config = _build(model_type)
        record["params"] = sum(p.numel() for p in model.parameters())
        record["class"] = type(model).__name__
        device_model = _device_copy(model)  # moved to neuron after the CPU run
        bf16_model = _device_copy(model).to(torch.bfloat16)  # the bf16 stage, on both devices
    except Exception as e:
        return cpu_unrunnable("setup", e)
    try:
        train, gen = _make_batches(model_type, model, config)
    except Exception as e:  # a gap in this sweep, not in the model: never hidden as cpu-unrunnable
        record.update(status="fail", stage="harness", reason=f"making the inputs: {_error_text(e)}")
        return
    ref: dict[str, Any] = {}
    try:
        ref["forward"] = _stage_forward(model, train)
    except Exception as e:
        return cpu_unrunnable("forward", e)
    # Generate runs before the training stages (on the initial weights, on both sides), so
    # that a failed step on the device does not show up again as a generate mismatch.
    try:
        ref["generate"] = _stage_generate(model, gen)
    except Exception as e:
        stages["generate"] = f"n/a: CPU generate raised {_error_text(e)}"
    try:
        ref["bf16"] = _stage_forward(bf16_model, _bf16_inputs(train))
    except Exception as e:  # some models do not run in bfloat16 on CPU: not the device's doing
        stages["bf16"] = f"n/a: CPU bfloat16 forward raised {_error_text(e)}"
    try:
        ref["backward"] = _stage_backward(model, train)
    except Exception as e:
        return cpu_unrunnable("backward", e)
    # Matching NaNs compare equal; say so when the CPU reference has any.
    if not bool(torch.isfinite(ref["forward"]["logits"]).all()):
        record["notes"].append("CPU forward logits are not all finite")
    if not torch.isfinite(ref["backward"]["loss"]):
        record["notes"].append("CPU loss is not finite")
    if "generate" in ref:
        steps = ref["generate"]["logits"]
        new = len(steps) if steps else ref["generate"]["sequences"].shape[-1] - gen["input_ids"].shape[-1]
        if new != NEW_TOKENS:
            record["notes"].append(f"CPU generate produced {new} new tokens, not {NEW_TOKENS}")
    try:
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], **ADAMW)
        ref["step"] = _stage_step(model, optimizer)
    except Exception as e:
        return cpu_unrunnable("step", e)
    del model, optimizer

    # ---- neuron --------------------------------------------------------------------------
    torch.neuron.clear_op_tracking()
    try:
        try:
            device_model.to(DEVICE)
            dtrain = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in train.items()}
            dgen = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in gen.items()}
            stages["setup"] = "pass"
        except Exception as e:
            stages["setup"] = f"fail: {_error_text(e)}"
            return
        tol = dict(tolerance=model_tolerance)

        def run(stage: str, fn, check) -> dict | None:
            return run_stage(stages, stage, fn, check)

        diff_or_none = diff_problem

        run("forward", lambda: _stage_forward(device_model, dtrain),
            lambda out: diff_or_none(compare(out, ref["forward"], **tol)))
        if "bf16" in ref:
            run("bf16", lambda: _stage_forward(bf16_model.to(DEVICE), _bf16_inputs(dtrain)),
                lambda out: diff_or_none(compare(out, ref["bf16"], **tol)))
        del bf16_model
        if "generate" in ref:
            run("generate", lambda: _stage_generate(device_model, dgen),
                lambda out: None if compare(out["sequences"], ref["generate"]["sequences"]).ok
                else _generate_mismatch(out, ref["generate"]))
        back = run("backward", lambda: _stage_backward(device_model, dtrain),
                   lambda out: _compare_grads(out["grads"], ref["backward"]["grads"])
                   or diff_or_none(compare(_without_none(out), _without_none(ref["backward"]), **tol)))
        if back is not None:
            # Before the step, so that both sides hold the same weights.
            def check_compiled(out):
                record["dynamo"] = out.pop("dynamo")
                for oracle, against in (("eager neuron", to_cpu(back)), ("CPU", ref["backward"])):
                    problem = _compare_grads(out["grads"], against["grads"], oracle) or diff_or_none(
                        compare(_without_none(out), _without_none(against), **tol))
                    if problem:
                        return f"vs {oracle}: {problem}"
                return None

            run("compiled", lambda: _stage_compiled(device_model, dtrain), check_compiled)
        if back is None:
            stages["step"] = "skipped: backward raised"
            stages["compiled"] = "skipped: backward raised"
        else:
            def step():
                opt = torch.optim.AdamW([p for p in device_model.parameters() if p.requires_grad], **ADAMW)
                return _stage_step(device_model, opt)

            run("step", step, lambda out: diff_or_none(compare(out, ref["step"], **tol)))
    finally:
        settle(record, STAGES)


def _bf16_inputs(batch: dict) -> dict:
    """The batch for a bfloat16 model: floating inputs (embeddings, pixel values, nested
    states) in bfloat16, ids and masks unchanged."""
    return map_tensors(batch, lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t)


# ---- report -----------------------------------------------------------------------------

def record_from_outcome(outcome) -> dict:
    """The result record for one ``run_isolated`` outcome; a crash, a timeout or an exception
    escaping the check is never a pass."""
    return _record_from_outcome(outcome, "arch")


def summarize(records: list[dict]) -> dict:
    """Counts per status and the pass rate over the architectures that run on CPU."""
    counts = count_statuses(records)
    runnable = counts["runnable"]
    # The compiled stage on its own (issue targets are per stage): failing an eager stage first
    # does not hide whether the architecture compiles.
    compiled = sum(1 for r in records if r.get("stages", {}).get("compiled") == "pass")
    eager = sum(1 for r in records if r["status"] == "pass" or (r["status"] == "fail" and r["stage"] == "compiled"))
    breaks = [r for r in records if (r.get("dynamo") or {}).get("graph_breaks")]
    return {**counts,
            "eager_pass": eager, "eager_pass_rate": (eager / runnable) if runnable else 0.0,
            "compiled_pass": compiled, "compiled_pass_rate": (compiled / runnable) if runnable else 0.0,
            "with_graph_breaks": len(breaks), "graph_breaks": sum(r["dynamo"]["graph_breaks"] for r in breaks)}


def _versions() -> dict:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


def render_markdown(records: list[dict], meta: dict) -> str:
    s = summarize(records)
    out = [
        "# Hugging Face causal-LM coverage on `neuron`",
        "",
        f"transformers {meta['transformers']}, torch {meta['torch']}; generated {meta['date']} "
        f"({meta['workers']} workers, {meta['wall_seconds']:.0f} s wall).",
        "",
        f"Regenerate: `{meta['command']}`",
        "",
        "Every architecture of `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, shrunk to a tiny random config "
        "(`coverage/_tiny_configs.py`), runs on CPU and on `neuron` with the same weights "
        "and inputs: forward logits, loss backward and every gradient, one AdamW step and every "
        "parameter, greedy generate (token ids exact), forward logits with bfloat16 weights, and the "
        "loss backward again with the model compiled by `torch.compile(backend=\"neuron\")` (compared with "
        "eager `neuron` and with CPU; Dynamo's graph breaks counted). "
        "`cpu-unrunnable`: the CPU reference itself "
        "cannot run here; it is left out of the pass rate.",
        "",
        f"**Pass rate: {s['pass']} / {s['runnable']} = {100 * s['pass_rate']:.1f}%** "
        f"(pass {s['pass']}, fail {s['fail']}, crash {s['crash']}, timeout {s['timeout']}, "
        f"cpu-unrunnable {s['cpu-unrunnable']}; {s['total']} architectures)",
        "",
        f"**Eager stages (all but `compiled`): {s['eager_pass']} / {s['runnable']} = "
        f"{100 * s['eager_pass_rate']:.1f}%**",
        "",
        f"**Compiled stage: {s['compiled_pass']} / {s['runnable']} = {100 * s['compiled_pass_rate']:.1f}%**; "
        f"{s['with_graph_breaks']} architectures have graph breaks ({s['graph_breaks']} in all; reasons in the "
        "JSON report).",
        "",
        "| architecture | status | failing stage: reason / mismatch | fallback ops | graph breaks | seconds |",
        "|---|---|---|---|---:|---:|",
    ]
    for r in sorted(records, key=lambda r: r["arch"]):
        detail = f"{r['stage']}: {r['reason']}" if r["status"] in ("fail", "crash", "timeout") else r["reason"]
        breaks = (r.get("dynamo") or {}).get("graph_breaks", "—")
        out.append(f"| {r['arch']} | {r['status']} | {_cell(detail)} | {_cell(_short_ops(r['fallback_ops']), 80)} "
                   f"| {breaks} | {r['seconds']:.1f} |")
    # Failures grouped by cause: the same status, stage and error text.
    out += ["", "## Failures", ""] + failure_lines(records, "arch", "architecture")
    not_compiled = [r for r in records if r["status"] != "cpu-unrunnable" and r["stages"].get("compiled") != "pass"]
    out += ["", "## Compiled stage not passing", ""]
    if not not_compiled:
        out.append("None.")
    for r in sorted(not_compiled, key=lambda r: r["arch"]):
        why = r["stages"].get("compiled") or (f"{r['status']}: {r['reason']}" if r["status"] != "pass" else "not run")
        out.append(f"- **{r['arch']}**: {_cell(why, 600)}")
    out += ["", "## CPU-unrunnable", ""] + unrunnable_lines(records, "arch")
    for stage, title in (("generate", "Generate"), ("bf16", "bfloat16 forward")):
        na = [r for r in records if str(r["stages"].get(stage, "")).startswith("n/a")]
        if na:
            out += ["", f"## {title} not applicable (raised on CPU, so there is no reference)", ""]
            for r in sorted(na, key=lambda r: r["arch"]):
                out.append(f"- **{r['arch']}**: {_cell(r['stages'][stage][len('n/a: '):], 600)}")
    return "\n".join(out) + "\n"


def write_report(records: list[dict], out_dir: str | Path, meta: dict) -> tuple[Path, Path]:
    """Writes ``transformers.md`` and ``transformers.json`` into ``out_dir``."""
    return write_records(records, out_dir, meta, report="transformers", render=render_markdown,
                         summarize=summarize, key="arch")


def run_sweep(names: list[str], workers: int, timeout: float, progress: bool = True) -> list[dict]:
    return run_with_progress(check_one_arch, names, workers=workers, timeout=timeout, initializer=_worker_setup,
                             key="arch", unit="arch", summarize=summarize, progress=progress)


def main(argv: list[str] | None = None) -> int:
    return sweep_main(argv, doc=__doc__, module="transformers_sweep", item="model type",
                      example="llama,gpt2", all_names=architectures(), fast=FAST_ARCHITECTURES,
                      fast_name="FAST_ARCHITECTURES", unknown="not causal-LM model types: {}",
                      default_timeout=DEFAULT_TIMEOUT, report="transformers", regenerate=REGENERATE,
                      run=run_sweep, summarize=summarize, write_report=write_report, key="arch",
                      meta=lambda names: {**_versions(), "architectures": len(names)})

if __name__ == "__main__":
    sys.exit(main())
