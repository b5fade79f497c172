"""PyTorch's OpInfo database, op by op, on ``neuron`` against CPU.

For every OpInfo in ``torch.testing._internal.common_methods_invocations.op_db`` and
each of float32, bfloat16, float16, int64 and bool that the op supports on CPU, every
sample input runs on CPU (the oracle) and on ``neuron``; a sample passes when all its
checks match:

- ``forward``: the outputs (values, dtypes, shapes, and that they live on ``neuron``);
- ``grad`` (float32, ops with autograd): gradients of every input that requires grad,
  for the same random output gradients;
- ``inplace``: the in-place variant, its return value and the mutated input;
- ``out``: the ``out=`` variant into empty outputs (so ``out=`` resizing is exercised);
- ``out_strided``: the ``out=`` variant into preallocated outputs that are not contiguous
  (every other element of a buffer), comparing the whole buffers, gaps included.

Sample inputs are made on ``neuron`` (as PyTorch's own device-generic tests make them,
so factory ops and arguments that must stay on the CPU are exercised as users meet
them) and copied to CPU for the oracle with their exact layout (storage size, offset,
strides, and storage shared between arguments), so views and non-contiguous inputs
are compared as they are. Random ops are compared exactly: every run is seeded
and ``neuron`` generators draw the CPU stream. A sample that raises on CPU does not
count; one that raises only on ``neuron`` is a failure.

A bf16/fp16 forward result that differs from CPU's beyond the tolerance is judged against the
op in float64 (``compare_with_float64``): neuron's 16-bit matrix products and convolutions
accumulate in fp32 and round once, where some CPU kernels round partial results (e.g.
conv_transpose's column sums), so the device may differ from CPU by being more accurate.

    python coverage/opinfo_sweep.py                 # all ops, writes docs/coverage/ops.{md,json}
    python coverage/opinfo_sweep.py --ops add,mm,sum   # a subset: prints the summary only
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import warnings
from collections import Counter
from typing import Any

import torch

from torch_neuronx.testing._compare import (
    CPUCopy, UnsupportedLayout, compare, compare_with_float64, map_tensors, op_tolerance, tensors, to_cpu,
)  # fmt: skip
from torch_neuronx.testing._pool import default_workers

from _sweep import Sweep
from _sweep import main as sweep_main

# The dtypes most models use; `make test`'s core-op subset runs these.
CORE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool)
# The full sweep adds the rest of what users put on a device.
DTYPES = CORE_DTYPES + (torch.float64, torch.complex64, torch.int32, torch.int16, torch.int8, torch.uint8)
GRAD_DTYPES = (torch.float32, torch.float64, torch.complex64)  # of those swept
SEED = 1234
MAX_FAILURES_KEPT = 5  # per op, in the report; the counts are always complete

# Outputs whose values are unspecified (uninitialized memory): only metadata is compared.
UNINITIALIZED_OUTPUT = {
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted",
    "torch.empty_permuted", "nn.functional.dropout", "nn.functional.feature_alpha_dropout",
}  # fmt: skip

# The core ops `make test` checks (the full database is `make coverage-ops`).
CORE_OPS = (
    "add", "sub", "mul", "div", "neg", "abs", "exp", "log", "sqrt", "rsqrt", "pow", "tanh", "sigmoid",
    "nn.functional.silu", "nn.functional.gelu", "nn.functional.relu", "where", "clamp", "masked_fill",
    "eq", "ne", "lt", "gt", "ge", "le", "logical_not", "bitwise_and", "maximum", "minimum", "addcmul",
    "addcdiv", "lerp", "triu", "tril", "cumsum", "sum", "mean", "amax", "amin", "argmax", "max", "min",
    "var", "std", "prod", "all", "any", "linalg.vector_norm", "logsumexp", "topk", "sort", "softmax",
    "log_softmax", "nn.functional.layer_norm", "nn.functional.rms_norm", "nn.functional.embedding",
    "index_select", "gather", "scatter", "scatter_add", "index_put", "index_add", "nonzero", "cat",
    "stack", "mm", "bmm", "addmm", "baddbmm", "matmul", "nn.functional.linear",
    "nn.functional.scaled_dot_product_attention", "nn.functional.cross_entropy", "nn.functional.mse_loss",
    "transpose", "permute", "view", "reshape", "expand", "narrow", "select", "unsqueeze", "squeeze",
    "contiguous", "clone", "full", "zeros", "ones", "arange", "normal", "uniform", "bernoulli",
    "multinomial", "nn.functional.dropout", "to", "fill", "zero_", "repeat", "flip", "roll", "chunk",
    "split", "rsub", "reciprocal", "cos", "sin", "erf", "log1p", "expm1", "isnan", "equal", "addr",
    "nn.functional.conv2d", "nn.functional.conv_transpose2d", "mode",
)  # fmt: skip

_NEURON = torch.device("neuron", 0)


def _op_db():
    from torch.testing._internal.common_methods_invocations import op_db

    return op_db


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def op_key(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def all_op_keys() -> list[str]:
    return [op_key(op) for op in _op_db()]


def select_op_keys(names) -> list[str]:
    """Keys of the OpInfos named in ``names``: an op name selects all its variants
    (``linalg.norm`` also selects ``linalg.norm.subgradients_at_zero``); a full key only itself."""
    names = set(names)
    return [op_key(op) for op in _op_db() if op.name in names or op_key(op) in names]


def has_swept_dtype(key: str) -> bool:
    """True when the op supports at least one of CORE_DTYPES on CPU (``silu.complex`` does not)."""
    supported = _find_op(key).supported_dtypes("cpu")
    return any(d in supported for d in CORE_DTYPES)


_OPS_BY_KEY: dict[str, Any] = {}


def _index_ops() -> None:
    # Also each worker's initializer: importing op_db takes seconds, which must not count
    # against the first op's timeout.
    if not _OPS_BY_KEY:
        _OPS_BY_KEY.update((op_key(op), op) for op in _op_db())


def _find_op(key: str):
    _index_ops()
    try:
        return _OPS_BY_KEY[key]
    except KeyError:
        raise KeyError(f"no OpInfo named {key!r}; names are op.name or op.name.variant_test_name") from None


def _detached(obj: Any) -> Any:
    """Inputs for the in-place and out= runs, cut from the autograd graph of the forward run."""
    return map_tensors(obj, lambda t: t.detach().clone() if t.requires_grad else t)


def _empty_out(result: Any, device) -> Any:
    """Empty tensors to pass as ``out=``: matching dtypes, size 0 so the op must resize."""
    if isinstance(result, torch.Tensor):
        return torch.empty(0, dtype=result.dtype, device=device)
    if isinstance(result, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in result):
        return tuple(torch.empty(0, dtype=t.dtype, device=device) for t in result)
    return None


def _strided_out(result: Any, device) -> tuple[Any, list[torch.Tensor]] | None:
    """Preallocated ``out=`` tensors of the right shape that are not contiguous: every other
    element of a zero-filled buffer, so the op must write through the strides and leave the
    gaps alone. Returns (outs, their buffers)."""
    def one(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        buf = torch.zeros(2 * max(t.numel(), 1), dtype=t.dtype, device=device)
        strides, step = [], 2
        for size in reversed(t.shape):
            strides.append(step)
            step *= max(size, 1)
        return buf.as_strided(t.shape, tuple(reversed(strides))), buf

    if isinstance(result, torch.Tensor):
        out, buf = one(result)
        return out, [buf]
    if isinstance(result, (list, tuple)) and result and all(isinstance(t, torch.Tensor) for t in result):
        pairs = [one(t) for t in result]
        return tuple(o for o, _ in pairs), [b for _, b in pairs]
    return None


# ---- one op ----------------------------------------------------------------------


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def _run(fn, seed: int = SEED):
    torch.manual_seed(seed)
    return fn()


class _Result:
    def __init__(self, key: str) -> None:
        self.key = key
        self.counts: dict[str, Counter] = {}
        self.failures: list[dict] = []
        self.checks: Counter = Counter()  # per check kind: run / passed
        self.reasons: Counter = Counter()  # why samples did not pass, by class (sweeps that classify)

    def record(self, dtype: torch.dtype, outcome: str) -> None:
        self.counts.setdefault(dtype_name(dtype), Counter())[outcome] += 1

    def fail(self, dtype, index: int, check: str, message: str, sample) -> None:
        if len(self.failures) < MAX_FAILURES_KEPT:
            summary = ""
            try:
                summary = sample.summary()
            except Exception:  # noqa: BLE001 - a summary is a courtesy
                pass
            self.failures.append(
                {"dtype": dtype_name(dtype), "sample": index, "check": check,
                 "message": message[:500], "input": summary[:300]}
            )  # fmt: skip

    def as_dict(self, seconds: float) -> dict:
        return {"op": self.key, "counts": {k: dict(v) for k, v in self.counts.items()},
                "checks": dict(self.checks), "failures": self.failures, "reasons": dict(self.reasons),
                "seconds": round(seconds, 2)}  # fmt: skip


def _check_sample(op, sample, dtype, with_grad: bool, res: _Result, index: int) -> str:
    """Runs every applicable check of one sample (made on ``neuron``; the oracle runs on
    an exact CPU copy). Returns pass / fail / cpu-error / unsupported."""
    uninit = op.name in UNINITIALIZED_OUTPUT
    n_input, n_args, n_kwargs = sample.input, sample.args, sample.kwargs
    to_c = CPUCopy()
    try:
        c_input, c_args, c_kwargs = to_c(n_input), to_c(n_args), to_c(n_kwargs)
    except UnsupportedLayout:
        return "unsupported"

    # forward (+ grad)
    with torch.set_grad_enabled(with_grad):
        try:
            expected = _run(lambda: op(c_input, *c_args, **c_kwargs))
        except Exception:  # noqa: BLE001 - invalid sample for CPU: not counted
            return "cpu-error"
        res.checks["forward"] += 1
        try:
            actual = _run(lambda: op(n_input, *n_args, **n_kwargs))
        except NotImplementedError as e:
            # Sparse/quantized results are not supported on the device by design; that
            # must be said with a clear error, which then does not count.
            if _non_strided(expected):
                return "unsupported"
            res.fail(dtype, index, "forward", f"raised on neuron only: {_short(e)}", sample)
            return "fail"
        except Exception as e:  # noqa: BLE001
            res.fail(dtype, index, "forward", f"raised on neuron only: {_short(e)}", sample)
            return "fail"
    # values of uninitialized outputs are unspecified; shapes, dtypes and devices still count
    device_type = _result_device_type(n_input, n_args, n_kwargs)
    d = compare(actual, expected, tolerance=op_tolerance, values=not uninit, device_type=device_type)
    if not d.ok and not uninit and dtype in (torch.bfloat16, torch.float16):
        d = _as_accurate_as_cpu(op, (c_input, c_args, c_kwargs), dtype, actual, expected, res)
    if not d.ok:
        res.fail(dtype, index, "forward", d.summary(), sample)
        return "fail"
    res.checks["forward_passed"] += 1
    ok = True

    if with_grad and not uninit:
        # A view whose base requires grad (``window.real[:8]`` in istft's samples) keeps an
        # autograd relation to that base which its CPU copy, a fresh leaf, does not have;
        # gradients are compared for the other inputs.
        pairs = [(n, c) for n, c in zip(tensors((n_input, n_args, n_kwargs)), tensors((c_input, c_args, c_kwargs)))
                 if n.requires_grad and not (n._is_view() and n._base is not None and n._base.requires_grad)]
        n_inputs, c_inputs = [n for n, _ in pairs], [c for _, c in pairs]
        ok &= _check_grad(sample, expected, actual, c_inputs, n_inputs, dtype, res, index)

    if op.inplace_variant is not None and not uninit:
        ok &= _check_variant("inplace", op, sample, dtype, res, index)
    if op.supports_out and not uninit:
        # the forward's CPU result gives the out= tensors their shapes and dtypes
        ok &= _check_variant("out", op, sample, dtype, res, index, expected)
        ok &= _check_variant("out_strided", op, sample, dtype, res, index, expected)
    return "pass" if ok else "fail"


def _devices_named(obj: Any, tensors_too: bool = True) -> set[str]:
    """Device types named in ``obj``: by device arguments, and by tensors unless ``tensors_too`` is False."""
    if isinstance(obj, torch.Tensor):
        return {obj.device.type} if tensors_too else set()
    if isinstance(obj, (list, tuple)):
        return set().union(*(_devices_named(v, tensors_too) for v in obj)) if obj else set()
    if isinstance(obj, dict):
        return set().union(*(_devices_named(v, tensors_too) for v in obj.values())) if obj else set()
    if isinstance(obj, torch.device):
        return {obj.type}
    if isinstance(obj, str) and obj.split(":")[0] in ("cpu", "neuron"):
        return {obj.split(":")[0]}
    return set()


def _result_device_type(n_input, n_args, n_kwargs) -> str:
    """Where tensor results must be: on CPU when the sample asks for it
    (``empty_like(x, device="cpu")``, ``x.to("cpu")``) or does not involve the device at
    all (a factory call without a device argument); on ``neuron`` otherwise."""
    asks_for_cpu = "cpu" in _devices_named((n_args, n_kwargs), tensors_too=False)
    if asks_for_cpu or "neuron" not in _devices_named((n_input, n_args, n_kwargs)):
        return "cpu"
    return "neuron"


def _non_strided(obj: Any) -> bool:
    return any(t.layout != torch.strided or t.is_quantized for t in tensors(obj))


def _check_grad(sample, expected, actual, c_inputs, n_inputs, dtype, res, index) -> bool:
    c_outs = [t for t in tensors(sample.output_process_fn_grad(expected)) if t.requires_grad]
    n_outs = [t for t in tensors(sample.output_process_fn_grad(actual)) if t.requires_grad]
    if not c_inputs or not c_outs:
        return True
    if len(c_outs) != len(n_outs) or len(c_inputs) != len(n_inputs):
        res.checks["grad"] += 1
        res.fail(dtype, index, "grad", f"{len(n_outs)} differentiable outputs on neuron, {len(c_outs)} on CPU", sample)
        return False
    g = torch.Generator().manual_seed(SEED)
    grads_out = [torch.randn(t.shape, generator=g, dtype=t.dtype) if t.is_floating_point() else None for t in c_outs]
    try:  # the oracle's outputs are on CPU, or on neuron when compiled code is judged against eager
        expected_g = torch.autograd.grad(
            c_outs, c_inputs, [None if x is None else x.to(t.device) for x, t in zip(grads_out, c_outs)],
            allow_unused=True)
    except Exception:  # noqa: BLE001 - no backward on CPU for this sample
        return True
    res.checks["grad"] += 1
    try:
        actual_g = torch.autograd.grad(
            n_outs, n_inputs, [None if x is None else x.to(_NEURON) for x in grads_out], allow_unused=True
        )
    except Exception as e:  # noqa: BLE001
        res.fail(dtype, index, "grad", f"backward raised on neuron only: {_short(e)}", sample)
        return False
    d = compare(list(actual_g), to_cpu(list(expected_g)), tolerance=op_tolerance)
    if not d.ok:
        res.fail(dtype, index, "grad", d.summary(), sample)
        return False
    res.checks["grad_passed"] += 1
    return True


def _as_accurate_as_cpu(op, cpu_args, dtype, actual, expected, res: _Result):
    """Judges a 16-bit result that differs from CPU's against the op in float64 on the same
    (exactly widened) inputs: it passes when it is as accurate as CPU's."""
    wide = map_tensors(cpu_args, lambda t: t.detach().double() if t.dtype == dtype else t.detach())
    try:
        with torch.no_grad():
            reference = _run(lambda: op(wide[0], *wide[1], **wide[2]))
    except Exception as e:  # noqa: BLE001 - no float64 kernel: the difference stands
        d = compare(actual, expected, tolerance=op_tolerance)
        d.message += f" (no float64 reference: {_short(e)})"
        return d
    d = compare_with_float64(actual, expected, reference)
    if d.ok:
        res.checks["forward_float64_arbitrated"] += 1
    return d


def _check_variant(kind: str, op, sample, dtype, res, index, expected: Any = None) -> bool:
    with torch.no_grad():
        n_input, n_args, n_kwargs = _detached(sample.input), _detached(sample.args), _detached(sample.kwargs)
        if kind == "inplace":
            n_input = n_input.clone() if isinstance(n_input, torch.Tensor) else n_input
            fn = op.inplace_variant
        else:
            fn = op.op
        to_c = CPUCopy()
        c_input, c_args, c_kwargs = to_c(n_input), to_c(n_args), to_c(n_kwargs)
        c_bufs: list[torch.Tensor] = []
        n_bufs: list[torch.Tensor] = []
        if kind in ("out", "out_strided"):
            if _empty_out(expected, "cpu") is None:
                return True  # no tensor results to pass as out=
            if kind == "out":
                c_out, n_out = _empty_out(expected, "cpu"), _empty_out(expected, _NEURON)
            else:
                (c_out, c_bufs), (n_out, n_bufs) = _strided_out(expected, "cpu"), _strided_out(expected, _NEURON)
            c_kwargs, n_kwargs = dict(c_kwargs, out=c_out), dict(n_kwargs, out=n_out)
        try:
            c_ret = _run(lambda: fn(c_input, *c_args, **c_kwargs))
        except Exception:  # noqa: BLE001 - e.g. an in-place op that would change the dtype
            return True
        res.checks[kind] += 1
        try:
            n_ret = _run(lambda: fn(n_input, *n_args, **n_kwargs))
        except Exception as e:  # noqa: BLE001
            res.fail(dtype, index, kind, f"raised on neuron only: {_short(e)}", sample)
            return False
        mutated_c = c_input if kind == "inplace" else c_kwargs["out"]
        mutated_n = n_input if kind == "inplace" else n_kwargs["out"]
        device_type = _result_device_type(n_input, n_args, n_kwargs)
        # the whole buffers behind strided outs too: nothing may be written into the gaps
        d = compare([n_ret, mutated_n, n_bufs], [c_ret, mutated_c, c_bufs], tolerance=op_tolerance,
                    device_type=device_type)
        if d.ok and kind == "inplace" and isinstance(n_ret, torch.Tensor) and n_ret is not n_input:
            d.ok, d.message = False, "in-place variant did not return its input"
        if not d.ok:
            res.fail(dtype, index, kind, d.summary(), sample)
            return False
        res.checks[f"{kind}_passed"] += 1
        return True


def check_op(key: str, dtypes: tuple[torch.dtype, ...] = DTYPES, check=None) -> dict:
    """Runs every sample of the OpInfo ``key`` in each supported dtype; returns counts
    per dtype (pass / fail / cpu-error / unsupported), checks run, and the first failures.
    ``check(op, sample, dtype, with_grad, result, index) -> outcome`` judges one sample made
    on ``neuron`` (default: against CPU; the fake-tensor sweep passes its own)."""
    check = check or _check_sample
    warnings.simplefilter("ignore")
    start = time.perf_counter()
    op = _find_op(key)
    res = _Result(key)
    supported = op.supported_dtypes("cpu")
    for dtype in dtypes:
        if dtype not in supported:
            continue
        with_grad = dtype in GRAD_DTYPES and op.supports_autograd and dtype in op.supported_backward_dtypes("cpu")
        torch.manual_seed(SEED)
        try:
            samples = list(op.sample_inputs("neuron", dtype, requires_grad=with_grad))
        except Exception as e:  # noqa: BLE001 - making the inputs on the device failed
            try:
                cpu_samples = list(op.sample_inputs("cpu", dtype, requires_grad=with_grad))
            except Exception:  # noqa: BLE001 - fails on CPU too: not the device's doing
                res.record(dtype, "cpu-error")
                continue
            if isinstance(e, NotImplementedError) and any(
                _non_strided((x.input, x.args, x.kwargs)) for x in cpu_samples
            ):  # the samples are sparse/quantized: unsupported by design, and said so clearly
                for _ in cpu_samples:
                    res.record(dtype, "unsupported")
                continue
            res.record(dtype, "fail")
            res.fail(dtype, -1, "samples", f"making sample inputs on neuron failed: {_short(e)}", None)
            continue
        for i, sample in enumerate(samples):
            try:
                outcome = check(op, sample, dtype, with_grad, res, i)
            except Exception as e:  # noqa: BLE001 - a bug in the sweep must show, not pass
                res.fail(dtype, i, "sweep", f"{_short(e)}", sample)
                outcome = "fail"
            res.record(dtype, outcome)
    return res.as_dict(time.perf_counter() - start)


def _check_op_item(item: tuple[str, tuple[str, ...]]) -> dict:
    key, dtype_names = item
    return check_op(key, tuple(getattr(torch, d) for d in dtype_names))


# ---- report ----------------------------------------------------------------------


def summarize(results: list[dict]) -> dict:
    total = Counter()
    checks = Counter()
    per_dtype: dict[str, Counter] = {}
    per_op = []
    for r in results:
        checks.update(r.get("checks", {}))
        for dt, v in r.get("counts", {}).items():
            per_dtype.setdefault(dt, Counter()).update(v)
        c = Counter()
        for v in r.get("counts", {}).values():
            c.update(v)
        if r.get("status") in ("crash", "timeout"):
            c["fail"] += max(1, c["fail"])  # never counted as passing
        total.update(c)
        ran = c["pass"] + c["fail"]
        per_op.append({"op": r["op"], "pass": c["pass"], "fail": c["fail"], "cpu-error": c["cpu-error"],
                       "unsupported": c["unsupported"], "rate": (c["pass"] / ran) if ran else None,
                       "status": r.get("status", "ok"), "failures": r.get("failures", []),
                       "counts": r.get("counts", {}), "checks": r.get("checks", {}),
                       "error": r.get("error", ""), "seconds": r.get("seconds", 0.0)})  # fmt: skip
    ran = total["pass"] + total["fail"]
    return {"samples_run": ran, "samples_passed": total["pass"], "samples_failed": total["fail"],
            "samples_cpu_error": total["cpu-error"], "samples_unsupported": total["unsupported"],
            "pass_rate": (total["pass"] / ran) if ran else 0.0, "checks": dict(sorted(checks.items())),
            "dtypes": {dt: dict(c) for dt, c in per_dtype.items()},
            "ops": per_op}  # fmt: skip


class OpSweep(Sweep):
    """What the sweeps over OpInfo samples share: ``--ops`` / ``--core`` / ``--dtypes``, one item
    per op (its key and the dtype names), one record per op (``check_op``'s result, or the
    op's crash or timeout)."""

    unit = "op"
    dtypes = DTYPES  # the default of --dtypes
    core_help = "only the core ops that `make test` checks"
    core_is_full = False  # whether --core is the run the report is made from

    def __init__(self) -> None:
        self.default_workers = default_workers()

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--ops", help="comma-separated OpInfo names (default: all of op_db)")
        p.add_argument("--core", action="store_true", help=self.core_help)
        p.add_argument("--dtypes", default=",".join(dtype_name(d) for d in self.dtypes),
                       help="comma-separated dtypes (default: %(default)s)")

    def chosen_dtypes(self, args: argparse.Namespace) -> tuple[torch.dtype, ...] | None:
        """The dtypes of ``--dtypes``, None when it names something else."""
        try:
            dtypes = tuple(getattr(torch, d.strip()) for d in args.dtypes.split(",") if d.strip())
        except AttributeError:
            return None
        return dtypes if dtypes and all(isinstance(d, torch.dtype) for d in dtypes) else None

    def select(self, p: argparse.ArgumentParser, args: argparse.Namespace) -> list[tuple[str, tuple[str, ...]]]:
        dtypes = self.chosen_dtypes(args)
        if dtypes is None:
            p.error(f"--dtypes: not a list of torch dtypes: {args.dtypes!r}")
        keys = all_op_keys()
        if args.ops:
            wanted = [k.strip() for k in args.ops.split(",") if k.strip()]
            unknown = [k for k in wanted if not select_op_keys([k])]
            if unknown:
                p.error(f"unknown OpInfo name(s): {', '.join(unknown)}")
            keys = select_op_keys(wanted)
        elif args.core:
            keys = select_op_keys(CORE_OPS)
        names = tuple(dtype_name(d) for d in dtypes)
        return [(k, names) for k in keys]

    def is_subset(self, args: argparse.Namespace) -> bool:
        return bool(args.ops) or args.core != self.core_is_full or self.chosen_dtypes(args) != self.dtypes

    def options(self, args: argparse.Namespace) -> list[str]:
        out = ["--ops", args.ops] if args.ops else ["--core"] if args.core else []
        return out + (["--dtypes", args.dtypes] if self.chosen_dtypes(args) != self.dtypes else [])

    def check(self):
        return _check_op_item

    def initializer(self) -> None:
        _index_ops()

    def record(self, o) -> dict:
        if o.kind == "ok":
            return dict(o.value, status="ok")
        return {"op": o.item[0], "status": o.kind, "error": o.error.strip().splitlines()[0] if o.error else o.kind,
                "counts": {}, "failures": [], "seconds": round(o.seconds, 2)}  # fmt: skip

    def label(self, record: dict) -> str:
        return record["op"]

    def summarize(self, records: list[dict]) -> dict:
        return summarize(records)

    def failed(self, summary: dict) -> bool:
        return summary["samples_failed"] > 0

    def printed(self, records: list[dict], summary: dict, seconds: float, workers: int) -> list[str]:
        return [f"{summary['samples_passed']} passed, {summary['samples_failed']} failed "
                f"({100 * summary['pass_rate']:.2f}% of {summary['samples_run']} samples; "
                f"{summary['samples_cpu_error']} raised on CPU) in {seconds:.0f} s", *printed_failures(summary["ops"])]

    def meta(self, items: list, args: argparse.Namespace) -> dict:
        return {"torch": torch.__version__, "dtypes": list(items[0][1]) if items else [],
                "python": platform.python_version()}


class OpInfoSweep(OpSweep):
    script = "opinfo_sweep"
    description = __doc__
    report = "ops"

    def render(self, records: list[dict], summary: dict, meta: dict) -> tuple[dict, str]:
        return {"meta": meta, **summary}, markdown(summary, meta)


def markdown(summary: dict, meta: dict) -> str:
    """The page ``ops.md``."""
    ops = summary["ops"]
    failing = [o for o in ops if o["fail"]]
    lines = [
        "# OpInfo coverage of the `neuron` device",
        "",
        f"Every OpInfo of PyTorch {meta['torch']}'s `op_db` ({len(ops)} entries), every sample input, in "
        f"{', '.join(meta['dtypes'])} where the op supports the dtype on CPU: outputs compared with CPU, plus "
        f"gradients ({', '.join(d for d in meta['dtypes'] if getattr(torch, d) in GRAD_DTYPES)}), the in-place "
        "variant and the `out=` variant (into empty outputs, and into preallocated non-contiguous outputs whose "
        "whole buffers are compared). "
        "A sample passes when all its checks match. Samples that raise on CPU are not counted; "
        "crashes and timeouts count as failures.",
        "",
        regenerate_line(meta),
        "",
        f"**{summary['samples_passed']} of {summary['samples_run']} samples pass "
        f"({100 * summary['pass_rate']:.2f}%)**; {summary['samples_failed']} fail; "
        f"{summary['samples_cpu_error']} raised on CPU (not counted); "
        f"{summary['samples_unsupported']} use layouts the device does not support (sparse/quantized, not counted).",
        "",
        "Checks run (passed): " + ", ".join(
            f"{kind} {summary['checks'].get(kind, 0)} ({summary['checks'].get(kind + '_passed', 0)})"
            for kind in ("forward", "grad", "inplace", "out", "out_strided")) + ".",
        "",
        *dtype_rows(summary, meta["dtypes"]),
        "",
    ]
    if failing:
        lines += ["## Failures", "", *failure_rows(ops), ""]
    from cuda_only_ops import markdown as cuda_only_markdown

    lines += [cuda_only_markdown(), ""]  # what neuron does for the ops no OpInfo sample can reach on CPU
    lines += ["## Per op", "", "| op | samples passed | rate | cpu-error | seconds |", "|---|---:|---:|---:|---:|"]
    for o in ops:
        rate = "—" if o["rate"] is None else f"{100 * o['rate']:.0f}%"
        lines.append(f"| `{o['op']}` | {o['pass']} of {o['pass'] + o['fail']} | {rate} | {o['cpu-error']} | "
                     f"{o['seconds']:.1f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def regenerate_line(meta: dict) -> str:
    """The report line that names the command and what the run took."""
    return (f"Regenerate: `{meta['command']}` ({meta['wall_seconds'] / 60:.1f} min with {meta['workers']} workers "
            f"on {meta['date']}).")


SWEEP = OpInfoSweep()


def first_failure(o: dict) -> dict:
    """The first kept failure of a summarized op, or its crash/timeout as one."""
    return o["failures"][0] if o["failures"] else {"check": o["status"], "dtype": "", "message": o["error"]}


def failure_rows(ops: list[dict]) -> list[str]:
    """The report's markdown table of the ops with failing samples, most failures first."""
    lines = ["| op | failed | first failure |", "|---|---:|---|"]
    for o in sorted((o for o in ops if o["fail"]), key=lambda o: -o["fail"]):
        first = first_failure(o)
        msg = f"{first['check']} {first['dtype']}: {first['message']}".replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{o['op']}` | {o['fail']} of {o['pass'] + o['fail']} | {msg[:240]} |")
    return lines


def printed_failures(ops: list[dict]) -> list[str]:
    """One printed line per op with failing samples."""
    out = []
    for o in ops:
        if o["fail"]:
            first = first_failure(o)
            out.append(f"  FAIL {o['op']}: {o['fail']} samples; {first['check']} {first['dtype']}: "
                       f"{first['message'][:200]}")
    return out


def dtype_rows(summary: dict, dtype_names: list[str], cpu_error: bool = True) -> list[str]:
    """The report's markdown table of samples passed per dtype."""
    lines = ["| dtype | samples passed | rate |" + (" raised on CPU |" if cpu_error else ""),
             "|---|---:|---:|" + ("---:|" if cpu_error else "")]
    for dt in dtype_names:
        c = summary["dtypes"].get(dt, {})
        ran = c.get("pass", 0) + c.get("fail", 0)
        rate = f"{100 * c.get('pass', 0) / ran:.2f}%" if ran else "—"
        lines.append(f"| {dt} | {c.get('pass', 0)} of {ran} | {rate} |" + (f" {c.get('cpu-error', 0)} |" if cpu_error
                                                                              else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    return sweep_main(SWEEP, argv)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
