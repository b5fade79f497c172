"""PyTorch's OpInfo samples compiled for ``neuron``, against eager ``neuron``.

As PyTorch's own Inductor OpInfo tests do: each sample input (made on ``neuron``, as
``opinfo_sweep`` makes them) runs eagerly and through ``torch.compile(backend="neuron")``
(Dynamo, AOTAutograd, the neuron FX passes, Inductor's C++ code for the device), with
Inductor's ``fallback_random`` so random ops draw the same numbers; a sample passes when

- ``forward``: the compiled outputs equal the eager ones (values within the dtype's op
  tolerance, dtypes, shapes, and that they live where eager's do); in bfloat16 and float16,
  values may instead match the op computed in float32 and rounded (Inductor rounds once
  where eager rounds after every op), as PyTorch's own Inductor tests judge them;
- ``grad`` (float32, ops with autograd): the gradients through the compiled graph
  (AOTAutograd's compiled backward) equal eager's for the same random output gradients.

Eager ``neuron`` is the oracle here (``opinfo_sweep`` compares it with CPU). A sample
that raises eagerly does not count; one that raises only when compiled is a failure.
Every sample compiles from scratch (``torch._dynamo.reset()``), with static shapes, so a
C++ compile per sample is what this costs: the sweep runs the first ``--max-samples``
samples of each op and dtype (default 3) in float32, bfloat16, int64 and bool, over
``opinfo_sweep``'s core ops (``--core``, what ``make coverage-ops-compiled`` runs) or any ops.

    python coverage/compiled_ops_sweep.py --core   # writes docs/coverage/ops_compiled.{md,json}
    python coverage/compiled_ops_sweep.py --ops add,softmax   # prints the summary only
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import torch

import opinfo_sweep as _ops
from torch_neuronx.testing._compare import compare, map_tensors, op_tolerance, tensors, to_cpu
from torch_neuronx.testing._pool import positive

from _sweep import main as sweep_main

DTYPES = (torch.float32, torch.bfloat16, torch.int64, torch.bool)
MAX_SAMPLES = 3
# fallback_random: Inductor's own random numbers differ from eager's by design; the aten ops
# draw eager's stream.
OPTIONS = {"fallback_random": True}


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="neuron", dynamic=False, options=OPTIONS)


LOW_PRECISION = (torch.bfloat16, torch.float16)


def _in_float32(op, sample, dtype):
    """The sample run eagerly with its ``dtype`` tensors in float32, results rounded back to
    ``dtype`` (on CPU), or None when that does not run."""
    def up(t):
        return t.detach().float() if t.dtype == dtype else t.detach()

    def down(t):
        return t.to(dtype) if t.dtype == torch.float32 else t

    try:
        with torch.no_grad():
            args, kwargs = map_tensors(((sample.input, *sample.args), sample.kwargs), up)
            return to_cpu(map_tensors(_ops._run(lambda: op.op(*args, **kwargs)), down))
    except Exception:  # noqa: BLE001 - no float32 reference: the plain comparison stands
        return None


def check_sample(op, sample, dtype, with_grad: bool, res, index: int, max_samples: int = MAX_SAMPLES) -> str:
    """One sample made on ``neuron``: pass / fail / eager-error / skipped (see the module doc)."""
    if index >= max_samples:
        return "skipped"
    args, kwargs = (sample.input, *sample.args), sample.kwargs
    uninit = op.name in _ops.UNINITIALIZED_OUTPUT
    with torch.set_grad_enabled(with_grad):
        try:
            expected = _ops._run(lambda: op.op(*args, **kwargs))
        except Exception:  # noqa: BLE001 - opinfo_sweep judges eager errors
            return "eager-error"
        res.checks["forward"] += 1
        try:
            actual = _ops._run(lambda: _compiled(op.op)(*args, **kwargs))
        except Exception as e:  # noqa: BLE001
            res.fail(dtype, index, "forward", f"raised when compiled only: {_ops._short(e)}", sample)
            return "fail"
    device_type = _ops._result_device_type(sample.input, sample.args, sample.kwargs)
    d = compare(actual, to_cpu(expected), tolerance=op_tolerance, values=not uninit, device_type=device_type)
    if not d.ok and dtype in LOW_PRECISION:
        # Inductor keeps intermediates in float32 and rounds once, eager rounds every op: as
        # PyTorch's Inductor tests do, judge against the op in float32, rounded to the dtype.
        reference = _in_float32(op, sample, dtype)
        if reference is not None:
            d = compare(actual, reference, tolerance=op_tolerance, values=not uninit, device_type=device_type)
    if not d.ok:
        res.fail(dtype, index, "forward", d.summary(), sample)
        return "fail"
    res.checks["forward_passed"] += 1
    if with_grad and not uninit:
        inputs = [t for t in tensors((sample.input, sample.args, sample.kwargs)) if t.requires_grad and t.is_leaf]
        if not _ops._check_grad(sample, expected, actual, inputs, inputs, dtype, res, index):
            return "fail"
    return "pass"


def check_op(key: str, dtypes: tuple[torch.dtype, ...] = DTYPES, max_samples: int = MAX_SAMPLES) -> dict:
    """The first ``max_samples`` samples of the OpInfo ``key`` in each dtype, judged by :func:`check_sample`."""
    return _ops.check_op(key, dtypes, check=functools.partial(check_sample, max_samples=max_samples))


def _check_op_item(item: tuple[str, tuple[str, ...]], max_samples: int = MAX_SAMPLES) -> dict:
    key, dtype_names = item
    return check_op(key, tuple(getattr(torch, d) for d in dtype_names), max_samples)


class CompiledOpsSweep(_ops.OpSweep):
    script = "compiled_ops_sweep"
    description = __doc__
    report = "ops_compiled"
    dtypes = DTYPES
    core_help = "only opinfo_sweep's core ops (the report's run)"
    core_is_full = True

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        super().add_arguments(p)
        p.add_argument("--max-samples", type=positive(int), default=MAX_SAMPLES,
                       help="samples per op and dtype (default %(default)s)")

    def configure(self, args: argparse.Namespace) -> CompiledOpsSweep:
        return self if args.max_samples == MAX_SAMPLES else CompiledOpsSweep(args.max_samples)

    def __init__(self, max_samples: int = MAX_SAMPLES) -> None:
        super().__init__()
        self.max_samples = max_samples

    def check(self):
        return functools.partial(_check_op_item, max_samples=self.max_samples)

    def is_subset(self, args: argparse.Namespace) -> bool:
        return super().is_subset(args) or self.max_samples != MAX_SAMPLES

    def options(self, args: argparse.Namespace) -> list[str]:
        extra = ["--max-samples", str(self.max_samples)] if self.max_samples != MAX_SAMPLES else []
        return super().options(args) + extra

    def printed(self, records: list[dict], s: dict, seconds: float, workers: int) -> list[str]:
        return [f"{s['samples_passed']} passed, {s['samples_failed']} failed "
                f"({100 * s['pass_rate']:.2f}% of {s['samples_run']} compiled samples) in {seconds:.0f} s",
                *_ops.printed_failures(s["ops"])]

    def meta(self, items: list, args: argparse.Namespace) -> dict:
        return {**super().meta(items, args), "max_samples": self.max_samples}

    def render(self, records: list[dict], summary: dict, meta: dict) -> tuple[dict, str]:
        return {"meta": meta, **summary}, markdown(summary, meta)


SWEEP = CompiledOpsSweep()


def markdown(s: dict, meta: dict) -> str:
    """The page ``ops_compiled.md``."""
    max_samples = meta["max_samples"]
    skipped = sum(c.get("skipped", 0) for c in s["dtypes"].values())
    eager_error = sum(c.get("eager-error", 0) for c in s["dtypes"].values())
    lines = [
        "# OpInfo samples compiled for `neuron`",
        "",
        f"OpInfos of PyTorch {meta['torch']}'s `op_db` ({len(s['ops'])} entries), the first {max_samples} sample "
        f"inputs of each in {', '.join(meta['dtypes'])}, compiled with `torch.compile(backend=\"neuron\")` "
        "(static shapes, a fresh compile per sample, Inductor's `fallback_random`) and compared with eager "
        "`neuron`: outputs, and gradients through the compiled backward in float32. Eager `neuron` itself is "
        "compared with CPU in `ops.md`. See `coverage/compiled_ops_sweep.py`.",
        "",
        _ops.regenerate_line(meta),
        "",
        f"**{s['samples_passed']} of {s['samples_run']} samples pass ({100 * s['pass_rate']:.2f}%)**; "
        f"{s['samples_failed']} fail; {eager_error} raised eagerly (not counted); {skipped} beyond the first "
        f"{max_samples} of an op and dtype (not run).",
        "",
        "Checks run (passed): " + ", ".join(
            f"{k} {s['checks'].get(k, 0)} ({s['checks'].get(k + '_passed', 0)})" for k in ("forward", "grad")) + ".",
        "",
        *_ops.dtype_rows(s, meta["dtypes"], cpu_error=False),
        "",
    ]
    lines += ["## Failures", "", *(_ops.failure_rows(s["ops"]) if s["samples_failed"] else ["None."]), ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return sweep_main(SWEEP, argv)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
