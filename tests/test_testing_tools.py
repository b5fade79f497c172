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

from torch_neuronx.testing import compare, model_tolerance, run_isolated


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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_compare_low_precision_tolerance(dtype):
    a = torch.randn(64).to(dtype)
    n = a.to("neuron")
    assert compare(n, a).ok
    assert not compare(n * 1.1, a).ok
