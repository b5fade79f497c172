"""PyTorch's OpInfo samples for the core ops, on neuron against CPU (the full database, in more
dtypes, is `make coverage-ops`). Each op runs every sample in every supported dtype of
float32/bfloat16/float16/int64/bool: forward, float32 gradients, in-place and out=."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from torch.testing._internal.common_dtype import floating_types
from torch.testing._internal.opinfo.core import OpInfo, SampleInput

import opinfo_sweep  # coverage/ (on sys.path by conftest.py)

CORE_KEYS = [k for k in opinfo_sweep.select_op_keys(opinfo_sweep.CORE_OPS) if opinfo_sweep.has_swept_dtype(k)]


def test_core_list_names_real_ops():
    missing = sorted(n for n in opinfo_sweep.CORE_OPS if not opinfo_sweep.select_op_keys([n]))
    assert not missing, f"CORE_OPS names ops that op_db does not have: {missing}"
    assert len(CORE_KEYS) >= 100


@pytest.mark.parametrize("key", CORE_KEYS)
def test_core_op_matches_cpu(key):
    r = opinfo_sweep.check_op(key, opinfo_sweep.CORE_DTYPES)
    counts = {dt: c for dt, c in r["counts"].items()}
    passed = sum(c.get("pass", 0) for c in counts.values())
    failed = sum(c.get("fail", 0) for c in counts.values())
    assert failed == 0, f"{key}: {failed} samples differ from CPU, e.g. {r['failures'][:2]}"
    assert passed > 0, f"{key}: no sample ran on both devices ({counts})"


def _samples(op, device, dtype, requires_grad, **kw):
    yield SampleInput(torch.randn(3, 5, dtype=dtype, device=device, requires_grad=requires_grad))
    t = torch.randn(5, 4, dtype=dtype, device=device).t()  # non-contiguous
    yield SampleInput(t.requires_grad_(requires_grad))


def _fake(name, fn, inplace=None, supports_out=False):
    return OpInfo(name, op=fn, inplace_variant=inplace, dtypes=floating_types(), sample_inputs_func=_samples,
                  supports_out=supports_out)


def _writes_into_gaps(x, *, out=None):
    """x * 2, whose out= variant on neuron also scribbles over the buffer behind a
    non-contiguous out (the elements between the strides)."""
    r = x * 2
    if out is None:
        return r
    out.resize_(r.shape).copy_(r)
    if out.device.type == "neuron" and not out.is_contiguous():
        n = out.untyped_storage().nbytes() // out.element_size()
        out.as_strided((n // 2,), (2,), 1).fill_(7)  # the odd elements: the gaps of the sweep's outs
    return out


def test_sweep_detects_writes_outside_a_strided_out(monkeypatch):
    opinfo_sweep._find_op("add")
    fake = _fake("fake_out", _writes_into_gaps, supports_out=True)
    monkeypatch.setitem(opinfo_sweep._OPS_BY_KEY, "fake_out", fake)
    r = opinfo_sweep.check_op("fake_out", dtypes=(torch.float32,))
    assert r["counts"]["float32"].get("fail", 0) == 2, r
    assert r["checks"]["out_passed"] == 2 and r["failures"][0]["check"] == "out_strided", r


@pytest.mark.parametrize(
    "fn,inplace,check",
    [
        (lambda x: x + (x.device.type == "neuron") * 1e-3, None, "forward"),
        (lambda x: x.cpu() * 2, None, "forward"),  # result silently left the device
        # correct forward, wrong backward on the device only
        (lambda x: _WrongGrad.apply(x), None, "grad"),
        (lambda x: x * 2, lambda x: x if x.device.type == "neuron" else x.mul_(2), "inplace"),
    ],
)
def test_sweep_detects_a_wrong_device_result(monkeypatch, fn, inplace, check):
    opinfo_sweep._find_op("add")  # fill the lookup table first
    monkeypatch.setitem(opinfo_sweep._OPS_BY_KEY, "fake", _fake("fake", fn, inplace))
    r = opinfo_sweep.check_op("fake", dtypes=(torch.float32,))
    assert r["counts"]["float32"].get("fail", 0) == 2, r
    assert r["failures"][0]["check"] == check, r["failures"]


class _WrongGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.neuron = x.device.type == "neuron"
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * (3.5 if ctx.neuron else 3)


def test_summary_counts_crashes_as_failures():
    results = [
        {"op": "a", "status": "ok", "counts": {"float32": {"pass": 10}}, "failures": []},
        {"op": "b", "status": "crash", "error": "worker process died (exit code -11)", "counts": {}, "failures": []},
        {"op": "c", "status": "ok", "counts": {"float32": {"pass": 3, "cpu-error": 4}}, "failures": []},
    ]
    s = opinfo_sweep.summarize(results)
    assert s["samples_passed"] == 13 and s["samples_failed"] == 1 and s["samples_cpu_error"] == 4
    assert s["pass_rate"] == pytest.approx(13 / 14)


def test_sweep_runs_as_a_script_and_writes_its_report(run_python, tmp_path):
    """`make coverage-ops` runs coverage/opinfo_sweep.py as a script (coverage/ is not a package):
    it finds its sibling modules, its spawned workers import the check, and the report names the
    command that regenerates it."""
    script = Path(opinfo_sweep.__file__)
    out = run_python("", args=[str(script), "--ops", "add", "--dtypes", "float32", "--workers", "1",
                               "--out-dir", str(tmp_path)])
    passed = re.search(r"(\d+) passed, 0 failed", out)
    assert passed and int(passed[1]) > 0, out
    report = (tmp_path / "ops.md").read_text()
    assert "Regenerate: `python coverage/opinfo_sweep.py --ops add --dtypes float32`" in report
    assert "CUDA kernel and neither a CPU kernel" in report  # the section cuda_only_ops writes
    assert [o["op"] for o in json.loads((tmp_path / "ops.json").read_text())["ops"]] == ["add"]
