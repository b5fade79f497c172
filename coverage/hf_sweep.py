"""Hugging Face sweep: models of the Hugging Face libraries, tiny and randomly initialised, run
on CPU and on ``neuron`` with the same weights and inputs, and compared stage by stage. One
population per run (``--population``):

- ``transformers``: every architecture of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` (configs:
  ``coverage/_tiny_configs.py``); report ``docs/coverage/transformers.{md,json}``;
- ``models``: every entry of Transformers' ``MODEL_MAPPING_NAMES`` (encoders, encoder-decoders,
  decoders, vision, audio, video, multimodal) with the task head its family is used with
  (``coverage/_models_specs.py``); report ``docs/coverage/transformers_models.{md,json}``;
- ``diffusers``: Diffusers' model classes (UNets, DiT/MMDiT and video transformers, autoencoders,
  control nets, ...) from tiny configs (``coverage/_diffusers_specs.py``); report
  ``docs/coverage/diffusers.{md,json}``.

Stages, as each population runs them: ``forward`` (every output, eval mode), ``generate``
(the heads that generate text: greedy on the initial weights, token ids compared exactly),
``bf16`` (the forward with the weights and floating inputs in bfloat16), ``backward`` (train
mode; the model's loss or a fixed random projection of every output, then every gradient),
``compiled`` (``transformers``: the backward again with the model compiled by
``torch.compile(backend="neuron")``, compared with eager ``neuron`` and with CPU; Dynamo's graph
breaks are counted) and ``step`` (one AdamW step, every parameter). The CPU run comes first: an
item whose CPU reference cannot run here is ``cpu-unrunnable``, not a device failure (``models``:
only for a package that is not installed or a declared library defect; any other CPU error is a
failure of the sweep's inputs, stage ``harness``). A CPU stage a population marks optional is
``n/a`` when it raises on CPU. ``models`` lets float64 decide a stage that differs from CPU by
more than the tolerance. Each item runs in a worker process (``run_isolated``), so a crash or a
hang is recorded for that item only.

    python coverage/hf_sweep.py --population transformers [--fast | --only a,b] [--workers N]

writes the population's report (full runs; subsets only with an explicit ``--out-dir``) and
exits 1 when any runnable item does not pass.
"""

from __future__ import annotations

import os

# No downloads, ever: configs come from the libraries' defaults or are written out, weights are random.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")

import argparse
import collections
import copy
import functools
import gc
import inspect
import math
import sys
import time
import warnings
from collections.abc import Mapping
from typing import Any, Callable

import torch

from torch_neuronx.testing import compare, compare_with_float64, map_tensors, model_tolerance, tensors, to_cpu

from _sweep import (
    NOT_PASSING, Sweep, cell, count_statuses, diff_problem, error_text, failure_lines, grad_presence,
    record_from_outcome, run_stage, settle, short_ops, unrunnable_lines, without_none_grads,
)
from _sweep import main as sweep_main
from _tiny_configs import NEW_TOKENS

DEVICE = "neuron"
# lr and weight decay as a typical fine-tune; eps 1e-6 rather than 1e-8 because Adam's first
# step is ~lr * g / (|g| + eps): for a parameter whose gradient is ~1e-9, a rounding-level
# difference in g would otherwise move the update by a sizeable fraction of lr.
ADAMW = dict(lr=1e-3, eps=1e-6, weight_decay=0.01)
# Inductor's own random numbers differ from eager's by design (dropout); the aten ops draw eager's.
COMPILE_OPTIONS = {"fallback_random": True}
# A CPU reference that fails for one of these needs a package that is not installed.
MISSING_PACKAGE = ("No module named", "requires the", "pip install", "is not installed", "could not import")
# How an optional stage's CPU reference is named when it raised.
_REFERENCE = {"generate": "generate", "bf16": "bfloat16 forward", "backward": "backward"}


# ---- shared by every population ------------------------------------------------------------------

def quiet(libraries: tuple[str, ...]) -> None:
    """No warnings and no library logging below errors."""
    import importlib

    warnings.filterwarnings("ignore")
    for name in libraries:
        try:
            lib = importlib.import_module(name)
        except ImportError:
            continue
        (lib.utils.logging if name == "diffusers" else lib.logging).set_verbosity_error()


def tree(out: Any) -> Any:
    """A model's output as nested dicts/tuples of tensors: output dataclasses become dicts of
    their set fields, a latent distribution its parameters; caches and other objects are dropped."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping):
        items = {k: tree(v) for k, v in out.items()}
        return {k: v for k, v in items.items() if v is not None}
    if isinstance(out, (list, tuple)):
        items = [tree(v) for v in out]
        return tuple(v for v in items if v is not None) if any(v is not None for v in items) else None
    params = getattr(out, "parameters", None)
    if isinstance(params, torch.Tensor):  # Diffusers' DiagonalGaussianDistribution and its kin
        return params
    return None


def projection_loss(out: Any) -> torch.Tensor:
    """A fixed random projection of every floating output that carries a gradient: each output
    element moves the loss by its own weight, so a wrong element cannot cancel out; each term
    is divided by the square root of its output's size, so gradients stay of order one whatever
    the output's size (and the float32 tolerance means the same for every model)."""
    total = None
    for i, t in enumerate(tensors(out)):
        if not (t.is_floating_point() or t.is_complex()) or not t.requires_grad:
            continue
        w = torch.randn(t.shape, generator=torch.Generator().manual_seed(1000 + i), dtype=torch.float32)
        t = t.real if t.is_complex() else t
        t = t if t.dtype == torch.float64 else t.float()  # float64 for the float64 reference
        term = (t * w.to(t.device)).sum() / math.sqrt(max(t.numel(), 1))
        total = term if total is None else total + term
    if total is None:
        raise RuntimeError("no output of the model carries a gradient")
    return total


def loss_of(out: Any) -> torch.Tensor:
    """The model's own loss when it computed one, else ``projection_loss`` of every output."""
    loss = getattr(out, "loss", None) if not isinstance(out, (tuple, list)) else None
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss if loss.dim() == 0 else loss.mean()
    return projection_loss(tree(out))


def bf16_inputs(batch: dict) -> dict:
    """The batch for a bfloat16 model: floating inputs (embeddings, pixel values, nested
    states) in bfloat16, ids and masks unchanged."""
    return map_tensors(batch, lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t)


def to_device(batch: Any) -> Any:
    return map_tensors(batch, lambda t: t.to(DEVICE))


def copy_model(model):
    """An exact copy of ``model``."""
    try:
        return copy.deepcopy(model)
    except RuntimeError:  # parameters computed from others (weight_norm) refuse deepcopy
        cls = type(model)
        clone = (cls._from_config(model.config, dtype=torch.float32) if hasattr(cls, "_from_config")
                 else cls.from_config(model.config).float())
        clone.load_state_dict(model.state_dict())
        return clone


def adamw(params) -> torch.optim.AdamW:
    """The sweep's optimizer over the parameters of ``params`` that require gradients."""
    return torch.optim.AdamW([p for p in params if p.requires_grad], **ADAMW)


def stage_step(model, optimizer) -> dict:
    torch.manual_seed(0)
    optimizer.step()
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def cpu_step(initial: dict, grads: dict) -> dict:
    """CPU's AdamW step from the parameters ``initial`` with the gradients ``grads`` (any
    device): what the device's step must give from the device's own gradients."""
    params = {n: torch.nn.Parameter(t.clone(), requires_grad=n in grads) for n, t in initial.items()}
    for n, g in grads.items():
        params[n].grad = None if g is None else g.detach().cpu().clone()
    torch.manual_seed(0)
    adamw(params.values()).step()
    return {"params": {n: p.detach() for n, p in params.items()}}


def stage_generate(model, batch: dict) -> dict:
    """Greedy generate of its full length. Generate merges the model's own generation config
    into the one it is given, so its end-of-sequence tokens (and a forced one) go from there too."""
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.forced_eos_token_id = None
    gc_ = copy.deepcopy(model.generation_config)
    if gc_.pad_token_id is None:
        gc_.pad_token_id = batch.get("_pad_token_id")
    gc_.do_sample = False
    gc_.num_beams = 1
    gc_.num_return_sequences = 1
    gc_.max_new_tokens = NEW_TOKENS
    gc_.min_new_tokens = None
    gc_.max_length = None
    torch.manual_seed(0)
    kwargs = {k: v for k, v in batch.items() if not k.startswith("_")}
    with torch.no_grad():
        out = model.generate(**kwargs, generation_config=gc_, return_dict_in_generate=True, output_logits=True)
    sequences = out.sequences if hasattr(out, "sequences") else out
    logits = [x.detach() for x in (getattr(out, "logits", None) or [])]
    return {"sequences": sequences.detach(), "logits": logits}


def generate_mismatch(dev: dict, ref: dict) -> str:
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


def _generate_problem(out: dict, ref: dict) -> str | None:
    return None if compare(out["sequences"], ref["sequences"]).ok else generate_mismatch(out, ref)


# ---- a population --------------------------------------------------------------------------------

class Population(Sweep):
    """One population of the Hugging Face sweep: which models, how each is built, fed and run;
    ``check_one`` runs the stages every population shares (CPU reference first, then the device)."""

    name = ""                      # --population
    script = "hf_sweep"
    key = "arch"                   # a record's name field
    noun = "architecture"
    unit = "arch"
    stages: tuple[str, ...] = ()
    optional: frozenset = frozenset({"bf16"})  # stages whose CPU reference may raise (then n/a)
    strict_cpu = False             # a CPU error is cpu-unrunnable only for a missing package or declared defect
    arbitrate = False              # float64 decides a stage beyond the tolerance
    fast: tuple[str, ...] = ()     # the CI subset (--fast)
    example = ""
    libraries: tuple[str, ...] = ("transformers",)

    def __reduce__(self):
        # a worker gets the population registered under the name (as its module defines it)
        return population, (self.name,)

    # -- what differs between populations --
    def names(self) -> list[str]:
        raise NotImplementedError

    def unknown(self, names: list[str]) -> str:
        return f"not in the {self.name} population: {', '.join(names)}"

    def defaults(self, name: str) -> dict:
        """A record's fields known from the name alone (also for a crash)."""
        return {}

    def build(self, name: str, record: dict) -> tuple[torch.nn.Module, Any]:
        """The tiny float32 model on CPU and what else its inputs and stages need."""
        raise NotImplementedError

    def inputs(self, name: str, model, ctx) -> tuple[dict, dict | None]:
        """``(train, generate)`` batches on CPU; ``generate`` None when the model does not generate text."""
        raise NotImplementedError

    def forward(self, model, batch: dict, ctx) -> dict:
        raise NotImplementedError

    def backward(self, model, batch: dict, ctx) -> dict:
        raise NotImplementedError

    def compiled(self, model, batch: dict, ctx) -> dict:
        raise NotImplementedError

    def tolerance(self, ctx) -> Callable:
        return model_tolerance

    def declared_defect(self, name: str) -> tuple[str, str] | None:
        """``(defect, text its CPU error contains)`` for an item declared cpu-unrunnable."""
        return None

    def notes(self, record: dict, ref: dict) -> None:
        """Adds what a reader needs to weigh the CPU reference."""

    def device_copy(self, model):
        """The copy of the CPU model that goes to the device (same weights, made before the CPU run)."""
        return copy_model(model)

    def versions(self) -> dict:
        import transformers

        return {"torch": torch.__version__, "transformers": transformers.__version__}

    def markdown(self, records: list[dict], s: dict, meta: dict) -> str:
        raise NotImplementedError

    # -- the command line (``Sweep``) --
    def select(self, p, args) -> list[str]:
        everything = self.names()
        if args.only:
            names = list(dict.fromkeys(n.strip() for n in args.only.split(",") if n.strip()))
            missing = [n for n in names if n not in everything]
            if missing:
                p.error(self.unknown(missing))
            return names
        return list(self.fast) if args.fast else everything

    def is_subset(self, args) -> bool:
        return bool(args.only or args.fast)

    def options(self, args) -> list[str]:
        return ["--population", self.name, *(["--only", args.only] if args.only else ["--fast"] if args.fast else [])]

    def check(self):
        return functools.partial(check_item, self.name)

    def initializer(self) -> None:
        # the libraries' imports are slow and must not count against the first item's timeout
        quiet(self.libraries)

    def record(self, outcome) -> dict:
        r = record_from_outcome(outcome, self.key)
        for k, v in self.defaults(outcome.item).items():
            r.setdefault(k, v)
        return r

    def label(self, record: dict) -> str:
        return record[self.key]

    def summarize(self, records: list[dict]) -> dict:
        return count_statuses(records)

    def progress(self, s: dict) -> str:
        return (f"pass {s['pass']} fail {s['fail']} crash {s['crash']} timeout {s['timeout']} "
                f"cpu-unrunnable {s['cpu-unrunnable']}")

    def failed(self, s: dict) -> bool:
        return bool(s["fail"] or s["crash"] or s["timeout"])

    def printed(self, records: list[dict], s: dict, seconds: float, workers: int) -> list[str]:
        out = [f"{self.name}: {s['pass']}/{s['runnable']} pass ({100 * s['pass_rate']:.1f}%), fail {s['fail']}, "
               f"crash {s['crash']}, timeout {s['timeout']}, cpu-unrunnable {s['cpu-unrunnable']} of {s['total']} "
               f"in {seconds:.0f} s with {workers} workers"]
        for r in sorted(records, key=lambda r: r[self.key]):
            if r["status"] in NOT_PASSING:
                out.append(f"  {r[self.key]}: {r['status']} at {r['stage']}: {r['reason'][:300]}")
        return out

    def meta(self, items: list, args) -> dict:
        return {**self.versions(), "architectures": len(items)}

    def render(self, records: list[dict], summary: dict, meta: dict) -> tuple[dict, str]:
        payload = {"meta": meta, "summary": summary, "results": sorted(records, key=lambda r: r[self.key])}
        return payload, self.markdown(records, summary, meta)

    # -- one item --
    def cpu_failure(self, name: str, stage: str, e: BaseException) -> dict:
        """The record fields for a CPU reference that raised: ``cpu-unrunnable`` when the reason
        lies outside the sweep, else a failure of the sweep's inputs (stage ``harness``)."""
        text = error_text(e)
        declared = self.declared_defect(name)
        if declared is not None and declared[1] in text:
            return {"status": "cpu-unrunnable", "stage": stage, "reason": f"{declared[0]} (CPU {stage}: {text})"}
        if isinstance(e, ImportError) or any(m in str(e) for m in MISSING_PACKAGE) or (
                stage != "inputs" and not self.strict_cpu):
            return {"status": "cpu-unrunnable", "stage": stage, "reason": f"CPU {stage}: {text}"}
        # a gap in this sweep, not in the model: never hidden as cpu-unrunnable
        return {"status": "fail", "stage": "harness",
                "reason": f"making the inputs: {text}" if stage == "inputs" else f"CPU {stage}: {text}"}

    def check_one(self, name: str, device: bool = True) -> dict:
        """Runs one item on CPU, then (``device``) on neuron, and compares. Returns the result
        record (a plain dict: the name, status, stage, reason, stages, fallback_ops, seconds,
        params, notes and the population's own fields)."""
        start = time.perf_counter()
        quiet(self.libraries)
        record: dict[str, Any] = {self.key: name, **self.defaults(name), "status": "pass", "stage": None,
                                  "reason": "", "stages": {}, "fallback_ops": {}, "seconds": 0.0, "params": 0,
                                  "notes": []}
        try:
            self._check(name, record, device)
        finally:
            record["seconds"] = round(time.perf_counter() - start, 2)
            if device:  # the worker goes on with other items: give the cached blocks back
                gc.collect()
                torch.neuron.empty_cache()
        return record

    def _check(self, name: str, record: dict, device: bool) -> None:
        stages = record["stages"]
        # ---- CPU reference ---------------------------------------------------------------------
        try:
            model, ctx = self.build(name, record)
            record["params"] = sum(p.numel() for p in model.parameters())
            device_model = self.device_copy(model)  # moved to neuron after the CPU run
            float64_model = copy_model(model) if self.arbitrate else None
            initial = {n: p.detach().clone() for n, p in model.named_parameters()} if self.arbitrate else None
            # two bfloat16 copies: a CPU forward may cache state on its model (codebooks, masks)
            bf16_ref = copy_model(model).to(torch.bfloat16)
            bf16_model = self.device_copy(model).to(torch.bfloat16)
        except Exception as e:
            record.update(self.cpu_failure(name, "setup", e))
            return
        try:
            train, gen = self.inputs(name, model, ctx)
        except Exception as e:
            record.update(self.cpu_failure(name, "inputs", e))
            return
        # The device gets the inputs as they are now: some heads write to their inputs (BLIP's
        # generate sets the first token), which must not reach the other stages.
        pristine = map_tensors((train, gen), lambda t: t.clone())
        ref: dict[str, Any] = {}
        try:
            ref["forward"] = self.forward(model, train, ctx)
        except Exception as e:
            record.update(self.cpu_failure(name, "forward", e))
            return
        declared = self.declared_defect(name)
        if declared is not None:
            record.update(status="fail", stage="harness",
                          reason=f"declared cpu-unrunnable ({declared[0]}) but the CPU forward runs")
            return

        def reference(stage: str, fn: Callable[[], Any]) -> bool:
            """The CPU reference of ``stage``; False when its failure ends the record."""
            try:
                ref[stage] = fn()
            except Exception as e:
                if stage in self.optional:
                    stages[stage] = f"n/a: CPU {_REFERENCE[stage]} raised {error_text(e)}"
                    return True
                record.update(self.cpu_failure(name, stage, e))
                return False
            return True

        # Generate runs before the training stages (on the initial weights, on both sides), so
        # that a failed step on the device does not show up again as a generate mismatch.
        if gen is not None and "generate" in self.stages:
            if not reference("generate", lambda: stage_generate(model, map_tensors(gen, lambda t: t.clone()))):
                return
        if "bf16" in self.stages:
            reference("bf16", lambda: self.forward(bf16_ref, bf16_inputs(train), ctx))
        del bf16_ref
        if not reference("backward", lambda: self.backward(model, train, ctx)):
            return
        # Matching NaNs compare equal; say so when the CPU reference has any.
        if not all(bool(torch.isfinite(t).all()) for t in tensors(ref["forward"]) if t.is_floating_point()):
            record["notes"].append("CPU forward outputs are not all finite")
        if "backward" in ref and not torch.isfinite(ref["backward"]["loss"]):
            record["notes"].append("CPU loss is not finite")
        if "generate" in ref:
            steps = ref["generate"]["logits"]
            new = len(steps) if steps else ref["generate"]["sequences"].shape[-1] - gen["input_ids"].shape[-1]
            if new != NEW_TOKENS:
                record["notes"].append(f"CPU generate produced {new} new tokens, not {NEW_TOKENS}")
        self.notes(record, ref)
        if "step" in self.stages:
            try:
                ref["step"] = stage_step(model, adamw(model.parameters()))
            except Exception as e:
                record.update(self.cpu_failure(name, "step", e))
                return
        del model
        if not device:
            return

        # ---- neuron ----------------------------------------------------------------------------
        torch.neuron.clear_op_tracking()
        arbitrated: list[str] = []  # stages that passed by float64 arbitration
        try:
            try:
                device_model.to(DEVICE)
                dtrain, dgen = to_device(pristine)
                stages["setup"] = "pass"
            except Exception as e:
                stages["setup"] = f"fail: {error_text(e)}"
                return
            tolerance = self.tolerance(ctx)
            float64: dict[str, Any] = {}

            def judge(out: Any, expected: Any, stage: str, key: str | None = None, part=lambda x: x) -> str | None:
                """None when ``out`` matches CPU's ``expected`` within the tolerance or (``arbitrate``)
                is as accurate as CPU's against float64 stage ``key`` (``compare_with_float64``);
                else the problem."""
                d = compare(part(out), part(expected), tolerance=tolerance)
                if d.ok or not self.arbitrate:
                    return diff_problem(d)
                if not float64:
                    try:
                        float64.update(self._float64_stages(float64_model, pristine[0], ctx))
                    except Exception as e:
                        float64["error"] = error_text(e)
                if "error" in float64:
                    return f"{d.summary()} (no float64 arbiter: {float64['error']})"
                f = compare_with_float64(part(out), part(expected), part(float64[key or stage]))
                if not f.ok:
                    return f"{d.summary()}; against float64: {f.summary()}"
                arbitrated.append(f"{stage} as accurate as CPU against float64, beyond the tolerance of CPU "
                                  f"({d.summary()})")
                return None

            run_stage(stages, "forward", lambda: self.forward(device_model, dtrain, ctx),
                      lambda out: judge(out, ref["forward"], "forward"))
            if "generate" in ref:
                run_stage(stages, "generate", lambda: stage_generate(device_model, dgen),
                          lambda out: _generate_problem(out, ref["generate"]))
            if "bf16" in ref:
                run_stage(stages, "bf16", lambda: self.forward(bf16_model.to(DEVICE), bf16_inputs(dtrain), ctx),
                          lambda out: judge(out, ref["bf16"], "bf16", "forward"))
            del bf16_model
            back = None
            if "backward" in ref:
                back = run_stage(stages, "backward", lambda: self.backward(device_model, dtrain, ctx),
                                 lambda out: grad_presence(out["grads"], ref["backward"]["grads"])
                                 or judge(out, ref["backward"], "backward", part=without_none_grads))
            if "compiled" in self.stages:
                if back is None:
                    stages["compiled"] = "skipped: backward raised"
                else:  # before the step, so that both sides hold the same weights
                    def check_compiled(out):
                        record["dynamo"] = out.pop("dynamo")
                        for oracle, against in (("eager neuron", to_cpu(back)), ("CPU", ref["backward"])):
                            problem = grad_presence(out["grads"], against["grads"], oracle) or diff_problem(
                                compare(without_none_grads(out), without_none_grads(against), tolerance=tolerance))
                            if problem:
                                return f"vs {oracle}: {problem}"
                        return None

                    run_stage(stages, "compiled", lambda: self.compiled(device_model, dtrain, ctx), check_compiled)
            if "step" in self.stages:
                if back is None:
                    stages["step"] = "skipped: backward raised"
                else:
                    def step_problem(out: dict) -> str | None:
                        # AdamW's first step moves each parameter by about lr * sign(gradient): gradient
                        # elements near zero, within both sides' rounding of it, may step either way.
                        # With gradients that passed, the step itself is checked from the device's gradients.
                        d = compare(out, ref["step"], tolerance=tolerance)
                        if d.ok or not self.arbitrate or not str(stages.get("backward")).startswith("pass"):
                            return diff_problem(d)
                        own = compare(out, cpu_step(initial, back["grads"]), tolerance=tolerance)
                        if not own.ok:
                            return f"{d.summary()}; from the device's gradients: {own.summary()}"
                        arbitrated.append(f"step equal to CPU's AdamW step from the device's gradients, beyond "
                                          f"the tolerance of CPU's from CPU's gradients ({d.summary()})")
                        return None

                    run_stage(stages, "step", lambda: stage_step(device_model, adamw(device_model.parameters())),
                              step_problem)
        finally:
            settle(record, self.stages)
            if record["status"] == "pass" and arbitrated:
                record["reason"] = "; ".join([record["reason"], *arbitrated] if record["reason"] else arbitrated)

    def _float64_stages(self, model, batch: dict, ctx) -> dict:
        """forward and backward of ``model`` (a pristine float32 copy, converted in place) in
        float64 on CPU: the arbiter when CPU and neuron differ by more than the tolerance (a step
        that differs is checked from the device's gradients instead, ``cpu_step``)."""
        model.double()
        batch = map_tensors(batch, lambda t: t.double() if t.is_floating_point() else t)
        return {"forward": self.forward(model, batch, ctx), "backward": self.backward(model, batch, ctx)}


def population(name: str) -> Population:
    return POPULATIONS[name]


def check_item(name: str, item: str) -> dict:
    """What a worker runs: one item of the population ``name``."""
    return POPULATIONS[name].check_one(item)


def _header(title: str, library: str, meta: dict) -> list[str]:
    return [f"# {title}", "",
            f"{library} {meta[library]}, torch {meta['torch']}; generated {meta['date']} "
            f"({meta['workers']} workers, {meta['wall_seconds']:.0f} s wall).", "",
            f"Regenerate: `{meta['command']}`", ""]


def _pass_rate(s: dict, what: str) -> str:
    return (f"**Pass rate: {s['pass']} / {s['runnable']} = {100 * s['pass_rate']:.1f}%** "
            f"(pass {s['pass']}, fail {s['fail']}, crash {s['crash']}, timeout {s['timeout']}, "
            f"cpu-unrunnable {s['cpu-unrunnable']}; {s['total']} {what})")


def _detail(r: dict) -> str:
    return f"{r['stage']}: {r['reason']}" if r["status"] in NOT_PASSING else r["reason"]


def _not_applicable(records: list[dict], key: str, stage: str, title: str) -> list[str]:
    na = [r for r in records if str(r["stages"].get(stage, "")).startswith("n/a")]
    if not na:
        return []
    out = ["", f"## {title} not applicable (raised on CPU, so there is no reference)", ""]
    return out + [f"- **{r[key]}**: {cell(r['stages'][stage][len('n/a: '):], 600)}"
                  for r in sorted(na, key=lambda r: r[key])]


# ---- transformers: causal LMs --------------------------------------------------------------------

class CausalLMs(Population):
    name = "transformers"
    report = "transformers"
    stages = ("setup", "forward", "backward", "step", "generate", "bf16", "compiled")
    optional = frozenset({"generate", "bf16"})
    default_timeout = 600.0  # the compiled stage's cold compile of forward and backward dominates
    example = "llama,gpt2"
    # The CI subset: the families most used in practice, dense and MoE, each a different code path.
    fast = (
        "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text", "phi3", "gpt2",
        "gpt_neox", "falcon", "opt", "olmo2", "granite", "deepseek_v3", "gpt_oss", "mixtral", "cohere", "starcoder2",
    )

    def names(self) -> list[str]:
        """Every model type of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, in the mapping's order."""
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)

    def unknown(self, names: list[str]) -> str:
        return f"not causal-LM model types: {', '.join(names)}"

    def build(self, name: str, record: dict):
        """The tiny float32 model on CPU (weights from ``torch.manual_seed(0)``); its config."""
        import transformers
        from transformers import AutoModelForCausalLM
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        from _tiny_configs import OVERRIDES, tiny_config

        override = OVERRIDES.get(name)
        config = tiny_config(name)
        if override is not None and override.build_from:
            config = getattr(config, override.build_from)
        torch.manual_seed(0)
        try:
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        except Exception:
            cls = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[name])
            torch.manual_seed(0)
            model = cls._from_config(config, dtype=torch.float32)
        record["class"] = type(model).__name__
        return model.float(), config

    def inputs(self, name: str, model, config):
        from _tiny_configs import make_batches

        return make_batches(name, model, config)

    @staticmethod
    def _kwargs(model, batch: dict) -> dict:
        kwargs = {k: v for k, v in batch.items() if not k.startswith("_")}
        if "use_cache" in inspect.signature(model.forward).parameters:
            kwargs["use_cache"] = False  # a scoring/training forward needs no cache; generate tests it
        return kwargs

    @staticmethod
    def _logits(out) -> torch.Tensor:
        logits = getattr(out, "logits", None)
        return logits if logits is not None else out[0]

    def forward(self, model, batch: dict, config=None) -> dict:
        model.eval()
        torch.manual_seed(0)
        kwargs = self._kwargs(model, batch)
        kwargs.pop("labels", None)
        with torch.no_grad():
            out = model(**kwargs)
        return {"logits": self._logits(out).detach()}

    def backward(self, model, batch: dict, config=None) -> dict:
        model.train()
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        out = model(**self._kwargs(model, batch))
        logits = self._logits(out)
        loss = getattr(out, "loss", None)
        if loss is None:  # a model that does not compute its own loss: next-token cross entropy
            labels = batch["labels"]
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                                     labels[:, 1:].reshape(-1), ignore_index=-100)
        loss.backward()
        grads = {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in model.named_parameters()}
        return {"loss": loss.detach(), "logits": logits.detach(), "grads": grads}

    def compiled(self, model, batch: dict, config=None) -> dict:
        """The backward stage with ``model`` compiled for neuron (``nn.Module.compile``, so parameter
        names stay), from a clean Dynamo state; adds the graph breaks Dynamo made."""
        torch._dynamo.reset()
        torch.neuron.reset_dynamo_metrics()
        eager_grads = [(p, p.grad) for p in model.parameters()]
        model.compile(backend="neuron", options=COMPILE_OPTIONS)
        try:
            out = self.backward(model, batch, config)
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

    def summarize(self, records: list[dict]) -> dict:
        """Counts per status and the pass rate over the architectures that run on CPU; the
        compiled stage on its own (failing an eager stage first does not hide whether it compiles)."""
        counts = count_statuses(records)
        runnable = counts["runnable"]
        compiled = sum(1 for r in records if r.get("stages", {}).get("compiled") == "pass")
        eager = sum(1 for r in records if r["status"] == "pass" or (r["status"] == "fail" and r["stage"] == "compiled"))
        breaks = [r for r in records if (r.get("dynamo") or {}).get("graph_breaks")]
        return {**counts,
                "eager_pass": eager, "eager_pass_rate": (eager / runnable) if runnable else 0.0,
                "compiled_pass": compiled, "compiled_pass_rate": (compiled / runnable) if runnable else 0.0,
                "with_graph_breaks": len(breaks), "graph_breaks": sum(r["dynamo"]["graph_breaks"] for r in breaks)}

    def markdown(self, records: list[dict], s: dict, meta: dict) -> str:
        out = _header("Hugging Face causal-LM coverage on `neuron`", "transformers", meta) + [
            "Every architecture of `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, shrunk to a tiny random config "
            "(`coverage/_tiny_configs.py`), runs on CPU and on `neuron` with the same weights "
            "and inputs: forward logits, loss backward and every gradient, one AdamW step and every "
            "parameter, greedy generate (token ids exact), forward logits with bfloat16 weights, and the "
            "loss backward again with the model compiled by `torch.compile(backend=\"neuron\")` (compared with "
            "eager `neuron` and with CPU; Dynamo's graph breaks counted). "
            "`cpu-unrunnable`: the CPU reference itself "
            "cannot run here; it is left out of the pass rate.",
            "",
            _pass_rate(s, "architectures"),
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
            breaks = (r.get("dynamo") or {}).get("graph_breaks", "—")
            out.append(f"| {r['arch']} | {r['status']} | {cell(_detail(r))} | {cell(short_ops(r['fallback_ops']), 80)} "
                       f"| {breaks} | {r['seconds']:.1f} |")
        # Failures grouped by cause: the same status, stage and error text.
        out += ["", "## Failures", ""] + failure_lines(records, "arch", "architecture")
        not_compiled = [r for r in records if r["status"] != "cpu-unrunnable" and r["stages"].get("compiled") != "pass"]
        out += ["", "## Compiled stage not passing", ""]
        if not not_compiled:
            out.append("None.")
        for r in sorted(not_compiled, key=lambda r: r["arch"]):
            why = r["stages"].get("compiled") or (f"{r['status']}: {r['reason']}" if r["status"] != "pass" else "not run")
            out.append(f"- **{r['arch']}**: {cell(why, 600)}")
        out += ["", "## CPU-unrunnable", ""] + unrunnable_lines(records, "arch")
        out += _not_applicable(records, "arch", "generate", "Generate")
        out += _not_applicable(records, "arch", "bf16", "bfloat16 forward")
        return "\n".join(out) + "\n"


# ---- models: every model family with its task head -----------------------------------------------

class ModelFamilies(Population):
    name = "models"
    report = "transformers_models"
    stages = ("setup", "forward", "backward", "step", "generate", "bf16")
    strict_cpu = True
    arbitrate = True
    default_timeout = 600.0
    example = "bert,vit"
    # The CI subset: the families most used in practice, one or more per modality.
    fast = (
        "bert", "roberta", "distilbert", "deberta-v2", "electra", "modernbert", "t5", "bart", "whisper", "wav2vec2",
        "vit", "convnext", "swin", "clip", "siglip", "llava", "qwen2_vl", "gpt2", "llama", "mamba",
    )

    def names(self) -> list[str]:
        from _models_specs import architectures

        return architectures()

    def unknown(self, names: list[str]) -> str:
        return f"not in MODEL_MAPPING_NAMES: {', '.join(names)}"

    def defaults(self, name: str) -> dict:
        return {"task": None, "class": None}

    def declared_defect(self, name: str) -> tuple[str, str] | None:
        from _models_specs import SPECS

        spec = SPECS.get(name)
        return (spec.unrunnable, spec.unrunnable_match) if spec is not None and spec.unrunnable else None

    def build(self, name: str, record: dict):
        import _models_specs as specs

        record["task"], record["class"] = specs.task_of(name)  # known even when building fails
        model, config, task = specs.build(name)
        record.update(task=task, **{"class": type(model).__name__})
        return model, (config, task)

    def inputs(self, name: str, model, ctx):
        from _models_specs import make_inputs

        config, task = ctx
        return make_inputs(name, model, config, task)

    @staticmethod
    def _call(model, batch: dict) -> Any:
        from _models_specs import SPECS

        kwargs = {k: v for k, v in batch.items() if not k.startswith("_")}
        spec = SPECS.get(getattr(model.config, "model_type", None))
        if spec is not None and spec.call is not None:  # a family whose computation is not its forward
            return spec.call(model, kwargs)
        if "use_cache" in inspect.signature(model.forward).parameters:
            kwargs["use_cache"] = False  # a scoring/training forward needs no cache; generate tests it
        return model(**kwargs)

    def forward(self, model, batch: dict, ctx=None) -> dict:
        model.eval()
        torch.manual_seed(0)
        with torch.no_grad():
            out = self._call(model, batch)
        return {"out": map_tensors(tree(out), lambda t: t.detach())}

    def backward(self, model, batch: dict, ctx=None) -> dict:
        model.train()
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        out = self._call(model, batch)
        loss = loss_of(out)
        loss.backward()
        grads = {n: (p.grad.detach().clone() if p.grad is not None else None)
                 for n, p in model.named_parameters() if p.requires_grad}
        return {"loss": loss.detach(), "out": map_tensors(tree(out), lambda t: t.detach()), "grads": grads}

    def summarize(self, records: list[dict]) -> dict:
        """Counts per status and the pass rate over the architectures that run on CPU; passes per task."""
        s = count_statuses(records)
        by_task: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
        for r in records:
            if r["status"] != "cpu-unrunnable":
                t = by_task[r.get("task") or "unknown"]
                t[0] += r["status"] == "pass"
                t[1] += 1
        return {**s, "by_task": dict(sorted(by_task.items()))}

    def markdown(self, records: list[dict], s: dict, meta: dict) -> str:
        out = _header("Hugging Face model families on `neuron`", "transformers", meta) + [
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
            _pass_rate(s, "architectures"),
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
        for r in sorted(records, key=lambda r: r["arch"]):
            out.append(f"| {r['arch']} | {r.get('task') or ''} | {r.get('class') or ''} | {r['status']} "
                       f"| {cell(_detail(r))} | {cell(short_ops(r['fallback_ops']), 80)} | {r['params']} "
                       f"| {r['seconds']:.1f} |")
        harness = sum(r["status"] == "fail" and r["stage"] == "harness" for r in records)
        out += ["", "## Failures", "",
                f"Stage `harness` ({harness} architectures): the CPU reference raised with the inputs or the tiny "
                "config this sweep built, so the family never reached the device; what it lacks is in the error "
                "(an input its forward requires, a config field the generic shrink breaks). They count as failures "
                "until `_models_specs.py` covers them. Any other stage is the device's result differing from CPU's "
                "(or raising).", ""]
        out += failure_lines(records, "arch", "architecture")
        out += ["", "## CPU-unrunnable", ""] + unrunnable_lines(records, "arch")
        out += _not_applicable(records, "arch", "bf16", "bfloat16 forward")
        ops: collections.Counter = collections.Counter()
        for r in records:
            ops.update(r["fallback_ops"].keys())
        out += ["", "## Ops through the generic fallback", "",
                "Ops that ran through the boxed CPU fallback (`torch.neuron.get_fallback_ops()`), by how many "
                "architectures used them.", ""]
        out += [f"- `{op}`: {n}" for op, n in ops.most_common()] or ["None."]
        return "\n".join(out) + "\n"


# ---- diffusers: Diffusers' model classes ---------------------------------------------------------

ZERO_INIT_STD = 0.02  # the spread given to parameters a model initialises to zero


class DiffusersModels(Population):
    """Parameters that a model initialises to zero (zero-initialised output projections,
    adaLN-zero gates, control-net zero convolutions) get small random values first, so that
    every layer reaches the output and gets a non-trivial gradient; the backward stage also
    compares the main input's gradient."""

    name = "diffusers"
    report = "diffusers"
    key = "model"  # a key of _diffusers_specs.SPECS
    noun = "model"
    unit = "model"
    stages = ("setup", "forward", "backward", "bf16")
    optional = frozenset({"backward", "bf16"})  # some ops have no CPU backward (FlexAttention)
    default_timeout = 300.0
    example = "FluxTransformer2DModel,AutoencoderKL"
    libraries = ("diffusers", "transformers")
    # The CI subset: the models of the pipelines most used, each a different code path.
    fast = (
        "UNet2DConditionModel", "FluxTransformer2DModel", "Flux2Transformer2DModel", "QwenImageTransformer2DModel",
        "AutoencoderKL", "WanTransformer3DModel",
    )

    @staticmethod
    def specs() -> dict:
        from _diffusers_specs import SPECS

        return SPECS

    def names(self) -> list[str]:
        return list(self.specs())

    def unknown(self, names: list[str]) -> str:
        return f"no spec for: {', '.join(names)} (see coverage/_diffusers_specs.py)"

    def defaults(self, name: str) -> dict:
        spec = self.specs().get(name)
        return {"class": spec.cls.rpartition(".")[2] if spec is not None else ""}

    def initializer(self) -> None:
        super().initializer()
        import diffusers.models  # noqa: F401

    def versions(self) -> dict:
        import diffusers

        return {**super().versions(), "diffusers": diffusers.__version__}

    def meta(self, items: list, args) -> dict:
        return {**self.versions(), "models": len(items), "unswept": unswept_classes()}

    def tolerance(self, spec) -> Callable:
        return lambda dt: spec.tolerance or model_tolerance(dt)

    @staticmethod
    def model_class(spec):
        """The class a spec names: an export of ``diffusers`` or a dotted path."""
        import importlib

        import diffusers

        if hasattr(diffusers, spec.cls):
            return getattr(diffusers, spec.cls)
        module, _, attr = spec.cls.rpartition(".")
        return getattr(importlib.import_module(module), attr)

    def build(self, name: str, record: dict):
        """The tiny float32 model on CPU (weights from ``torch.manual_seed(0)``); its spec."""
        spec = self.specs()[name]
        cls = self.model_class(spec)
        torch.manual_seed(0)
        model = cls(**(spec.config() if callable(spec.config) else spec.config)).float()
        if spec.prepare is not None:
            spec.prepare(model)
        filled = _fill_zero_params(model)
        if spec.notes:
            record["notes"].append(spec.notes)
        if filled:
            record["notes"].append(f"{filled} zero-initialised parameters given random values")
        unset = [n for n, p in model.named_parameters() if p.is_floating_point() and not bool(p.isfinite().all())]
        if unset:  # a parameter left uninitialised (torch.empty): its values are whatever memory held
            record["notes"].append(f"parameters with non-finite values after construction: {', '.join(unset[:4])}")
        return model, spec

    def inputs(self, name: str, model, spec):
        return spec.inputs(torch.Generator().manual_seed(0)), None

    @staticmethod
    def _call(model, spec, kwargs: dict) -> Any:
        fn = getattr(model, spec.method)
        kwargs = dict(kwargs)
        if "return_dict" in inspect.signature(fn).parameters and "return_dict" not in kwargs:
            kwargs["return_dict"] = False
        return tree(fn(**kwargs))

    def forward(self, model, batch: dict, spec) -> dict:
        model.eval()
        torch.manual_seed(0)
        with torch.no_grad():
            return {"out": self._call(model, spec, batch)}

    def backward(self, model, batch: dict, spec) -> dict:
        model.train()
        model.zero_grad(set_to_none=True)
        kwargs = dict(batch)
        grad_inputs = spec.grad_inputs if spec.grad_inputs is not None else _main_input(kwargs)
        for k in grad_inputs:
            kwargs[k] = kwargs[k].detach().clone().requires_grad_(True)
        torch.manual_seed(0)
        out = self._call(model, spec, kwargs)
        loss = projection_loss(out)
        loss.backward()
        grads = {f"param.{n}": (p.grad.detach().clone() if p.grad is not None else None)
                 for n, p in model.named_parameters() if p.requires_grad}
        for k in grad_inputs:
            g = kwargs[k].grad
            grads[f"input.{k}"] = g.detach().clone() if g is not None else None
        return {"loss": loss.detach(), "out": map_tensors(out, lambda t: t.detach()), "grads": grads}

    def notes(self, record: dict, ref: dict) -> None:
        unused = [k for k, g in ref.get("backward", {}).get("grads", {}).items() if g is None]
        if unused:
            record["notes"].append(f"no gradient reaches {len(unused)} parameter{'s' if len(unused) > 1 else ''} "
                                   "with this config (on CPU either)")

    def markdown(self, records: list[dict], s: dict, meta: dict) -> str:
        classes = {r["class"] for r in records}
        out = _header("Diffusers model coverage on `neuron`", "diffusers", meta) + [
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
            _pass_rate(s, f"configurations of {len(classes)} model classes"),
            "",
            "| model | status | failing stage: reason / mismatch | fallback ops | parameters | seconds |",
            "|---|---|---|---|---:|---:|",
        ]
        for r in sorted(records, key=lambda r: r["model"]):
            out.append(f"| {r['model']} | {r['status']} | {cell(_detail(r))} | {cell(short_ops(r['fallback_ops']), 80)} "
                       f"| {r['params']:,} | {r['seconds']:.1f} |")
        out += ["", "## Failures", ""] + failure_lines(records, "model", "model")
        out += ["", "## CPU-unrunnable", ""] + unrunnable_lines(records, "model")
        # What a reader needs to weigh a result (the JSON report has every note, the zero-initialised counts too).
        noted = {r["model"]: [n for n in r.get("notes", []) if "zero-initialised" not in n] for r in records}
        noted = {k: v for k, v in noted.items() if v}
        if noted:
            out += ["", "## Notes", ""]
            for name in sorted(noted):
                out.append(f"- **{name}**: {cell('; '.join(noted[name]), 600)}")
        missing = meta.get("unswept") or []
        out += ["", f"## Model classes not in the sweep ({len(missing)})", ""]
        out.append(", ".join(missing) if missing else "None.")
        return "\n".join(out) + "\n"


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


def _main_input(kwargs: dict) -> tuple[str, ...]:
    """The first floating tensor input (the latents or the image), whose gradient is compared too."""
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return (k,)
    return ()


def unswept_classes() -> list[str]:
    """Model classes that ``diffusers`` exports and that no spec builds."""
    import diffusers

    covered = {s.cls.rpartition(".")[2] for s in DiffusersModels.specs().values()}
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


# ---- the command line ----------------------------------------------------------------------------

POPULATIONS: dict[str, Population] = {p.name: p for p in (CausalLMs(), ModelFamilies(), DiffusersModels())}


class HuggingFaceSweep(Sweep):
    """``--population`` picks the population that runs."""

    script = "hf_sweep"
    description = __doc__

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--population", required=True, choices=list(POPULATIONS),
                       help="which models: " + "; ".join(f"{n}: e.g. {pop.example}" for n, pop in POPULATIONS.items()))
        p.add_argument("--only", help="comma-separated names of the population's models")
        p.add_argument("--fast", action="store_true", help="the population's CI subset")

    def configure(self, args) -> Population:
        return POPULATIONS[args.population]


def main(argv: list[str] | None = None) -> int:
    return sweep_main(HuggingFaceSweep(), argv)


if __name__ == "__main__":
    sys.exit(main())
