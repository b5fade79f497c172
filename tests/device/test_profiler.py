"""PyTorch's profilers on neuron: device events per op, device time columns, a trace
Perfetto/chrome://tracing can open. Oracle: the CPU ops the same profile records."""

import json
import warnings

import pytest
import torch
from torch.profiler import ProfilerActivity, profile


def workload():
    a = torch.randn(32, 32, device="neuron")
    b = torch.randn(32, 32, device="neuron")
    for _ in range(5):
        c = a @ b
    d = torch.relu(c).sum()
    return d.cpu()


def test_kineto_profile_records_a_device_event_per_op(tmp_path):
    workload()  # warm: allocations and lazy init outside the profile
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "used in profiler but not enabled" backtraces
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            workload()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())  # valid JSON: what Perfetto loads
    events = trace["traceEvents"]
    cpu_ops = {e["args"]["External id"]: e for e in events if e.get("cat") == "cpu_op"}
    kernels = [e for e in events if e.get("cat") == "kernel"]
    names = [k["name"] for k in kernels]
    # each neuron op of the program ran as a device kernel (randn, 5 mm, relu, sum, the copy to CPU)
    assert names.count("aten::mm") == 5
    for op in ("aten::relu", "aten::sum", "aten::copy_", "aten::normal_"):
        assert op in names, op
    for k in kernels:
        assert k["dur"] >= 0 and k["args"]["device"] == "neuron:0"
        launcher = cpu_ops[k["args"]["External id"]]  # linked to the CPU op that launched it
        assert launcher["name"] == k["name"]
        # the device span lies within its launching op's span (synchronous execution)
        assert launcher["ts"] - 1 <= k["ts"] and k["ts"] + k["dur"] <= launcher["ts"] + launcher["dur"] + 1
    # flow arrows CPU op -> kernel, and a named row for the device
    assert sum(1 for e in events if e.get("cat") == "ac2g") >= len(kernels)
    assert any(e.get("name") == "process_name" and e["args"].get("name") == "neuron" for e in events)

    rows = {e.key: e for e in prof.key_averages()}
    assert rows["aten::mm"].count == 5 and rows["aten::mm"].self_device_time_total > 0
    assert rows["aten::matmul"].self_device_time_total == 0  # the kernel belongs to mm
    assert all(e.self_device_time_total >= 0 and e.cpu_time_total >= 0 for e in prof.key_averages())
    assert "NEURON" in prof.key_averages().table(row_limit=5)


def test_legacy_profiler_use_device():
    workload()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autograd.profiler.profile(use_device="neuron") as prof:
            workload()
    rows = {e.key: e for e in prof.key_averages()}
    mm = rows["aten::mm"]
    assert mm.count == 5 and mm.device_time_total > 0
    # sane: on a synchronous device an op's device span is its host span (the stub's stamps
    # sit just outside the CPU op's own, hence the slack), and nothing is negative
    assert mm.device_time_total <= 1.05 * mm.cpu_time_total + 50 * mm.count
    for e in prof.key_averages():
        assert e.cpu_time_total >= 0 and e.self_device_time_total >= 0 and e.device_time_total >= 0
    assert "NEURON" in prof.key_averages().table(row_limit=5)


def test_profiling_off_records_nothing():
    # events are collected only inside a profile; ops outside it cost nothing extra
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        pass
    workload()
    assert not [e for e in prof.events() if e.device_type == torch.device("neuron").type]
