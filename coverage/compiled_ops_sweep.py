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
    python coverage/compiled_ops_sweep.py --ops add,softmax --no-write
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

import opinfo_sweep as _ops
from torch_neuronx.testing._compare import compare, map_tensors, op_tolerance, tensors, to_cpu
from torch_neuronx.testing._pool import positive

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


def run_sweep(keys: list[str], workers: int, timeout: float, dtypes: tuple[torch.dtype, ...] = DTYPES,
              max_samples: int = MAX_SAMPLES, progress: bool = True) -> list[dict]:
    return _ops.run_sweep(keys, workers, timeout, progress, dtypes,
                          item_fn=functools.partial(_check_op_item, max_samples=max_samples),
                          desc="compiled OpInfo sweep")


def write_report(summary: dict, out_dir: Path, command: str, seconds: float, workers: int,
                 dtypes: tuple[torch.dtype, ...], max_samples: int) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "date": datetime.date.today().isoformat(), "command": command,
            "dtypes": [_ops.dtype_name(d) for d in dtypes], "max_samples": max_samples,
            "wall_seconds": round(seconds, 1), "workers": workers, "python": platform.python_version()}
    (out_dir / "ops_compiled.json").write_text(json.dumps({"meta": meta, **summary}, indent=1) + "\n")
    s = summary
    skipped = sum(c.get("skipped", 0) for c in s["dtypes"].values())
    eager_error = sum(c.get("eager-error", 0) for c in s["dtypes"].values())
    lines = [
        "# OpInfo samples compiled for `neuron`",
        "",
        f"OpInfos of PyTorch {torch.__version__}'s `op_db` ({len(s['ops'])} entries), the first {max_samples} sample "
        f"inputs of each in {', '.join(meta['dtypes'])}, compiled with `torch.compile(backend=\"neuron\")` "
        "(static shapes, a fresh compile per sample, Inductor's `fallback_random`) and compared with eager "
        "`neuron`: outputs, and gradients through the compiled backward in float32. Eager `neuron` itself is "
        "compared with CPU in `ops.md`. See `coverage/compiled_ops_sweep.py`.",
        "",
        f"Regenerate: `{command}` ({seconds / 60:.1f} min with {workers} workers on {meta['date']}).",
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
    (out_dir / "ops_compiled.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _ops.add_sweep_args(p, core_help="only opinfo_sweep's core ops", dtypes=DTYPES)
    p.add_argument("--max-samples", type=positive(int), default=MAX_SAMPLES,
                   help="samples per op and dtype (default %(default)s)")
    args = p.parse_args(argv)
    keys, dtypes = _ops.selected_ops(p, args)
    start = time.perf_counter()
    results = run_sweep(keys, args.workers, args.timeout, dtypes, args.max_samples)
    seconds = time.perf_counter() - start
    s = _ops.summarize(results)
    print(f"{s['samples_passed']} passed, {s['samples_failed']} failed "
          f"({100 * s['pass_rate']:.2f}% of {s['samples_run']} compiled samples) in {seconds:.0f} s")
    _ops.print_failures(s["ops"])
    if not args.no_write:
        cmd = _ops.regenerate_command("compiled_ops_sweep", args, DTYPES)
        if args.max_samples != MAX_SAMPLES:
            cmd += f" --max-samples {args.max_samples}"
        write_report(s, Path(args.out_dir), cmd, seconds, args.workers, dtypes, args.max_samples)
    return 0 if s["samples_failed"] == 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
