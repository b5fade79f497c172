"""``out=`` on another device raises, as on CUDA, for every op of PyTorch's OpInfo database with
an ``out=`` variant (the device-generic ``test_out`` of PyTorch's own test suite expects a
RuntimeError of any accelerator): one sample per op, its outputs remade on ``cpu`` and, with a
second device, on ``neuron:1``."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.testing import make_tensor

# dtype of the one sample: the first of these the op supports
DTYPES = (torch.float32, torch.int64, torch.bool, torch.float64, torch.complex64)

# Ops whose out= the op's Python writes with copy_, which copies across devices on CUDA too
# (PyTorch's test_out marks them as expected failures on every device).
COPIES_ACROSS_DEVICES = {"lu"}


def _as_outputs(expected):
    if isinstance(expected, torch.Tensor):
        return [expected]
    if isinstance(expected, (tuple, list)) and expected and all(isinstance(t, torch.Tensor) for t in expected):
        return list(expected)
    return None


def _outs_on(expected, device):
    outs = [make_tensor(t.shape, dtype=t.dtype, device=device) for t in _as_outputs(expected)]
    return outs[0] if isinstance(expected, torch.Tensor) else tuple(outs)


def _sweep():
    """Per op with out=: how it went with out= on each device ("raised", or why it was not checked)."""
    from torch.testing._internal.common_methods_invocations import op_db

    devices = ["cpu"] + (["neuron:1"] if torch.neuron.device_count() > 1 else [])
    results = {}
    for op in op_db:
        if not op.supports_out or op.name in COPIES_ACROSS_DEVICES:
            continue
        key = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        dtype = next((d for d in DTYPES if d in op.supported_dtypes("cpu")), None)
        if dtype is None:
            results[key] = "skipped: no sampled dtype"
            continue
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                sample = next(iter(op.sample_inputs("neuron", dtype)))
                call = lambda out: op(sample.input, *sample.args, **sample.kwargs, out=out)  # noqa: E731
                expected = op(sample.input, *sample.args, **sample.kwargs)
                if _as_outputs(expected) is None:
                    results[key] = "skipped: not tensor outputs"
                    continue
                call(_outs_on(expected, "neuron"))  # out= on the right device works
            except Exception as e:  # noqa: BLE001 - the sample itself does not run: nothing to check
                results[key] = f"skipped: {type(e).__name__}"
                continue
            for device in devices:
                # factories take their device from device=: Python checks only its type against out's,
                # and the op then runs on out's device (also on CUDA)
                if device != "cpu" and "device" in sample.kwargs:
                    continue
                try:
                    call(_outs_on(expected, device))
                    results[f"{key} -> {device}"] = "accepted"
                except RuntimeError as e:
                    results[f"{key} -> {device}"] = "raised" if "device" in str(e).lower() else f"other: {e}"
    return results


@pytest.fixture(scope="module")
def sweep():
    return _sweep()


def test_every_out_variant_refuses_an_output_on_another_device(sweep):
    checked = {k: v for k, v in sweep.items() if " -> " in k}
    assert len({k.split(" -> ")[0] for k in checked}) > 300, "the OpInfo database should give hundreds of ops"
    wrong = {k: v for k, v in checked.items() if v != "raised"}
    assert not wrong, f"out= on another device was accepted or raised something else: {wrong}"


def test_only_ops_without_a_runnable_sample_are_skipped(sweep):
    skipped = {k: v for k, v in sweep.items() if v.startswith("skipped")}
    # fp8 matrix products have no dtype sampled here, equal returns a bool, histogramdd a tuple
    # with a list, sparse.sampled_addmm makes a sparse CSR tensor, which neuron refuses, and
    # _batch_norm_with_update's outputs do not fit its out= (on CPU too; PyTorch's test_out
    # expects it to fail on every device)
    assert set(skipped) <= {"torch._scaled_mm", "torch._scaled_mm_v2", "equal", "histogramdd",
                            "sparse.sampled_addmm", "_batch_norm_with_update"}, skipped
