"""torch_neuronx.testing: the comparison with CPU and the isolated worker pool the sweeps
stand on. A sweep is only as honest as these: a mismatch, a crash or a hang must never
come out as a pass."""

from __future__ import annotations

import functools
import math
import os
import signal
import time

import pytest
import torch

from torch_neuronx.testing import compare, compare_with_float64, model_tolerance, run_isolated


def _crash_or_sqrt(x):
    if x == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if x == "hang":
        time.sleep(600)
    return math.sqrt(x)


def _fail_to_start():
    raise ImportError("no module named 'missing_dependency'")


def _exit_during_start():
    os._exit(3)


def test_pool_isolates_crashes_hangs_and_exceptions():
    items = [4.0, "segfault", 9.0, "hang", -1.0, 16.0]
    outcomes = {repr(o.item): o for o in run_isolated(_crash_or_sqrt, items, workers=2, timeout=5)}
    assert len(outcomes) == len(items)
    assert outcomes["4.0"].kind == "ok" and outcomes["4.0"].value == 2.0
    assert outcomes["16.0"].kind == "ok" and outcomes["16.0"].value == 4.0  # the sweep went on
    assert outcomes["'segfault'"].kind == "crash" and "exit code" in outcomes["'segfault'"].error
    assert outcomes["'hang'"].kind == "timeout" and outcomes["'hang'"].seconds >= 5
    assert outcomes["-1.0"].kind == "exception" and "math domain error" in outcomes["-1.0"].error


def test_pool_timeout_excludes_worker_startup():
    # Every worker, the replacements after the crash and the hang included, takes longer to
    # start than the item timeout; only the check itself may count against it.
    timeout, startup = 3, 5
    items = ["segfault", "hang", 4.0, 9.0]
    outcomes = {
        repr(o.item): o
        for o in run_isolated(_crash_or_sqrt, items, workers=2, timeout=timeout,
                              initializer=functools.partial(time.sleep, startup))
    }  # fmt: skip
    assert outcomes["4.0"].kind == "ok" and outcomes["4.0"].value == 2.0
    assert outcomes["9.0"].kind == "ok" and outcomes["9.0"].value == 3.0
    assert outcomes["'segfault'"].kind == "crash"
    assert outcomes["'hang'"].kind == "timeout" and outcomes["'hang'"].seconds >= timeout


@pytest.mark.parametrize(
    "initializer, startup_timeout, message",
    [
        (_fail_to_start, 600, "failed to start(.|\n)*ImportError: no module named 'missing_dependency'"),
        (_exit_during_start, 600, r"exited during start-up \(exit code 3\)"),
        (functools.partial(time.sleep, 600), 1, r"not ready after \d+ s \(startup_timeout=1 s\)"),
    ],
    ids=["raises", "exits", "hangs"],
)
def test_pool_reports_workers_that_do_not_start(initializer, startup_timeout, message):
    # Not an outcome of the item: the item never ran.
    with pytest.raises(RuntimeError, match=message):
        list(run_isolated(_crash_or_sqrt, [4.0], workers=1, initializer=initializer, startup_timeout=startup_timeout))


def test_pool_rejects_bad_arguments():
    with pytest.raises(ValueError, match="timeout must be"):
        list(run_isolated(_crash_or_sqrt, [4.0], timeout=0))
    with pytest.raises(ValueError, match="startup_timeout must be"):
        list(run_isolated(_crash_or_sqrt, [4.0], startup_timeout=-1))
    with pytest.raises(ValueError, match="workers must be"):
        list(run_isolated(_crash_or_sqrt, [4.0], workers=0))
    with pytest.raises(TypeError, match="initializer must be callable"):
        list(run_isolated(_crash_or_sqrt, [4.0], initializer="setup"))
    assert list(run_isolated(_crash_or_sqrt, [])) == []


def test_compare_matches_and_mismatches():
    a = torch.randn(4, 5)
    n = a.to("neuron")
    assert compare(n * 2, a * 2).ok
    d = compare({"logits": n * 2, "loss": n.sum()}, {"logits": a * 2 + 1e-3, "loss": a.sum()})
    assert not d.ok and d.mismatched == ["logits"] and "20 of 20" in d.message
    # a result that silently came back on the CPU is not a pass
    assert not compare(a * 2, a * 2).ok
    # dtype, shape and structure differences
    assert "dtype" in compare(n.double(), a).message
    assert "shape" in compare(n[:2], a).message
    assert not compare((n, n), (a,)).ok
    # integers are exact; nan matches nan in the same place
    i = torch.arange(6)
    assert not compare(i.to("neuron") + 1, i).ok
    f = torch.tensor([1.0, float("nan"), float("inf")])
    assert compare(f.to("neuron"), f).ok
    assert not compare(f.to("neuron"), torch.tensor([1.0, 2.0, float("inf")])).ok
    # model tolerances are looser than op tolerances, but not blind
    assert compare(n + 5e-6, a, tolerance=model_tolerance).ok
    assert not compare(n + 1e-2, a, tolerance=model_tolerance).ok
    # metadata-only comparison still checks device, dtype and shape
    assert compare(torch.empty(3, device="neuron"), torch.zeros(3), values=False).ok
    assert not compare(torch.empty(3, device="neuron"), torch.zeros(4), values=False).ok


def test_compare_with_float64_judges_accuracy_not_agreement():
    g = torch.Generator().manual_seed(0)
    exact = torch.randn(4096, generator=g, dtype=torch.float64)
    noise = lambda scale: scale * torch.randn(4096, generator=g, dtype=torch.float64)  # noqa: E731
    cpu = (exact + noise(1e-3)).float()
    as_accurate = (exact + noise(1e-3)).float().to("neuron")
    worse = (exact + noise(1e-2)).float().to("neuron")
    one_wrong = cpu.clone()
    one_wrong[7] += 0.1
    # both disagree with CPU beyond the model tolerance; float64 tells which one is as accurate
    assert not compare(as_accurate, cpu, tolerance=model_tolerance).ok
    assert compare_with_float64(as_accurate, cpu, exact).ok
    d = compare_with_float64(worse, cpu, exact)
    assert not d.ok and "against float64" in d.message
    # the largest error counts, not only the mean: one wrong element is caught
    assert not compare_with_float64(one_wrong.to("neuron"), cpu, exact).ok
    # structure, device, integers and the place of non-finite values are judged as compare does
    assert not compare_with_float64(as_accurate.cpu(), cpu, exact).ok
    assert not compare_with_float64(as_accurate[:10], cpu, exact).ok
    i = torch.arange(5)
    assert compare_with_float64((as_accurate, i.to("neuron")), (cpu, i), (exact, i)).ok
    assert not compare_with_float64((as_accurate, (i + 1).to("neuron")), (cpu, i), (exact, i)).ok
    inf = as_accurate.clone()
    inf[0] = float("inf")
    assert not compare_with_float64(inf, cpu, exact).ok


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_compare_low_precision_tolerance(dtype):
    a = torch.randn(64).to(dtype)
    n = a.to("neuron")
    assert compare(n, a).ok
    assert not compare(n * 1.1, a).ok
