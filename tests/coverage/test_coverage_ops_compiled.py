"""OpInfo samples compiled for neuron against eager neuron (`make coverage-ops-compiled` runs the
broad subset): a fast set of ops models compile, forward and float32 gradients, and the sweep's
checker failing when compiled code is wrong."""

from __future__ import annotations

import json

import pytest
import torch
from torch.testing._internal.common_dtype import floating_types
from torch.testing._internal.opinfo.core import OpInfo, SampleInput

import compiled_ops_sweep  # coverage/ (on sys.path by conftest.py)
import opinfo_sweep

# Elementwise, reductions, normalisation, matmul, indexing, attention, loss, a random op.
FAST_OPS = (
    "add", "mul", "where", "sum", "amax", "softmax", "nn.functional.layer_norm", "nn.functional.rms_norm",
    "nn.functional.silu", "mm", "nn.functional.embedding", "gather", "index_put", "cumsum",
    "nn.functional.scaled_dot_product_attention", "nn.functional.cross_entropy", "nn.functional.dropout",
)  # fmt: skip
DTYPES = (torch.float32, torch.bfloat16)
FAST_KEYS = [k for k in opinfo_sweep.select_op_keys(FAST_OPS)
             if any(d in opinfo_sweep._find_op(k).supported_dtypes("cpu") for d in DTYPES)]


@pytest.mark.parametrize("key", FAST_KEYS)
def test_compiled_op_matches_eager(key):
    r = compiled_ops_sweep.check_op(key, DTYPES, max_samples=2)
    passed = sum(c.get("pass", 0) for c in r["counts"].values())
    failed = sum(c.get("fail", 0) for c in r["counts"].values())
    assert failed == 0, f"{key}: {failed} compiled samples differ from eager, e.g. {r['failures'][:2]}"
    assert passed > 0, f"{key}: no sample ran compiled ({r['counts']})"
    assert r["checks"].get("forward_passed", 0) == passed


def test_gradients_are_checked():
    r = compiled_ops_sweep.check_op("mul", (torch.float32,), max_samples=2)
    assert r["checks"].get("grad", 0) >= 2 and r["checks"]["grad"] == r["checks"]["grad_passed"], r


def _samples(op, device, dtype, requires_grad, **kw):
    for shape in ((3, 5), (4, 2)):
        yield SampleInput(torch.randn(*shape, dtype=dtype, device=device, requires_grad=requires_grad))


class _DoubleGradWhenCompiled(torch.autograd.Function):
    """x * 3 with a backward that is wrong only when traced (as AOTAutograd does when compiling)."""

    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * (6 if torch.compiler.is_compiling() or _tracing() else 3)


def _tracing() -> bool:
    from torch._guards import TracingContext

    return TracingContext.try_get() is not None


@pytest.mark.parametrize("fn,check,message", [
    # wrong forward only when compiled
    (lambda x: x * 2 + (1.0 if torch.compiler.is_compiling() else 0.0), "forward", "differ"),
    (lambda x: _DoubleGradWhenCompiled.apply(x), "grad", "differ"),
])  # fmt: skip
def test_sweep_detects_wrong_compiled_code(monkeypatch, fn, check, message):
    opinfo_sweep._find_op("add")  # fill the lookup table first
    fake = OpInfo("fake_compiled", op=fn, dtypes=floating_types(), sample_inputs_func=_samples)
    monkeypatch.setitem(opinfo_sweep._OPS_BY_KEY, "fake_compiled", fake)
    r = compiled_ops_sweep.check_op("fake_compiled", (torch.float32,))
    assert r["counts"]["float32"].get("fail", 0) == 2, r
    assert r["failures"][0]["check"] == check and message in r["failures"][0]["message"], r["failures"]


def test_low_precision_is_judged_against_float32_too(monkeypatch):
    # bfloat16 may match the op in float32 rounded once instead of eager; a wrong result matches neither.
    opinfo_sweep._find_op("add")
    wrong = OpInfo("fake_bf16", op=lambda x: x * 2 + (0.5 if torch.compiler.is_compiling() else 0.0),
                   dtypes=floating_types() + (torch.bfloat16,), sample_inputs_func=_samples)
    monkeypatch.setitem(opinfo_sweep._OPS_BY_KEY, "fake_bf16", wrong)
    r = compiled_ops_sweep.check_op("fake_bf16", (torch.bfloat16,))
    assert r["counts"]["bfloat16"].get("fail", 0) == 2, r
    r = compiled_ops_sweep.check_op("log_softmax", (torch.bfloat16,))
    assert r["counts"]["bfloat16"].get("fail", 0) == 0, r["failures"]


def test_a_compile_error_is_a_failure(monkeypatch):
    def broken(fn):
        def run(*args, **kwargs):
            raise RuntimeError("compiler exploded")
        return run

    monkeypatch.setattr(compiled_ops_sweep, "_compiled", broken)
    r = compiled_ops_sweep.check_op("mul", (torch.float32,), max_samples=2)
    assert r["counts"]["float32"].get("fail", 0) == 2, r
    assert "raised when compiled only: RuntimeError: compiler exploded" in r["failures"][0]["message"]


def test_max_samples_and_report(tmp_path):
    r = compiled_ops_sweep.check_op("mul", (torch.float32,), max_samples=1)
    assert r["counts"]["float32"]["pass"] == 1 and r["counts"]["float32"].get("skipped", 0) >= 1, r
    meta = {"torch": "t", "dtypes": ["float32"], "python": "3", "max_samples": 1, "date": "2000-01-01",
            "command": "cmd", "workers": 1, "timeout": 1.0, "wall_seconds": 1.0}
    md, js = compiled_ops_sweep.SWEEP.write([dict(r, status="ok")], tmp_path, meta)
    text = md.read_text()
    assert json.loads(js.read_text())["meta"] == meta
    assert "**1 of 1 samples pass (100.00%)**" in text and "## Failures\n\nNone." in text
