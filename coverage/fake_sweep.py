"""PyTorch's OpInfo samples on ``neuron`` under FakeTensorMode, against the real run.

Dynamo and AOTAutograd trace with fake tensors (metadata without data), and Inductor
lays out memory from what the fake run said, so a device kernel whose outputs differ
from its fake description breaks compiled code. For every OpInfo of ``op_db`` and every
sample input (made on ``neuron``, as ``opinfo_sweep`` makes them), the op runs for real
and on fake copies of the same inputs (``FakeTensorMode().from_tensor``); a sample
passes when the fake outputs describe the real ones:

- ``forward``: the same structure, and for each tensor the same shape, dtype, device,
  significant strides (those of dimensions longer than 1), storage offset,
  ``requires_grad`` and conj/neg bits, and the same input it aliases, if any;
- ``grad`` (ops with autograd, in float32/float64/complex64): the gradients of the
  inputs, computed by ``torch.autograd.grad`` in fake mode and for real, likewise.

A sample that does not pass is run the same way on CPU (an exact copy of its inputs).
When the CPU's fake run fails in the same places (the same exception type, or the same
mismatching fields), the sample counts as ``upstream``: PyTorch's fake kernels do not
describe the CPU either (data-dependent output shapes such as ``nonzero``, ops without
a fake kernel), and matching the CPU is the bar. Otherwise it is a ``fail`` of the
device. Samples whose real run raises on ``neuron`` are not counted (``opinfo_sweep``
judges those).

``--dynamic`` gives the fake inputs symbolic sizes and runs the ops under the Python
dispatcher, as Dynamo traces once a size changes (and as AOTAutograd traces): another
path through PyTorch's fake kernels (Python decompositions instead of meta kernels), on
which data-dependent ops run too (their data-dependent sizes are not compared).

    python coverage/fake_sweep.py             # all ops, writes docs/coverage/fake.{md,json}
    python coverage/fake_sweep.py --dynamic   # writes docs/coverage/fake_dynamic.{md,json}
    python coverage/fake_sweep.py --ops nn.functional.scaled_dot_product_attention   # prints only
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import sys
from collections import Counter
from typing import Any

import torch

import opinfo_sweep as _ops
from torch_neuronx.testing._compare import CPUCopy, map_tensors, tensors

from _sweep import main as sweep_main

DTYPES = _ops.DTYPES
MAX_DETAIL = 300

# ---- comparing a fake result with a real one ---------------------------------------


class _Problems:
    """What differs between a fake run and the real one. ``keys`` name each problem
    without device-specific detail (``forward [0]: strides``, ``grad: raises
    DynamicOutputShapeException``) so a neuron run can be matched against a CPU run."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.details: list[str] = []

    def add(self, key: str, detail: str) -> None:
        if key not in self.keys:
            self.keys.append(key)
            self.details.append(f"{key}: {detail}"[:MAX_DETAIL])

    def __bool__(self) -> bool:
        return bool(self.keys)


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def _storage_id(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except Exception:  # noqa: BLE001 - tensors without a storage alias nothing
        return None


def _aliases(inputs: Any, outputs: Any) -> list[int | None]:
    """For each output tensor, the position of the first input tensor sharing its storage."""
    first: dict[int, int] = {}
    for i, t in enumerate(tensors(inputs)):
        sid = _storage_id(t)
        if sid is not None:
            first.setdefault(sid, i)
    return [first.get(_storage_id(o)) if _storage_id(o) is not None else None for o in tensors(outputs)]


def _hint(x: Any) -> Any:
    """An int for a (possibly symbolic) size: a SymInt's hint, None when data-dependent."""
    if isinstance(x, torch.SymInt):
        return x.node.hint
    return x


def _compare_meta(fake: Any, real: Any, path: str, check: str, p: _Problems) -> None:
    from torch._subclasses.fake_tensor import FakeTensor

    where = f"{check} {path}".rstrip()
    if isinstance(real, torch.Tensor):
        if not isinstance(fake, FakeTensor):
            p.add(f"{where}: type", f"fake run returned {type(fake).__name__}, real run a tensor")
            return
        shape = tuple(_hint(s) for s in fake.shape)  # dimensions of data-dependent size are not compared
        if len(shape) != real.dim() or any(f is not None and f != r for f, r in zip(shape, real.shape)):
            p.add(f"{where}: shape", f"fake {tuple(fake.shape)} vs real {tuple(real.shape)}")
            return
        for field, f, r in (("dtype", fake.dtype, real.dtype), ("device", fake.device, real.device),
                            ("layout", fake.layout, real.layout)):  # fmt: skip
            if f != r:
                p.add(f"{where}: {field}", f"fake {f} vs real {r}")
                return
        if real.layout == torch.strided:
            # significant strides only (dimensions longer than 1), as torch._prims_common compares them
            stride = [_hint(s) for s in fake.stride()]
            if real.numel() > 0 and any(real.size(d) > 1 and stride[d] is not None and stride[d] != real.stride(d)
                                        for d in range(real.dim())):  # fmt: skip
                p.add(f"{where}: strides", f"fake {fake.stride()} vs real {real.stride()} (shape {tuple(real.shape)})")
            offset = _hint(fake.storage_offset())
            if offset is not None and offset != real.storage_offset():
                p.add(f"{where}: storage offset", f"fake {fake.storage_offset()} vs real {real.storage_offset()}")
        for field, f, r in (("requires_grad", fake.requires_grad, real.requires_grad),
                            ("conj", fake.is_conj(), real.is_conj()), ("neg", fake.is_neg(), real.is_neg())):
            if f != r:
                p.add(f"{where}: {field}", f"fake {f} vs real {r}")
        return
    if isinstance(real, (list, tuple)):
        if not isinstance(fake, (list, tuple)) or len(fake) != len(real):
            p.add(f"{where}: structure", f"fake {type(fake).__name__} vs real {type(real).__name__} of {len(real)}")
            return
        for i, (f, r) in enumerate(zip(fake, real)):
            _compare_meta(f, r, f"{path}[{i}]", check, p)
        return
    if isinstance(real, dict):
        if not isinstance(fake, dict) or fake.keys() != real.keys():
            p.add(f"{where}: structure", "keys differ")
            return
        for k in real:
            _compare_meta(fake[k], real[k], f"{path}.{k}", check, p)
        return
    if isinstance(fake, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        fake = fake.node.hint
        if fake is None:  # data-dependent
            return
    if isinstance(real, float) and isinstance(fake, float) and math.isnan(real) and math.isnan(fake):
        return
    if isinstance(real, (bool, int, float, str, type(None), torch.dtype, torch.device)) and fake != real:
        p.add(f"{where}: value", f"fake {fake!r} vs real {real!r}")


def _grad_inputs(args: Any) -> list[int]:
    """Positions (in ``tensors(args)``) of the inputs whose gradients are compared: those
    requiring grad, except views of a base that requires grad (their copies are leaves)."""
    return [i for i, t in enumerate(tensors(args))
            if t.requires_grad and not (t._is_view() and t._base is not None and t._base.requires_grad)]  # fmt: skip


def _grads(process, args: Any, out: Any) -> tuple[list, Any] | None:
    """Gradients of the differentiable inputs in ``args`` for random output gradients
    (None when nothing is differentiable); ``process`` picks the outputs from ``out``."""
    flat = tensors(args)
    inputs = [flat[i] for i in _grad_inputs(args)]
    outs = [t for t in tensors(process(out)) if t.requires_grad]
    if not inputs or not outs:
        return None
    grads_out = [torch.randn_like(t) if t.is_floating_point() or t.is_complex() else None for t in outs]
    return inputs, torch.autograd.grad(outs, inputs, grads_out, allow_unused=True)


def _fake_problems(fn, args: Any, real: Any, grad: bool, process=lambda out: out, res=None,
                   dynamic: bool = False) -> _Problems:  # fmt: skip
    """Runs ``fn(*args[0], **args[1])`` on fake copies of ``args``, the arguments of a
    real run that returned ``real``, and lists what the fake run gets wrong; with
    ``grad``, also the gradients (the real ones are computed here, through ``real``).
    ``dynamic``: the fake inputs have symbolic sizes, as Dynamo makes them once a size
    changes (ops with data-dependent output sizes then run too), and ops run under the
    Python dispatcher as Dynamo and AOTAutograd run them (without it, C++ composites that
    pad by a symbolic amount fail even on CPU)."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    p = _Problems()
    mode = FakeTensorMode(shape_env=ShapeEnv()) if dynamic else FakeTensorMode()
    tracing = enable_python_dispatcher if dynamic else contextlib.nullcontext
    try:
        fake_args = map_tensors(args, mode.from_tensor)
    except Exception as e:  # noqa: BLE001
        p.add("inputs: raises " + type(e).__name__, f"converting the inputs to fake tensors: {_short(e)}")
        return p
    if res is not None:
        res.checks["forward"] += 1
    try:
        with mode, tracing():
            fake = _ops._run(lambda: fn(*fake_args[0], **fake_args[1]))
    except Exception as e:  # noqa: BLE001
        p.add("forward: raises " + type(e).__name__, _short(e))
        return p
    _compare_meta(fake, real, "", "forward", p)
    if _aliases(args, real) != _aliases(fake_args, fake):
        p.add("forward: aliasing", f"outputs alias inputs {_aliases(fake_args, fake)} in the fake run, "
              f"{_aliases(args, real)} in the real one")  # fmt: skip
    if res is not None and not p:
        res.checks["forward_passed"] += 1
    if not grad or p:
        return p
    try:
        expected = _grads(process, args, real)
    except Exception:  # noqa: BLE001 - no real backward for this sample: nothing to describe
        return p
    if expected is None:
        return p
    if res is not None:
        res.checks["grad"] += 1
    try:
        with mode, tracing():
            actual = _grads(process, fake_args, fake)
    except Exception as e:  # noqa: BLE001
        p.add("grad: raises " + type(e).__name__, _short(e))
        return p
    if actual is None:
        p.add("grad: structure", "no differentiable outputs or inputs in the fake run")
        return p
    _compare_meta(list(actual[1]), list(expected[1]), "", "grad", p)
    if res is not None and not p:
        res.checks["grad_passed"] += 1
    return p


def check_fake(fn, *args, grad: bool = False, dynamic: bool = False, **kwargs) -> list[str]:
    """Runs ``fn(*args, **kwargs)`` for real and under FakeTensorMode on fake copies of the
    arguments (with symbolic sizes if ``dynamic``); returns what the fake run gets wrong
    (shapes, dtypes, devices, strides, aliasing; with ``grad``, also of the inputs'
    gradients), or [] when it describes the real run. Raises what the real run raises."""
    call = (args, kwargs)
    real = _ops._run(lambda: fn(*args, **kwargs))
    return _fake_problems(fn, call, real, grad, dynamic=dynamic).details


def check_sample(op, sample, dtype, with_grad: bool, res, index: int, dynamic: bool = False) -> str:
    """One sample made on ``neuron``: pass / fail / upstream / real-error (see the module doc)."""
    args = ((sample.input, *sample.args), sample.kwargs)
    try:
        real = _ops._run(lambda: op(*args[0], **args[1]))
    except Exception:  # noqa: BLE001 - nothing to describe; opinfo_sweep judges the device's errors
        return "real-error"
    problems = _fake_problems(op, args, real, with_grad, sample.output_process_fn_grad, res, dynamic)
    if not problems:
        return "pass"
    # The same check on an exact CPU copy of the inputs: is PyTorch's fake kernel wrong there too?
    try:
        cpu_args = CPUCopy()(args)
        cpu_real = _ops._run(lambda: op(*cpu_args[0], **cpu_args[1]))
    except Exception as e:  # noqa: BLE001 - the real run raised on CPU, or a layout CPUCopy does not take
        cpu, note = None, f"no CPU comparison: {_short(e)}"
    else:
        cpu, note = _fake_problems(op, cpu_args, cpu_real, with_grad, sample.output_process_fn_grad,
                                   dynamic=dynamic), ""
    if cpu is not None and set(problems.keys) <= set(cpu.keys):
        for k in problems.keys:
            res.reasons[f"upstream: {k}"] += 1
        return "upstream"
    for k in problems.keys:
        if cpu is None or k not in cpu.keys:
            res.reasons[f"fail: {k}"] += 1
    res.fail(dtype, index, "fake", "; ".join(problems.details) + (f" [{note}]" if note else ""), sample)
    return "fail"


# ---- the sweep ---------------------------------------------------------------------


def check_op(key: str, dtypes: tuple[torch.dtype, ...] = DTYPES, dynamic: bool = False) -> dict:
    """Every sample of the OpInfo ``key`` in each dtype the op supports on CPU, judged by
    :func:`check_sample`; counts per dtype, checks run, reasons, the first failures."""
    return _ops.check_op(key, dtypes, check=functools.partial(check_sample, dynamic=dynamic))


def _check_op_item(item: tuple[str, tuple[str, ...]]) -> dict:
    key, dtype_names = item
    return check_op(key, tuple(getattr(torch, d) for d in dtype_names))


def _check_op_item_dynamic(item: tuple[str, tuple[str, ...]]) -> dict:
    key, dtype_names = item
    return check_op(key, tuple(getattr(torch, d) for d in dtype_names), dynamic=True)


OUTCOMES = ("pass", "fail", "upstream", "real-error", "cpu-error", "unsupported")


def summarize(results: list[dict]) -> dict:
    total, checks, reasons = Counter(), Counter(), Counter()
    reason_ops: dict[str, list[str]] = {}
    per_op = []
    for r in results:
        checks.update(r.get("checks", {}))
        c = Counter()
        for v in r.get("counts", {}).values():
            c.update(v)
        if r.get("status") in ("crash", "timeout"):
            c["fail"] += max(1, c["fail"])
        total.update(c)
        for reason, n in r.get("reasons", {}).items():
            reasons[reason] += n
            reason_ops.setdefault(reason, []).append(r["op"])
        per_op.append({"op": r["op"], **{o: c[o] for o in OUTCOMES}, "status": r.get("status", "ok"),
                       "error": r.get("error", ""), "failures": r.get("failures", []),
                       "reasons": r.get("reasons", {}), "seconds": r.get("seconds", 0.0)})  # fmt: skip
    counted = total["pass"] + total["fail"] + total["upstream"]
    return {"samples": counted, **{f"samples_{o.replace('-', '_')}": total[o] for o in OUTCOMES},
            "checks": dict(sorted(checks.items())),
            "reasons": [{"reason": k, "samples": n, "ops": sorted(set(reason_ops[k]))}
                        for k, n in reasons.most_common()],
            "ops": per_op}  # fmt: skip


class FakeSweep(_ops.OpSweep):
    script = "fake_sweep"
    description = __doc__
    report = "fake"
    core_help = "only opinfo_sweep's core ops"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        super().add_arguments(p)
        p.add_argument("--dynamic", action="store_true", help="fake inputs with symbolic sizes (writes fake_dynamic.*)")

    def configure(self, args: argparse.Namespace) -> FakeSweep:
        return DYNAMIC if args.dynamic else self

    def check(self):
        return _check_op_item

    def summarize(self, records: list[dict]) -> dict:
        return summarize(records)

    def failed(self, summary: dict) -> bool:
        return summary["samples_fail"] > 0

    def printed(self, records: list[dict], s: dict, seconds: float, workers: int) -> list[str]:
        out = [f"{s['samples_pass']} passed, {s['samples_fail']} failed on neuron only, {s['samples_upstream']} "
               f"upstream (of {s['samples']} samples; {s['samples_real_error']} raised for real) in {seconds:.0f} s"]
        for o in s["ops"]:
            if o["fail"]:
                first = o["failures"][0]["message"] if o["failures"] else f"{o['status']}: {o['error']}"
                out.append(f"  FAIL {o['op']}: {o['fail']} samples; {first[:200]}")
        return out

    def meta(self, items: list, args: argparse.Namespace) -> dict:
        return {**super().meta(items, args), "dynamic": self is DYNAMIC}

    def render(self, records: list[dict], summary: dict, meta: dict) -> tuple[dict, str]:
        return {"meta": meta, **summary}, markdown(summary, meta)


class DynamicFakeSweep(FakeSweep):
    report = "fake_dynamic"

    def check(self):
        return _check_op_item_dynamic

    def options(self, args: argparse.Namespace) -> list[str]:
        return ["--dynamic", *super().options(args)]


SWEEP, DYNAMIC = FakeSweep(), DynamicFakeSweep()


def markdown(s: dict, meta: dict) -> str:
    """The page ``fake.md`` (``fake_dynamic.md`` with symbolic sizes)."""
    dynamic = meta["dynamic"]
    lines = [
        "# Fake tensors on the `neuron` device" + (", symbolic sizes" if dynamic else ""),
        "",
        f"Every OpInfo of PyTorch {meta['torch']}'s `op_db` ({len(s['ops'])} entries), every sample input in "
        f"{', '.join(meta['dtypes'])}, run on `neuron` for real and under `FakeTensorMode` (as Dynamo and "
        "AOTAutograd trace): outputs and gradients must agree in shape, dtype, device, significant strides, "
        "storage offset, requires_grad and aliasing. Samples that also fail this way on CPU are `upstream` "
        "(PyTorch's fake kernels; not the device's to fix). See `coverage/fake_sweep.py`."
        + (" Here the fake inputs have symbolic sizes, as Dynamo traces once a size changes; ops with "
           "data-dependent output sizes then run too (those sizes are not compared)." if dynamic else
           " The same with symbolic sizes: `fake_dynamic.md`."),
        "",
        _ops.regenerate_line(meta),
        "",
        f"**{s['samples_pass']} of {s['samples']} samples pass; {s['samples_fail']} fail on neuron only; "
        f"{s['samples_upstream']} fail the same way on CPU (upstream)**; {s['samples_real_error']} raised in the "
        f"real run on neuron and {s['samples_cpu_error']} could not be made (not counted).",
        "",
        "Checks run (passed): " + ", ".join(
            f"{k} {s['checks'].get(k, 0)} ({s['checks'].get(k + '_passed', 0)})" for k in ("forward", "grad")) + ".",
        "",
    ]
    failing = [o for o in s["ops"] if o["fail"]]
    if failing:
        lines += ["## Failures on neuron only", "", "| op | samples | first failure |", "|---|---:|---|"]
        for o in sorted(failing, key=lambda o: -o["fail"]):
            first = o["failures"][0]["message"] if o["failures"] else f"{o['status']}: {o['error']}"
            lines.append(f"| `{o['op']}` | {o['fail']} | {first[:240]} |".replace("\n", " "))
        lines.append("")
    lines += ["## Why samples do not pass", "", "| class | samples | ops |", "|---|---:|---|"]
    for r in s["reasons"]:
        ops = ", ".join(f"`{n}`" for n in r["ops"][:12]) + (f" and {len(r['ops']) - 12} more" if len(r["ops"]) > 12
                                                              else "")
        lines.append(f"| {r['reason']} | {r['samples']} | {ops} |")
    lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return sweep_main(SWEEP, argv)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
